"""The A/A pre-flight (`analysis.mode: NoiseFloor`) and the output guardrail's baselineMismatchRate (#14 §3)."""

from __future__ import annotations

from typing import Any

import pytest

from specdecode.experiment import comparison, noisefloor, validation, verdict
from specdecode.experiment.records import RequestRecord
from specdecode.experiment.spec import ExperimentSpec
from specdecode.experiment.status import ExperimentStatus, Phase, StageVerdict, Verdict
from tests.factories import experiment_document
from tests.report import synthetic


def make_spec(*, requests: int = 120, stages: list[str] | None = None, **analysis: Any) -> ExperimentSpec:
    doc = experiment_document()
    doc["spec"]["workload"]["requestsPerStage"] = requests
    if stages is not None:
        doc["spec"]["workload"]["stages"] = [{"name": name, "concurrency": 4} for name in stages]
    doc["spec"]["analysis"] = analysis
    spec, _ = validation.parse_experiment(doc)
    return spec


def a_a(spec: ExperimentSpec, **kwargs: Any) -> list[RequestRecord]:
    """Records of two identical servers: the same distribution in both arms (speed-up 1)."""
    records, _ = synthetic.run(spec, speedup=1.0, **kwargs)
    return records


def test_identical_arms_give_an_interval_around_one_that_is_equivalent() -> None:
    spec = make_spec(mode="NoiseFloor")
    records, windows = synthetic.run(spec, speedup=1.0)
    result = verdict.analyse(spec, records, windows)
    nf = result.noise_floor
    assert nf is not None and [s.name for s in nf.stages] == ["low", "c16"]
    for s in nf.stages:
        assert s.pairs == 120
        assert s.ci_low is not None and s.ci_high is not None
        assert s.ci_low <= 1.0 <= s.ci_high
        assert s.equivalent is True  # within [1/1.10, 1.10]
        assert s.mismatch_rate == 0.0 and s.compared == 120


def test_a_noise_floor_run_is_a_measurement_not_a_gate() -> None:
    spec = make_spec(mode="NoiseFloor", minSpeedup=1.5)
    records, windows = synthetic.run(spec, speedup=1.0)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is Verdict.INCONCLUSIVE and result.reason == "NoiseFloor"
    assert result.recommendation is None
    assert result.message.startswith("noise floor (A/A): minSpeedup 1.5 is measurable at every stage")
    assert all(s.verdict is StageVerdict.INCONCLUSIVE for s in result.stages)
    # The stage table and the noise-floor table say the same: one look over every pair.
    for s, floor in zip(result.stages, result.noise_floor.stages if result.noise_floor else [], strict=True):
        assert s.speedup is not None and s.speedup.method == "pairedT"
        assert (s.speedup.estimate, s.speedup.ci_low, s.speedup.ci_high) == pytest.approx(
            (floor.speedup, floor.ci_low, floor.ci_high)
        )
    assert all(s.reasons[0].startswith("A/A run") for s in result.stages)
    assert not any("critical" in line or "upper bound" in line for s in result.stages for line in s.reasons)
    status = result.apply(ExperimentStatus(phase=Phase.ANALYZING))
    assert status.phase is Phase.COMPLETED
    wire = status.wire()["noiseFloor"]
    assert wire["measurableStages"] == ["low", "c16"] and wire["minSpeedup"] == 1.5
    assert {"minDetectable", "measurable", "mismatchRate", "ciLow"} <= set(wire["stages"][0])
    assert "validated, not used" in wire["note"]


def test_a_compare_run_has_no_noise_floor() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.4)
    result = verdict.analyse(spec, records, windows)
    assert result.noise_floor is None
    assert "noiseFloor" not in result.apply(ExperimentStatus()).wire()


@pytest.mark.parametrize("sequential", [True, False])
def test_min_detectable_shrinks_as_the_stage_gets_more_requests(sequential: bool) -> None:
    floors = []
    for n in (60, 240, 960):
        spec = make_spec(mode="NoiseFloor", requests=n, sequential=sequential)
        nf = noisefloor.noise_floor(spec, a_a(spec, seed=1))
        floor = nf.stages[0].min_detectable
        assert floor is not None and floor > 1.0
        floors.append(floor)
    assert floors[0] > floors[1] > floors[2]
    # The standard error shrinks as 1/sqrt(n): 4x the pairs, about half the margin over 1.
    assert 0.35 < (floors[2] - 1.0) / (floors[1] - 1.0) < 0.65


def test_the_sequential_design_needs_a_larger_speedup_than_a_single_look() -> None:
    records = a_a(make_spec(mode="NoiseFloor"), seed=2)
    fixed = noisefloor.noise_floor(make_spec(mode="NoiseFloor", sequential=False), records).stages[0]
    looks = noisefloor.noise_floor(make_spec(mode="NoiseFloor", sequential=True), records).stages[0]
    assert fixed.min_detectable is not None and looks.min_detectable is not None
    assert 1.0 < fixed.min_detectable < looks.min_detectable


def test_measurable_flips_where_min_speedup_crosses_the_noise_floor() -> None:
    records = a_a(make_spec(mode="NoiseFloor"), seed=3)
    floor = noisefloor.noise_floor(make_spec(mode="NoiseFloor"), records).stages[0].min_detectable
    assert floor is not None
    above = noisefloor.noise_floor(make_spec(mode="NoiseFloor", minSpeedup=floor * 1.01), records)
    below = noisefloor.noise_floor(make_spec(mode="NoiseFloor", minSpeedup=floor * 0.99), records)
    assert above.stages[0].measurable is True and "low" in above.measurable_stages
    assert below.stages[0].measurable is False and "low" not in below.measurable_stages
    # The noise floor itself does not depend on minSpeedup (it is measured against 1.0).
    assert above.stages[0].min_detectable == pytest.approx(floor)
    message = noisefloor.noise_floor_message(below)
    assert f"not at low ({floor:.3f}x)" in message or "measurable at no stage" in message


