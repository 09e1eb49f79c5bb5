"""The operator's own metrics follow the experiments that exist and the verdicts they hold (#23)."""

from __future__ import annotations

from specdecode.controller.metrics import OperatorMetrics
from specdecode.experiment import status


def completed(estimate: float, *stages: str) -> status.ExperimentStatus:
    return status.ExperimentStatus(
        phase=status.Phase.COMPLETED,
        verdict=status.Verdict.PROMOTE,
        stages=[
            status.StageResult(name=name, speedup=status.Speedup(metric="tpot", estimate=estimate))
            for name in stages
        ],
    )


def series(metrics: OperatorMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of one metric: sorted labels -> value."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def test_a_deleted_experiment_is_no_longer_counted_and_its_speedups_are_removed() -> None:
    metrics = OperatorMetrics()
    metrics.observe("llm", "exp", completed(1.3, "low", "high"))
    metrics.observe("llm", "other", completed(1.1, "low"))
    metrics.forget("llm", "exp")
    assert series(metrics, "specdecode_experiments") == {
        (("phase", "Completed"), ("verdict", "Promote")): 1.0
    }
    assert series(metrics, "specdecode_speedup") == {
        (("experiment", "other"), ("namespace", "llm"), ("stage", "low")): 1.1
    }


def test_the_last_experiment_deleted_leaves_no_series() -> None:
    metrics = OperatorMetrics()
    metrics.observe("llm", "exp", completed(1.3, "low"))
    metrics.forget("llm", "exp")
    metrics.forget("llm", "never-seen")
    assert series(metrics, "specdecode_experiments") == {}
    assert series(metrics, "specdecode_speedup") == {}


def test_a_spec_edit_that_drops_the_verdict_drops_its_speedups() -> None:
    metrics = OperatorMetrics()
    metrics.observe("llm", "exp", completed(1.3, "low", "high"))
    metrics.observe("llm", "exp", status.ExperimentStatus(phase=status.Phase.PENDING, observed_generation=2))
    assert series(metrics, "specdecode_experiments") == {(("phase", "Pending"), ("verdict", "")): 1.0}
    assert series(metrics, "specdecode_speedup") == {}
