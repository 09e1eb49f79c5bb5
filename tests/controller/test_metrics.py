"""The operator's own metrics follow the experiments that exist and the verdicts they hold (#23)."""

from __future__ import annotations

from datetime import UTC, datetime

from specdecode.controller.metrics import OperatorMetrics
from specdecode.experiment import status


def completed(estimate: float, *stages: str) -> status.ExperimentStatus:
    return status.ExperimentStatus(
        phase=status.Phase.COMPLETED,
        verdict=status.Verdict.PROMOTE,
        stages=[
            status.StageResult(
                name=name,
                speedup=status.Speedup(
                    metric="tpot", estimate=estimate, ci_low=estimate - 0.1, ci_high=estimate + 0.1
                ),
                verdict=status.StageVerdict.PASS,
                started_at="2026-12-02T01:00:00.500Z",
                finished_at="2026-12-02T01:01:00Z",
            )
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


#: The gauges labelled by namespace and experiment, all removed with the experiment.
PER_EXPERIMENT = (
    "specdecode_experiment_phase",
    "specdecode_experiment_verdict",
    "specdecode_speedup",
    "specdecode_speedup_ci_low",
    "specdecode_speedup_ci_high",
    "specdecode_stage_verdict",
    "specdecode_stage_start_time_seconds",
    "specdecode_stage_end_time_seconds",
)


def one_hot(metrics: OperatorMetrics, name: str, label: str) -> str | None:
    """The label value of the one series at 1 (None when all are 0), checking there is at most one."""
    ones = [dict(labels)[label] for labels, value in series(metrics, name).items() if value == 1.0]
    assert len(ones) <= 1, ones
    return ones[0] if ones else None


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
    for name in PER_EXPERIMENT:
        assert {dict(labels)["experiment"] for labels in series(metrics, name)} == {"other"}, name


def test_the_last_experiment_deleted_leaves_no_series() -> None:
    metrics = OperatorMetrics()
    metrics.observe("llm", "exp", completed(1.3, "low"))
    metrics.forget("llm", "exp")
    metrics.forget("llm", "never-seen")
    for name in PER_EXPERIMENT:
        assert series(metrics, name) == {}, name
    assert series(metrics, "specdecode_experiments") == {}


def test_a_spec_edit_that_drops_the_verdict_drops_its_speedups() -> None:
    metrics = OperatorMetrics()
    metrics.observe("llm", "exp", completed(1.3, "low", "high"))
    metrics.observe("llm", "exp", status.ExperimentStatus(phase=status.Phase.PENDING, observed_generation=2))
    assert series(metrics, "specdecode_experiments") == {(("phase", "Pending"), ("verdict", "")): 1.0}
    for name in ("specdecode_speedup", "specdecode_speedup_ci_low", "specdecode_speedup_ci_high"):
        assert series(metrics, name) == {}, name
    assert series(metrics, "specdecode_stage_verdict") == {}
    assert series(metrics, "specdecode_stage_start_time_seconds") == {}
    assert one_hot(metrics, "specdecode_experiment_phase", "phase") == "Pending"
    assert one_hot(metrics, "specdecode_experiment_verdict", "verdict") is None


def test_an_experiment_exports_its_phase_verdict_and_each_stage_s_speedup_bounds_and_verdict() -> None:
    metrics = OperatorMetrics()
    metrics.observe("llm", "exp", completed(1.3, "low", "high"))
    assert {labels: value for labels, value in series(metrics, "specdecode_experiment_phase").items()} == {
        (("experiment", "exp"), ("namespace", "llm"), ("phase", p.value)): float(p is status.Phase.COMPLETED)
        for p in status.Phase
    }
    assert one_hot(metrics, "specdecode_experiment_verdict", "verdict") == "Promote"
    for name, value in (
        ("specdecode_speedup", 1.3),
        ("specdecode_speedup_ci_low", 1.2),
        ("specdecode_speedup_ci_high", 1.4),
    ):
        assert {dict(k)["stage"]: round(v, 9) for k, v in series(metrics, name).items()} == {
            "low": value,
            "high": value,
        }, name
    assert {
        (dict(k)["stage"], dict(k)["verdict"])
        for k, v in series(metrics, "specdecode_stage_verdict").items()
        if v
    } == {("low", "Pass"), ("high", "Pass")}
    assert len(series(metrics, "specdecode_stage_verdict")) == 2 * len(status.StageVerdict)
    start = datetime(2026, 12, 2, 1, 0, 0, 500000, tzinfo=UTC).timestamp()
    assert {
        dict(k)["stage"]: v for k, v in series(metrics, "specdecode_stage_start_time_seconds").items()
    } == {
        "low": start,
        "high": start,
    }
    assert set(series(metrics, "specdecode_stage_end_time_seconds").values()) == {start + 59.5}


def test_a_phase_change_moves_the_one_and_keeps_one_series_per_phase() -> None:
    metrics = OperatorMetrics()
    metrics.observe("llm", "exp", status.ExperimentStatus(phase=status.Phase.RUNNING))
    metrics.observe("llm", "exp", status.ExperimentStatus(phase=status.Phase.FAILED))
    assert one_hot(metrics, "specdecode_experiment_phase", "phase") == "Failed"
    assert len(series(metrics, "specdecode_experiment_phase")) == len(status.Phase)
    assert set(series(metrics, "specdecode_experiment_verdict").values()) == {0.0}