def test_the_mismatch_rate_has_a_wilson_interval_and_the_pooled_upper_bound_is_suggested() -> None:
    spec = make_spec(mode="NoiseFloor")
    records = a_a(spec, mismatch_rate=0.3, seed=4)
    nf = noisefloor.noise_floor(spec, records)
    # The stages report the guardrail finding (identical servers already miss minOutputMatch), not a verdict.
    stages = verdict.analyse(spec, records, []).stages
    assert all(s.reasons[1].startswith("outputMatch ") and "SurelyBreached" in s.reasons[1] for s in stages)
    for s in nf.stages:
        assert (
            s.mismatch_rate is not None and s.mismatch_ci_low is not None and s.mismatch_ci_high is not None
        )
        assert s.mismatch_rate == s.mismatches / s.compared
        low, high = comparison.proportion_interval(s.mismatches, s.compared, confidence=0.95, method="wilson")
        assert (s.mismatch_ci_low, s.mismatch_ci_high) == pytest.approx((low, high))
        assert low < 0.3 < high
    total = sum(s.mismatches for s in nf.stages)
    pooled = comparison.proportion_interval(total, 240, confidence=0.95, method="wilson")[1]
    assert nf.suggested_baseline_mismatch_rate == pytest.approx(pooled)
    assert 0.3 < pooled < 0.4


def test_with_sampling_no_mismatch_rate_is_claimed() -> None:
    doc = experiment_document()
    doc["spec"]["workload"]["sampling"] = {"temperature": 0.7}
    doc["spec"]["analysis"] = {"mode": "NoiseFloor"}
    spec, _ = validation.parse_experiment(doc)
    nf = noisefloor.noise_floor(spec, a_a(spec, mismatch_rate=0.3))
    assert all(s.mismatch_rate is None and s.compared == 0 for s in nf.stages)
    assert nf.suggested_baseline_mismatch_rate is None


def test_a_noise_floor_run_still_refuses_an_invalid_speculative_config() -> None:
    doc = experiment_document(
        speculative={
            "method": "ngram",
            "numSpeculativeTokens": 3,
            "promptLookupMin": 4,
            "promptLookupMax": 2,
        },
        analysis={"mode": "NoiseFloor"},
    )
    problems = validation.check_spec(doc["spec"])
    assert any(p.path.startswith("spec.speculative") for p in problems)


def test_an_a_a_stage_runs_in_full_whatever_the_sequential_rule() -> None:
    spec = make_spec(mode="NoiseFloor")
    records = [r for r in a_a(spec) if r.stage == "low"]
    control = [r for r in records if r.arm == "control"]
    treatment = [r for r in records if r.arm == "treatment"]
    assert not verdict.stage_decided(spec.analysis, control, treatment, max_pairs=120)
    compare = make_spec(minSpeedup=1.5)  # the same A/A data is far below 1.5: a Compare run stops
    assert verdict.stage_decided(compare.analysis, control, treatment, max_pairs=120)


# ------------------------------------------------------------------------------ baselineMismatchRate


def output_match(result: verdict.Analysis, stage: str = "low") -> Any:
    s = next(s for s in result.stages if s.name == stage)
    return next(g for g in s.guardrails if g.name == "outputMatch")


def test_without_a_baseline_the_a_a_mismatch_rate_rejects_as_before() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.4, mismatch_rate=0.25, seed=5)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is Verdict.REJECT and result.reason == "OutputMismatch"
    g = output_match(result)
    assert g.limit == 0.99 and g.tolerance is None


def test_with_a_baseline_the_a_a_mismatch_rate_does_not_fail() -> None:
    spec = make_spec(guardrails={"baselineMismatchRate": 0.35})
    records, windows = synthetic.run(spec, speedup=1.4, mismatch_rate=0.25, seed=5, n=300)
    result = verdict.analyse(spec, records, windows)
    g = output_match(result)
    assert g.limit == pytest.approx(0.64) and g.tolerance == 0.35
    assert g.outcome == "Holds"
    assert result.verdict is Verdict.PROMOTE, result.message


def test_with_a_baseline_a_breach_within_the_noise_blocks_a_pass_without_rejecting() -> None:
    spec = make_spec(stages=["low"], guardrails={"baselineMismatchRate": 0.25})
    records, windows = synthetic.run(spec, speedup=1.4, mismatch_rate=0.3, seed=6)
    result = verdict.analyse(spec, records, windows)
    g = output_match(result)
    assert g.estimate is not None and g.ci_high is not None
    assert g.estimate < g.limit <= g.ci_high and g.outcome == "Breached"
    assert "blocks a Pass, not critical" in (g.note or "")
    low = next(s for s in result.stages if s.name == "low")
    assert low.verdict is StageVerdict.INCONCLUSIVE
    assert result.verdict is not Verdict.REJECT and result.reason != "OutputMismatch"


def test_with_a_baseline_a_sure_breach_still_rejects() -> None:
    spec = make_spec(guardrails={"baselineMismatchRate": 0.3})
    records, windows = synthetic.run(spec, speedup=1.4, mismatch_rate=0.8, seed=7)
    result = verdict.analyse(spec, records, windows)
    g = output_match(result)
    assert g.ci_high is not None and g.ci_high < g.limit and g.outcome == "SurelyBreached"
    assert result.verdict is Verdict.REJECT and result.reason == "OutputMismatch"
    assert "< 69.0%" in result.message
