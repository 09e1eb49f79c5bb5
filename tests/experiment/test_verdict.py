"""The verdict on synthetic samples of known effect, the edge cases, and the sequential rule."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from specdecode.experiment import (
    acceptance,
    comparison,
    guardrails,
    pairing,
    recommendation,
    sequential,
    validation,
    verdict,
)
from specdecode.experiment.records import ArmServerMetrics, RequestRecord, StageWindow
from specdecode.experiment.spec import ExperimentSpec
from specdecode.experiment.status import (
    ExperimentStatus,
    Phase,
    ReasonCode,
    StageResult,
    StageVerdict,
    Verdict,
)
from specdecode.experiment.validity import StageValidity, Validity
from tests.factories import experiment_document
from tests.report import synthetic


def make_spec(**analysis: Any) -> ExperimentSpec:
    doc = experiment_document()
    if analysis:
        doc["spec"]["analysis"] = analysis
    spec, _ = validation.parse_experiment(doc)
    return spec


def stage(result: verdict.Analysis, name: str) -> Any:
    return next(s for s in result.stages if s.name == name)


def test_clear_speedup_everywhere_is_promoted() -> None:
    spec = make_spec()
    # 300 pairs a stage (the default requestsPerStage): errorRate <= 1% and outputMatch >= 0.99 are
    # shown after 299 clean pairs (`guardrails.pairs_to_show`); fewer leave them Undecided.
    records, windows = synthetic.run(spec, speedup=1.4, n=300)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is Verdict.PROMOTE
    assert result.reason == "SpeedupConfirmed"
    low = stage(result, "low")
    assert low.verdict is StageVerdict.PASS
    assert low.speedup.ci_low <= 1.4 <= low.speedup.ci_high
    assert low.speedup.method == "groupSequential"
    assert result.message.startswith("tpot speed-up 1.")
    assert "low" in result.speedup_summary


def test_slower_at_high_load_rejects_with_all_and_recommends_a_schedule() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup={"low": 1.4, "c16": 0.85}, n=300)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is Verdict.REJECT
    assert result.reason == "SlowerThanRequired"
    assert stage(result, "c16").verdict is StageVerdict.FAIL
    rec = result.recommendation
    assert rec is not None and rec.beneficial_up_to == "low"
    schedule = rec.num_speculative_tokens_per_batch_size
    assert schedule is not None and schedule[0][0] == 1 and schedule[-1][2] == 0
    assert schedule[0][2] == spec.speculative.num_speculative_tokens
    assert all(a[1] < b[0] for a, b in itertools.pairwise(schedule))


def test_any_promotes_when_one_stage_passes() -> None:
    spec = make_spec(requireStages="any")
    records, windows = synthetic.run(spec, speedup={"low": 1.4, "c16": 0.85}, n=300)
    assert verdict.analyse(spec, records, windows).verdict is Verdict.PROMOTE


def test_named_stages_only_count() -> None:
    spec = make_spec(requireStages=["low"])
    records, windows = synthetic.run(spec, speedup={"low": 1.4, "c16": 1.1}, n=300)
    assert verdict.analyse(spec, records, windows).verdict is Verdict.PROMOTE


def test_speedup_near_the_threshold_is_inconclusive_never_promoted() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.1, n=60, noise=0.4)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reason == "InsufficientEvidence"


def test_output_mismatch_rejects_whatever_the_speed() -> None:
    spec = make_spec(requireStages="any")
    records, windows = synthetic.run(spec, speedup=2.0, n=120, mismatch_rate=0.2)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is Verdict.REJECT
    assert result.reason == "OutputMismatch"
    assert result.message.startswith("output mismatch at")


def test_output_match_is_not_judged_with_sampling() -> None:
    doc = experiment_document()
    doc["spec"]["workload"]["sampling"] = {"temperature": 0.7}
    spec, _ = validation.parse_experiment(doc)
    records, windows = synthetic.run(spec, speedup=1.5, n=300, mismatch_rate=0.5)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is Verdict.PROMOTE
    assert stage(result, "low").output_match is None


def test_error_rate_surely_above_the_limit_fails() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.5, n=150)
    # treatment requests of c16 fail a third of the time
    for r in records:
        if r.stage == "c16" and r.arm == "treatment" and r.index % 3 == 0:
            r.ok, r.tpot_ms = False, None
    result = verdict.analyse(spec, records, windows)
    assert stage(result, "c16").verdict is StageVerdict.FAIL
    assert result.verdict is Verdict.REJECT and result.reason == "GuardrailFailed"
    # the failing stage's lines say what failed and how the primary metric's speed-up stood
    reasons = stage(result, "c16").reasons
    assert reasons[0].startswith("errorRate") and reasons[-1].startswith("tpot lower bound"), reasons


def guardrail(result: verdict.Analysis, stage_name: str, name: str) -> Any:
    return next(g for g in stage(result, stage_name).guardrails if g.name == name)


def test_a_ttft_regression_large_in_both_relative_and_absolute_terms_fails() -> None:
    spec = make_spec()
    # TTFT ~400 ms → ~640 ms: +60% and +240 ms, beyond 10% and beyond the 50 ms tolerance.
    records, windows = synthetic.run(spec, speedup=1.5, n=150, ttft_ratio=1.6, ttft_base=400.0)
    result = verdict.analyse(spec, records, windows)
    ttft = guardrail(result, "low", "ttftRegression")
    assert ttft.outcome == "SurelyBreached" and ttft.difference_ci_low > 50.0
    assert result.verdict is Verdict.REJECT and result.reason == "GuardrailFailed"


def test_a_large_decode_win_with_a_small_absolute_ttft_rise_is_not_vetoed() -> None:
    # The H200 pattern: the draft's prefill adds ~+40% to a ~40 ms TTFT (+16 ms) while decode is
    # 1.5x faster. Relative alone, that is a regression; in milliseconds nobody notices it.
    records, windows = synthetic.run(make_spec(), speedup=1.5, n=300, ttft_ratio=1.4)
    result = verdict.analyse(make_spec(), records, windows)
    ttft = guardrail(result, "low", "ttftRegression")
    assert ttft.estimate > 0.10 and 0.0 < ttft.difference < 50.0
    assert ttft.outcome == "Holds" and "tolerance" in ttft.note
    assert result.verdict is Verdict.PROMOTE
    # The ratio alone (no tolerance) is what used to reject it.
    strict = make_spec(guardrails={"ttftToleranceMs": 0})
    assert verdict.analyse(strict, records, windows).verdict is Verdict.REJECT


def test_a_ttft_regression_that_breaks_an_slo_the_control_meets_fails() -> None:
    # +40% on ~40 ms is within the ratio-and-milliseconds tolerance, but the SLO is absolute: the
    # control's p90 is within 70 ms, the treatment's (~75 ms) is not.
    spec = make_spec(slo={"ttft": {"p90": 70}})
    records, windows = synthetic.run(spec, speedup=1.5, n=300, ttft_ratio=1.4)
    result = verdict.analyse(spec, records, windows)
    assert guardrail(result, "low", "ttftRegression").outcome == "Holds"
    slo = guardrail(result, "low", "sloTtftP90")
    assert slo.limit == 70 and slo.ci_low > 70 and slo.outcome == "SurelyBreached"
    assert stage(result, "low").control.ttft_p90 < 70
    assert result.verdict is Verdict.REJECT and result.reason == "GuardrailFailed"
    assert "sloTtftP90 at low" in result.message


def test_an_slo_the_control_misses_too_is_left_to_goodput() -> None:
    spec = make_spec(slo={"ttft": {"p90": 30}})  # both arms' p90 is ~50 ms
    # Many pairs are discordant on the SLO (one arm meets it, the other not): showing goodput did
    # not drop by 2 points takes ~1000 pairs here (at 300 it is Undecided: the next test).
    records, windows = synthetic.run(spec, speedup=1.5, n=1000)
    result = verdict.analyse(spec, records, windows)
    slo = guardrail(result, "low", "sloTtftP90")
    assert slo.outcome == "NotEvaluated" and slo.estimate > 30 and "control misses it too" in slo.note
    assert guardrail(result, "low", "goodput").outcome == "Holds"
    assert result.verdict is Verdict.PROMOTE


def test_failed_requests_miss_every_slo_and_status_stays_valid_json() -> None:
    spec = make_spec(slo={"ttft": {"p90": 1000}, "tpot": {"p99": 1000}})
    records, windows = synthetic.run(spec, speedup=1.5, n=30)
    for r in records:  # half the treatment's requests fail: its p90 is surely a failure
        if r.stage == "low" and r.arm == "treatment" and r.index % 2 == 0:
            r.ok, r.ttft_ms, r.tpot_ms = False, None, None
    result = verdict.analyse(spec, records, windows)
    slo = guardrail(result, "low", "sloTtftP90")
    assert slo.estimate is None and "failed" in slo.note and slo.outcome == "SurelyBreached"
    # 30 requests: the p99's interval reaches past the sample, which JSON cannot say as a number.
    assert guardrail(result, "low", "sloTpotP99").ci_high is None
    status = result.apply(ExperimentStatus())
    json.dumps(status.wire(), allow_nan=False)


def test_goodput_is_the_fraction_of_requests_meeting_every_slo_with_a_wilson_interval() -> None:
    spec = make_spec(slo={"ttft": {"p50": 20, "p90": 60}, "tpot": {"p99": 1e6}})
    records, windows = synthetic.run(spec, speedup=1.5, n=200, error_rate=0.05)
    low = stage(verdict.analyse(spec, records, windows), "low")
    for arm in ("control", "treatment"):
        mine = [r for r in records if r.stage == "low" and r.arm == arm]
        # Within the largest limit of each metric (60 ms for TTFT); failed requests are never good.
        good = sum(r.ok and r.ttft_ms is not None and r.ttft_ms <= 60 for r in mine)
        g = getattr(low, arm).goodput
        assert (g.requests, g.good) == (len(mine), good) and g.fraction == good / len(mine)
        assert g.ci_low < g.fraction < g.ci_high
        assert g.per_second == pytest.approx(good / pairing.active_seconds(mine))
    assert make_spec().analysis.slo.limits() == []
    assert stage(verdict.analyse(make_spec(), records, windows), "low").control.goodput is None


def test_goodput_per_second_is_per_arm() -> None:
    spec = make_spec(slo={"e2e": {"p90": 5000}})
    records = closed_loop("control", seconds_per_request=1.0) + closed_loop(
        "treatment", seconds_per_request=0.5
    )
    result = stage(verdict.analyse(spec, records, [StageWindow(stage="c16", start=0.0, end=4.0)]), "c16")
    assert result.control.goodput.per_second == pytest.approx(64 / 4.0)
    assert result.treatment.goodput.per_second == pytest.approx(64 / 2.0)


def test_a_goodput_drop_beyond_its_interval_fails_and_one_within_the_noise_does_not() -> None:
    # An E2E SLO that both arms miss at p90 (the load is beyond it, so its own guardrail is not
    # evaluated); the treatment's prefill pushes TTFT, and so E2E at few output tokens, over it for
    # many more requests, although TPOT is faster: goodput drops.
    spec = make_spec(slo={"e2e": {"p90": 90.0}}, guardrails={"maxTtftRegression": None})
    records, windows = synthetic.run(spec, speedup=1.2, n=300, ttft_ratio=1.6, tokens=4)
    result = verdict.analyse(spec, records, windows)
    assert guardrail(result, "low", "sloE2eP90").outcome == "NotEvaluated"
    g = guardrail(result, "low", "goodput")
    assert g.ci_high < -0.02 and g.outcome == "SurelyBreached"
    assert result.verdict is Verdict.REJECT and result.reason == "GuardrailFailed"
    # No change: the interval covers 0 and nothing fails, but a drop beyond 2 points is not ruled
    # out either (its one-sided lower bound is below -0.02): Undecided, which blocks a Pass.
    same, windows = synthetic.run(spec, speedup=1.0, n=300, tokens=4, seed=3)
    result = verdict.analyse(spec, same, windows)
    g = guardrail(result, "low", "goodput")
    assert g.ci_low < -0.02 and g.ci_high > 0.0 and g.outcome == "Undecided"
    assert g.note is not None and "lower bound" in g.note
    assert stage(result, "low").code is ReasonCode.SLOWER_THAN_REQUIRED  # 1.0x: the speed-up fails it


def test_the_paired_goodput_interval_covers_no_change_and_is_narrower_than_unpaired() -> None:
    rng = np.random.default_rng(8)
    covered = 0
    runs = 400
    for _ in range(runs):
        shared = rng.random(200) < 0.85  # the prompt decides most of it, in both arms
        control = shared & (rng.random(200) < 0.97)
        treatment = shared & (rng.random(200) < 0.97)
        change = comparison.paired_proportion_difference(
            control.tolist(), treatment.tolist(), confidence=0.95
        )
        assert change is not None
        covered += change[1] <= 0.0 <= change[2]
    assert covered / runs >= 0.93
    diff, low, high = change
    p_c, p_t = control.mean(), treatment.mean()
    unpaired = 2 * 1.96 * math.sqrt(p_c * (1 - p_c) / 200 + p_t * (1 - p_t) / 200)
    assert low <= diff <= high and high - low < unpaired
    assert comparison.paired_proportion_difference([], [], confidence=0.95) is None


def test_speedup_and_acceptance_are_reported_per_prompt_category() -> None:
    spec = make_spec()
    kinds = {"code": (1.6, 0.85), "chat": (1.1, 0.4), "math": (1.4, 0.7)}
    records, windows = synthetic.run(spec, n=150, categories=kinds)
    low = stage(verdict.analyse(spec, records, windows), "low")
    assert [c.name for c in low.categories] == ["chat", "code", "math"]
    for c in low.categories:
        true_speedup, _ = kinds[c.name]
        assert c.pairs == 50 and c.ci_low < true_speedup < c.ci_high
        assert c.ci_low <= c.speedup <= c.ci_high
    rates = {c.name: c.acceptance_rate for c in low.categories}
    assert rates["code"] > rates["math"] > rates["chat"]
    k = spec.speculative.num_speculative_tokens or 0
    for name, (_, accept) in kinds.items():  # a draft token is accepted if it and all before it are
        assert rates[name] == pytest.approx(sum(accept**i for i in range(1, k + 1)) / k, abs=0.05)
    # The stage's own speed-up mixes them; prompts without a category give no rows.
    plain, windows = synthetic.run(spec, n=150)
    assert stage(verdict.analyse(spec, plain, windows), "low").categories == []


def test_multi_turn_sessions_get_speedup_and_acceptance_per_turn_in_turn_order() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, n=120, speedup=1.3)
    # 12 turns (10, 11 and 12 sort after 9), the turn of a pair the same on both arms
    sessions = [r.model_copy(update={"turn": r.index % 12 + 1}) if not r.warmup else r for r in records]
    low = stage(verdict.analyse(spec, sessions, windows), "low")
    assert [t.name for t in low.turns] == [str(turn) for turn in range(1, 13)]
    assert low.speedup is not None and sum(t.pairs for t in low.turns) == low.speedup.n
    assert all(t.speedup is not None and 1.0 < t.speedup < 1.7 for t in low.turns)
    assert low.categories == [] and stage(verdict.analyse(spec, records, windows), "low").turns == []


def test_acceptance_below_the_minimum_fails() -> None:
    spec = make_spec(guardrails={"minAcceptanceRate": 0.8})
    records, windows = synthetic.run(spec, speedup=1.5, n=100, acceptance=0.5)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is Verdict.REJECT and result.reason == "GuardrailFailed"


def test_acceptance_three_ways_agree_and_disagreement_is_flagged() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.5, n=80)
    acc = stage(verdict.analyse(spec, records, windows), "low").acceptance
    assert acc.source == "perRequest" and acc.agreement is True
    assert set(acc.sources) == {"perRequest", "prometheus", "clientProxy"}
    assert len(acc.per_position) == spec.speculative.num_speculative_tokens
    treatment = [r for r in records if r.stage == "low" and r.arm == "treatment"]
    wrong = ArmServerMetrics(num_drafts=100, num_draft_tokens=500, num_accepted_tokens=50)
    flagged = acceptance.acceptance(treatment, wrong, k=5)
    assert flagged is not None and flagged.agreement is False


def test_no_records_is_could_not_measure() -> None:
    spec = make_spec()
    result = verdict.analyse(spec, [], [])
    assert result.verdict is None and result.reason == "NoData"
    status = result.apply(ExperimentStatus())
    assert status.phase is Phase.FAILED and status.verdict is None


def test_warmup_only_is_no_data() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, n=0, warmup=3)
    assert verdict.analyse(spec, records, windows).reason == "NoData"


def test_all_errors_is_inconclusive_not_a_pass() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, n=50, error_rate=1.0)
    result = verdict.analyse(spec, records, windows)
    assert result.verdict is not Verdict.PROMOTE
    assert all(s.verdict is not StageVerdict.PASS for s in result.stages)


def test_one_arm_empty_is_no_data_for_that_stage() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.5, n=60)
    records = [r for r in records if not (r.stage == "c16" and r.arm == "treatment")]
    result = verdict.analyse(spec, records, windows)
    assert stage(result, "c16").verdict is StageVerdict.INCONCLUSIVE
    assert result.verdict is Verdict.INCONCLUSIVE and result.reason == "NoData"


def test_invalid_measurement_is_never_a_verdict() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.5, n=60)
    result = verdict.analyse(
        spec, records, windows, validity=Validity(valid=False, reasons=["schedule lag 40 ms"])
    )
    assert result.verdict is None and result.reason == "InvalidMeasurement"
    assert "schedule lag" in result.message


def test_an_invalid_stage_is_inconclusive() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.5, n=60)
    result = verdict.analyse(
        spec, records, windows, validity=Validity.model_validate({"stages": {"c16": {"valid": False}}})
    )
    assert stage(result, "c16").verdict is StageVerdict.INCONCLUSIVE
    assert result.verdict is Verdict.INCONCLUSIVE and result.reason == "InvalidMeasurement"


def test_unpaired_failures_drop_the_pair_but_count_as_errors() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup=1.5, n=100)
    for r in records:
        if r.stage == "low" and r.arm == "treatment" and r.index == 7:
            r.ok, r.tpot_ms = False, None
    low = stage(verdict.analyse(spec, records, windows), "low")
    assert low.speedup.n == 99
    assert low.treatment.errors == 1


def test_nan_values_are_dropped() -> None:
    v = comparison.compare(
        [10.0, math.nan, 10.0] * 10,
        [8.0, 8.0, math.inf] * 10,
        metric="tpot",
        min_speedup=1.1,
        sequential_ci=False,
    )
    assert v.n == 10 and v.effect == pytest.approx(1.25)


def test_ties_give_a_degenerate_interval() -> None:
    v = comparison.compare([10.0] * 20, [10.0] * 20, metric="tpot", min_speedup=1.1, sequential_ci=False)
    assert v.ci == (1.0, 1.0) and v.label is comparison.Label.FAIL
    v = comparison.compare([10.0] * 20, [10.0] * 20, metric="tpot", min_speedup=1.1)
    assert v.effect == 1.0 and v.label is comparison.Label.FAIL


def test_empty_and_tiny_samples_are_no_data() -> None:
    assert comparison.compare([], [], metric="tpot", min_speedup=1.1).label is comparison.Label.NO_DATA
    assert (
        comparison.compare([1.0] * 5, [1.0] * 5, metric="tpot", min_speedup=1.1).label
        is comparison.Label.NO_DATA
    )
    with pytest.raises(ValueError, match="differ in length"):
        comparison.compare([1.0], [1.0, 2.0], metric="tpot", min_speedup=1.1)


def test_throughput_speedup_is_treatment_over_control() -> None:
    v = comparison.compare(
        [100.0] * 20, [130.0] * 20, metric="throughput", min_speedup=1.1, higher_is_better=True
    )
    assert v.effect == pytest.approx(1.3)


def closed_loop(
    arm: str, *, seconds_per_request: float, requests: int = 64, slots: int = 16
) -> list[RequestRecord]:
    """One arm of a closed-loop stage: each slot sends its next request when its last one ends."""
    out: list[RequestRecord] = []
    free = [0.0] * slots
    for i in range(requests):
        slot = i % slots
        sent = free[slot]
        end = sent + seconds_per_request
        free[slot] = end
        out.append(
            RequestRecord(
                stage="c16",
                index=i,
                arm=arm,
                sent=sent,
                end=end,
                ok=True,
                completion_tokens=100,
                e2e_ms=seconds_per_request * 1e3,
                tpot_ms=seconds_per_request * 10.0,
                slot=slot,
            )
        )
    return out


def test_throughput_is_per_arm_so_an_arm_twice_as_fast_shows_twice_the_tokens_per_second() -> None:
    spec = make_spec()
    records = closed_loop("control", seconds_per_request=1.0) + closed_loop(
        "treatment", seconds_per_request=0.5
    )
    # The stage window ends when the slower arm (control) drains.
    window = StageWindow(stage="c16", start=0.0, end=4.0)
    result = stage(verdict.analyse(spec, records, [window]), "c16")
    control, treatment = result.control.output_tokens_per_second, result.treatment.output_tokens_per_second
    assert control == pytest.approx(64 * 100 / 4.0)
    assert treatment == pytest.approx(64 * 100 / 2.0)
    assert treatment / control == pytest.approx(2.0)


def test_fixed_horizon_interval_is_the_paired_t() -> None:
    rng = np.random.default_rng(3)
    c = np.exp(rng.normal(0, 0.3, 200))
    t = c / 1.25 * np.exp(rng.normal(0, 0.1, 200))
    v = comparison.compare(c, t, metric="tpot", min_speedup=1.1, sequential_ci=False)
    assert v.method == "pairedT" and v.label is comparison.Label.PASS
    assert v.ci is not None and v.ci[0] < 1.25 < v.ci[1]
    assert v.p_value is not None and v.p_value < 0.001


def test_sequential_interval_is_wider_than_the_fixed_one() -> None:
    rng = np.random.default_rng(4)
    c = np.exp(rng.normal(0, 0.3, 300))
    t = c / 1.2 * np.exp(rng.normal(0, 0.3, 300))
    fixed = comparison.compare(c, t, metric="tpot", min_speedup=1.1, sequential_ci=False)
    seq = comparison.compare(c, t, metric="tpot", min_speedup=1.1)
    assert fixed.ci is not None and seq.ci is not None
    assert seq.ci[0] <= fixed.ci[0] and seq.ci[1] >= fixed.ci[1]


def _records(stage: str, arm: str, values: list[float]) -> list[RequestRecord]:
    return [
        RequestRecord(stage=stage, index=i, arm=arm, sent=float(i), ok=True, tpot_ms=v)
        for i, v in enumerate(values)
    ]


def _clear_win(n: int, *, texts: bool = False) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """A 1.6x TPOT win (every pair clearly faster), optionally with identical greedy texts."""
    rng = np.random.default_rng(5)
    base = np.exp(rng.normal(2.3, 0.3, n))
    control = _records("low", "control", list(base * np.exp(rng.normal(0, 0.1, n))))
    treatment = _records("low", "treatment", list(base / 1.6 * np.exp(rng.normal(0, 0.1, n))))
    if texts:
        for c, t in zip(control, treatment, strict=True):
            c.text = t.text = f"answer {c.index}"
    return control, treatment


def test_stage_decided_stops_on_a_clear_effect_and_not_before_min_pairs() -> None:
    spec = make_spec(guardrails={"maxErrorRate": 0.1})  # shown after 29 clean requests
    control, treatment = _clear_win(200)
    few = sequential.MIN_PAIRS - 1
    assert not verdict.stage_decided(spec.analysis, control[:few], treatment[:few], max_pairs=300)
    assert verdict.stage_decided(spec.analysis, control[:60], treatment[:60], max_pairs=300)
    look = verdict.stage_look(spec.analysis, control[:60], treatment[:60], max_pairs=300)
    assert look.why == "above"


def test_a_clear_speed_up_runs_on_until_error_rate_and_output_match_are_shown_to_hold() -> None:
    """At the default limits (maxErrorRate 0.01, minOutputMatch 0.99) 299 clean pairs show both."""
    spec = make_spec()
    control, treatment = _clear_win(300, texts=True)
    assert verdict.stage_look(spec.analysis, control[:60], treatment[:60], max_pairs=300).why == "above"
    assert guardrails.pairs_to_show(0.01, 0.95) == 299
    for n in (60, 200, 298):
        assert not verdict.stage_decided(spec.analysis, control[:n], treatment[:n], max_pairs=300), n
    assert verdict.stage_decided(spec.analysis, control[:299], treatment[:299], max_pairs=300)
    # with sampling, output match is not evaluated: only the error rate holds it
    lax = make_spec(guardrails={"maxErrorRate": 0.1})
    assert not verdict.stage_decided(lax.analysis, control[:60], treatment[:60], max_pairs=300)
    assert verdict.stage_decided(lax.analysis, control[:60], treatment[:60], max_pairs=300, greedy=False)


def test_a_mismatch_or_a_sure_error_rate_breach_stops_the_stage_whatever_the_speed_up() -> None:
    spec = make_spec()
    control, treatment = _clear_win(40, texts=True)
    treatment[7].text = "a different answer"
    assert verdict.stage_decided(spec.analysis, control[:10], treatment[:10], max_pairs=300)
    assert not verdict.stage_decided(spec.analysis, control[:7], treatment[:7], max_pairs=300)
    control, treatment = _clear_win(40)
    for r in treatment[:4]:
        r.ok = False
    assert verdict.stage_decided(spec.analysis, control[:10], treatment[:10], max_pairs=300)


def test_stage_decided_uses_only_the_complete_prefix() -> None:
    spec = make_spec()
    control = _records("low", "control", [10.0] * 40)
    treatment = _records("low", "treatment", [6.0] * 40)
    # pair 3 still in flight in the treatment: only indices 0..2 form the prefix
    treatment = [r for r in treatment if r.index != 3]
    assert verdict.stage_look(spec.analysis, control, treatment, max_pairs=300).n == 3


def test_stage_decided_is_off_without_sequential_analysis() -> None:
    spec = make_spec(sequential=False)
    control = _records("low", "control", [10.0] * 100)
    treatment = _records("low", "treatment", [5.0] * 100)
    assert not verdict.stage_decided(spec.analysis, control, treatment, max_pairs=300)


def test_one_look_is_the_fixed_test_and_the_boundaries_spend_exactly_alpha() -> None:
    assert sequential.z_bounds((1.0,), (0.05,))[0] == pytest.approx(1.959964, abs=1e-5)
    d = sequential.design(300, alpha=0.05)
    assert d.looks[-1] == 300 and len(d.looks) > 10
    # Brownian motion observed at the planned looks: first crossings happen as often as spent.
    rng = np.random.default_rng(11)
    fractions = np.asarray(d.looks) / 300
    steps = rng.normal(size=(200_000, fractions.size)) * np.sqrt(np.diff(fractions, prepend=0.0))
    z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
    crossed = np.abs(z) >= np.asarray(d.z)
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), fractions.size)
    for k in (0, 4, fractions.size - 1):
        expected = sequential.spent(float(fractions[k]), 0.05)
        assert (first <= k).mean() == pytest.approx(expected, abs=0.0015)


def test_repeated_intervals_cover_the_mean_at_every_look_on_heavy_tails() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_t(5, size=(4000, 200)) * 0.4 + 0.1
    b = sequential.look_bounds(x, sequential.design(200, alpha=0.05))
    ever_missed = ((b.low > 0.1) | (b.high < 0.1)).any(axis=1).mean()
    assert ever_missed <= 0.05


def test_the_looks_do_not_depend_on_when_the_caller_looks() -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(0.25, 0.5, 300)
    every = sequential.look_every(300)
    calls = [sequential.look(x[:n], threshold=0.0, confidence=0.95, horizon=300) for n in range(10, 301)]
    first = next(c for c in calls if c.decided)
    assert first.n % every == 0
    # once decided, every later call reports the same look and interval
    assert all((c.why, c.n, c.low) == (first.why, first.n, first.low) for c in calls if c.n >= first.n)


def test_an_effect_between_min_speedup_and_the_alternative_is_decided_by_the_end() -> None:
    # the flaw of inverted SPRTs: their interval never narrows below a floor; here it must.
    rng = np.random.default_rng(9)
    x = rng.normal(math.log(1.13), 0.3, 600)
    at = sequential.look(x, threshold=math.log(1.05), confidence=0.95, horizon=600)
    assert at.decided and at.why == "above"


def test_a_stage_cut_short_gets_a_final_look_that_spends_the_rest() -> None:
    rng = np.random.default_rng(10)
    x = rng.normal(0.0, 0.5, 137)
    at = float(np.mean(x))  # a threshold no look can separate from
    mid = sequential.look(x, threshold=at, confidence=0.95, horizon=300)
    end = sequential.look(x, threshold=at, confidence=0.95, horizon=300, final=True)
    last_planned = max(n for n in sequential.planned_looks(300) if n <= 137)
    assert not mid.decided and mid.n == last_planned < 137
    assert end.decided and end.n == 137 and end.why == "undecided"
    assert end.high - end.low < mid.high - mid.low
    cut = sequential.design(300, alpha=0.05, final_at=137)
    planned = sequential.design(300, alpha=0.05)
    assert cut.looks[-1] == 137 and cut.z[-1] < planned.z[len(cut.looks) - 1]


def test_the_sequential_estimate_is_median_unbiased_where_the_mean_at_the_stop_is_not() -> None:
    # Stages stop early when their mean happens to lie far above minSpeedup, so the mean at the
    # deciding look overshoots the true speed-up more often than not; the reported estimate does not.
    rng = np.random.default_rng(11)
    true, threshold = math.log(1.2), math.log(1.1)
    over_estimate = over_mean = 0
    runs = 300
    for _ in range(runs):
        d = rng.normal(true, 0.4, 300)
        at = sequential.look(d, threshold=threshold, confidence=0.95, horizon=300, final=True)
        estimate = comparison.sequential_estimate(d, at, threshold=threshold, confidence=0.95, horizon=300)
        over_estimate += estimate > true
        over_mean += float(np.mean(d[: at.n])) > true
    assert over_mean / runs > 0.57
    assert abs(over_estimate / runs - 0.5) < 0.06  # 300 runs: one standard error is 0.029


def test_pairs_after_the_deciding_look_do_not_drag_the_estimate_onto_the_interval_s_end() -> None:
    # The real-vLLM symptom `c4: 1.198 [1.198, 1.438]`: the first pairs decided the stage, pairs in
    # flight at the stop were slower, and a mean over all of them sat on (or beyond) the interval's end.
    rng = np.random.default_rng(5)
    first = sequential.planned_looks(300)[0]
    d = np.r_[rng.normal(math.log(1.35), 0.1, first), rng.normal(math.log(1.05), 0.1, 40)]
    v = comparison.compare(np.exp(d), np.ones(d.size), metric="tpot", min_speedup=1.1, horizon=300)
    assert v.label is comparison.Label.PASS and v.decided_at == first and v.ci is not None
    assert math.exp(float(np.mean(d))) < v.ci[0]  # where the old estimate was
    assert v.ci[0] < v.effect < v.ci[1]  # type: ignore[operator]


def test_the_noise_floor_is_the_speedup_the_design_promotes_nine_times_in_ten() -> None:
    rng = np.random.default_rng(12)
    d = rng.normal(0.0, 0.42, 300)  # an A/A-like stage: no speed-up, the noise of the benchmark's σ = 0.25
    v = comparison.compare(np.exp(d), np.ones(300), metric="tpot", min_speedup=1.1, horizon=300)
    floor = v.detectable
    assert floor is not None and 1.1 < floor < 1.3
    sd = float(np.std(d, ddof=1))
    promoted = 0
    runs = 400
    for _ in range(runs):
        x = rng.normal(math.log(floor), sd, 300)
        at = sequential.look(x, threshold=math.log(1.1), confidence=0.95, horizon=300, final=True)
        promoted += at.why == "above"
    assert abs(promoted / runs - comparison.DETECTABLE_POWER) < 0.05
    # Noisier stages, or fewer requests, can only show larger speed-ups; the fixed test likewise.
    noisy = comparison.compare(np.exp(2 * d), np.ones(300), metric="tpot", min_speedup=1.1, horizon=300)
    short = comparison.compare(np.exp(d[:60]), np.ones(60), metric="tpot", min_speedup=1.1, horizon=60)
    assert noisy.detectable is not None and short.detectable is not None
    assert noisy.detectable > floor and short.detectable > floor
    fixed = comparison.compare(np.exp(d), np.ones(300), metric="tpot", min_speedup=1.1, sequential_ci=False)
    crit = stats.t.ppf(0.975, 299) + stats.t.ppf(0.9, 299)
    assert fixed.detectable == pytest.approx(1.1 * math.exp(crit * sd / math.sqrt(300)))
    assert comparison.compare([10.0] * 20, [10.0] * 20, metric="tpot", min_speedup=1.1).detectable is None


def test_repeated_p_value_matches_the_interval() -> None:
    rng = np.random.default_rng(7)
    for shift in (0.05, 0.1, 0.3):
        x = rng.normal(shift, 0.5, 200)
        at = sequential.look(x, threshold=0.0, confidence=0.95, horizon=300, final=True)
        p = sequential.repeated_p_value(x, threshold=0.0, confidence=0.95, horizon=300, upto=at.n)
        assert (at.low > 0.0) == (p < 0.05), (shift, at, p)


def test_empty_input_to_the_sequence_is_empty() -> None:
    b = sequential.look_bounds(np.zeros((3, 0)), sequential.design(10, alpha=0.05))
    assert b.mean.shape == (3, 0)
    assert sequential.look(np.array([]), threshold=0.0, confidence=0.95, horizon=10).why == "too-few"


def _length_spec(**dataset: Any) -> ExperimentSpec:
    stages = [
        {"name": "short-c1", "concurrency": 1},
        {"name": "short-c8", "concurrency": 8},
        {"name": "short-c32", "concurrency": 32},
        {"name": "long-c1", "concurrency": 1, "inputTokens": 2048},
        {"name": "long-c8", "concurrency": 8, "inputTokens": 2048},
    ]
    return ExperimentSpec.model_validate(
        experiment_document(workload={"stages": stages, "dataset": {"type": "synthetic", **dataset}})["spec"]
    )


def _result(name: str, batch: float, passed: bool) -> StageResult:
    return StageResult(
        name=name, batch_size=batch, verdict=StageVerdict.PASS if passed else StageVerdict.FAIL
    )


def test_the_recommendation_is_a_table_over_input_length_where_more_than_one_was_measured() -> None:
    results = [
        _result("short-c1", 1, True),
        _result("short-c8", 8, True),
        _result("short-c32", 32, False),
        _result("long-c1", 1, True),
        _result("long-c8", 8, False),
    ]
    rec = recommendation.recommend(_length_spec(inputTokens=256), results)
    table = [
        (r.input_tokens, r.beneficial_up_to, r.num_speculative_tokens_per_batch_size)
        for r in rec.by_input_length
    ]
    assert table == [
        (256, "short-c8", [[1, 8, 5], [9, 4096, 0]]),
        (2048, "long-c1", [[1, 1, 5], [2, 4096, 0]]),
    ]
    # over all stages (by batch size, listed order within a tie) short-c8 passes before long-c8 fails:
    # the overall schedule is the short prompts' one, and the note says it does not cover the long ones
    assert rec.num_speculative_tokens_per_batch_size == [[1, 8, 5], [9, 4096, 0]]
    assert rec.note == (
        "passes up to short-c8 (~8 running requests), not at long-c8; holds for inputTokens 256 of 256, 2048"
    )
    assert rec.wire()["byInputLength"][0] == {
        "inputTokens": 256,
        "beneficialUpTo": "short-c8",
        "numSpeculativeTokensPerBatchSize": [[1, 8, 5], [9, 4096, 0]],
        "note": "passes up to short-c8 (~8 running requests), not at short-c32",
    }


def test_one_measured_length_gives_no_table() -> None:
    results = [_result("short-c1", 1, True), _result("short-c8", 8, False)]
    rec = recommendation.recommend(_length_spec(), results)
    assert (
        rec.by_input_length == []
        and rec.note == "passes up to short-c1 (~1 running requests), not at short-c8"
    )


def test_the_overall_schedule_holds_for_every_length_that_passes_up_to_its_cut_off() -> None:
    results = [
        _result("short-c1", 1, True),
        _result("short-c8", 8, False),
        _result("short-c32", 32, False),
        _result("long-c1", 1, True),
        _result("long-c8", 8, True),
    ]
    rec = recommendation.recommend(_length_spec(inputTokens=256), results)
    assert rec.num_speculative_tokens_per_batch_size == [[1, 1, 5], [2, 4096, 0]]
    assert [r.beneficial_up_to for r in rec.by_input_length] == ["short-c1", "long-c8"]
    assert rec.note is not None and rec.note.endswith("; holds for inputTokens 256, 2048 of 256, 2048")
    failing = [_result(r.name, r.batch_size or 1, r.name != "short-c1") for r in results]
    rec = recommendation.recommend(_length_spec(inputTokens=256), failing)
    assert rec.note == "speculation did not pass at the lowest load (short-c1); leave it off"
    assert [r.beneficial_up_to for r in rec.by_input_length] == [None, "long-c8"]


def _facts(**change: Any) -> verdict.StageFacts:
    passing = comparison.MetricVerdict(
        label=comparison.Label.PASS,
        effect=1.3,
        ci=(1.2, 1.4),
        p_value=0.001,
        n=200,
        reason="1.30x",
        method="t",
    )
    facts = verdict.StageFacts(
        critical=False,
        validity=StageValidity(valid=True),
        missing=None,
        control_fails=False,
        surely_breached=False,
        breached=False,
        undecided=[],
        speedup=passing,
    )
    return dataclasses.replace(facts, **change)


def _label(label: comparison.Label) -> comparison.MetricVerdict:
    return dataclasses.replace(_facts().speedup, label=label, reason=f"speed-up {label}")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, (StageVerdict.PASS, ReasonCode.SPEEDUP_CONFIRMED, "1.30x")),
        # each row beats every row below it: the facts of the later rows are set too
        (
            {
                "critical": True,
                "validity": StageValidity(valid=False, reasons=["late"]),
                "surely_breached": True,
            },
            (
                StageVerdict.FAIL,
                ReasonCode.OUTPUT_MISMATCH,
                "output mismatch under greedy sampling (critical)",
            ),
        ),
        (
            {"validity": StageValidity(valid=False, reasons=["pacer late"]), "missing": "no requests"},
            (StageVerdict.INCONCLUSIVE, ReasonCode.INVALID_MEASUREMENT, "invalid measurement: pacer late"),
        ),
        (
            {"validity": StageValidity(valid=False)},
            (
                StageVerdict.INCONCLUSIVE,
                ReasonCode.INVALID_MEASUREMENT,
                "invalid measurement: marked invalid",
            ),
        ),
        (
            {"missing": "no control requests", "control_fails": True},
            (StageVerdict.INCONCLUSIVE, ReasonCode.NO_DATA, "no data: no control requests"),
        ),
        (
            {"control_fails": True, "surely_breached": True},
            (
                StageVerdict.INCONCLUSIVE,
                ReasonCode.INVALID_MEASUREMENT,
                "invalid measurement: the control arm fails too (errors are not speculation's)",
            ),
        ),
        (
            {"surely_breached": True, "speedup": _label(comparison.Label.NO_DATA)},
            (StageVerdict.FAIL, ReasonCode.GUARDRAIL_FAILED, None),
        ),
        (
            {"speedup": _label(comparison.Label.NO_DATA)},
            (StageVerdict.INCONCLUSIVE, ReasonCode.NO_DATA, "no data: speed-up NoData"),
        ),
        (
            {"speedup": _label(comparison.Label.FAIL), "breached": True},
            (StageVerdict.FAIL, ReasonCode.SLOWER_THAN_REQUIRED, "speed-up Fail"),
        ),
        (
            {"breached": True, "undecided": ["outputMatch"]},
            (StageVerdict.INCONCLUSIVE, ReasonCode.INSUFFICIENT_EVIDENCE, "1.30x"),
        ),
        (
            {"undecided": ["errorRate", "outputMatch"], "speedup": _label(comparison.Label.INCONCLUSIVE)},
            (StageVerdict.INCONCLUSIVE, ReasonCode.INSUFFICIENT_EVIDENCE, "speed-up Inconclusive"),
        ),
        (
            {"undecided": ["errorRate", "outputMatch"]},
            (
                StageVerdict.INCONCLUSIVE,
                ReasonCode.GUARDRAIL_UNDECIDED,
                "1.30x, but errorRate and outputMatch not shown to hold within the stage's requests:"
                " raise its requests (requestsPerStage) or its guardrail's limit",
            ),
        ),
        (
            {"speedup": _label(comparison.Label.INCONCLUSIVE)},
            (StageVerdict.INCONCLUSIVE, ReasonCode.INSUFFICIENT_EVIDENCE, "speed-up Inconclusive"),
        ),
    ],
)
def test_the_stage_rule_takes_the_first_row_that_holds(
    change: dict[str, Any], expected: tuple[StageVerdict, ReasonCode, str | None]
) -> None:
    assert verdict.stage_rule(_facts(**change)) == expected


def test_each_stage_carries_the_code_the_overall_reason_is_combined_from() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup={"low": 1.4, "c16": 0.85}, n=300)
    result = verdict.analyse(spec, records, windows)
    assert {s.name: s.code for s in result.stages} == {
        "low": ReasonCode.SPEEDUP_CONFIRMED,
        "c16": ReasonCode.SLOWER_THAN_REQUIRED,
    }
    assert result.reason == ReasonCode.SLOWER_THAN_REQUIRED


def test_an_undecided_stage_reports_the_interval_of_its_last_look_reached() -> None:
    """Before any look decides, the stage's interval is that of the last planned look it reached,
    both bounds (mutation benchmark survivor: the high bound taken from the first look)."""
    x = np.tile([0.5, -0.5, 0.3, -0.3], 25)  # mean 0 at every look: undecided against 0 at 100 of 300
    at = sequential.look(x, threshold=0.0, confidence=0.95, horizon=300)
    assert (at.decided, at.why) == (False, "undecided")
    d = sequential.design(300, alpha=0.05)
    b = sequential.look_bounds(x, d)
    assert b.n.size >= 2 and at.n == int(b.n[-1])
    assert (at.low, at.high) == (float(b.low[-1]), float(b.high[-1]))
    assert at.high < float(b.high[0])  # the last look's interval is the narrower one


def test_a_request_s_throughput_is_its_tokens_over_its_end_to_end_time() -> None:
    """primaryMetric throughput: 24 tokens in 1.2 s is 20 tokens/s; a request without a positive
    end-to-end time has none (mutation benchmark survivor: `e2e_ms <= 0` -> `>= 0` made every request
    NaN, so a throughput experiment could only end NoData)."""

    def rec(e2e_ms: float | None, tokens: int | None = 24) -> RequestRecord:
        return RequestRecord(
            stage="s", index=0, arm="control", ok=True, sent=0.0, e2e_ms=e2e_ms, completion_tokens=tokens
        )

    assert pairing.metric_value(rec(1200.0), "throughput") == pytest.approx(20.0)
    assert all(
        math.isnan(pairing.metric_value(r, "throughput")) for r in (rec(0.0), rec(None), rec(1200.0, None))
    )


def test_a_quantile_change_s_bootstrap_interval_narrows_with_the_confidence_and_holds_the_estimate() -> None:
    """The interval's tails are (1 - confidence) / 2 each: at 50% it is the bootstrap's quartiles, ordered
    and holding the estimate, and at 95% it is wider (mutation benchmark survivor: tails of
    (1 - confidence) * 2, which turn a 50% interval inside out)."""
    rng = np.random.default_rng(11)
    control = rng.lognormal(3.0, 0.3, 200)
    treatment = control * rng.lognormal(-0.1, 0.1, 200)

    def interval(confidence: float) -> tuple[float, float, float]:
        change = comparison.quantile_change(
            control, treatment, quantile=0.9, confidence=confidence, rng=np.random.default_rng(0)
        )
        assert change is not None and change.ratio_ci is not None
        return change.ratio_ci[0], change.ratio, change.ratio_ci[1]

    low50, ratio, high50 = interval(0.5)
    low95, _, high95 = interval(0.95)
    assert low50 < ratio < high50
    assert low95 < low50 and high50 < high95


def test_per_request_acceptance_merges_histograms_of_any_length() -> None:
    """Two requests' acceptance histograms of 2 and 5 bins: summed bin by bin, the per-position rates
    and the mean acceptance length from them (mutation benchmark survivors in acceptance: the padding
    `len ^ len`, the mean length `accepted % steps`)."""

    def treated(index: int, accepted: int, steps: int, hist: list[int]) -> RequestRecord:
        return RequestRecord(
            stage="s",
            index=index,
            arm="treatment",
            ok=True,
            sent=0.0,
            end=1.0,
            completion_tokens=10,
            spec_decode={
                "num_accepted_draft_tokens": accepted,
                "num_draft_tokens": 4 * steps,
                "num_spec_steps": steps,
                "acceptance_histogram": hist,
                "num_spec_tokens": 4,
            },
        )

    got = acceptance.acceptance([treated(0, 1, 2, [1, 1]), treated(1, 4, 4, [0, 1, 1, 1, 1])], None, k=4)
    assert got is not None
    assert got.per_position == pytest.approx([5 / 6, 3 / 6, 2 / 6, 1 / 6])
    assert got.mean_length == pytest.approx(1 + 5 / 6)
    assert got.rate == pytest.approx(5 / 24)


def test_tail_speed_ups_are_the_quantile_ratios_of_the_paired_samples() -> None:
    """Control spread over 8-12 ms, treatment 5 ms flat: each tail's speed-up is the control's quantile
    over 5 ms (mutation benchmark survivor in comparison: the finite-and-positive mask built with `<<`,
    an integer index that keeps the first pair 200 times)."""
    rng = np.random.default_rng(5)
    control = rng.uniform(8.0, 12.0, size=200)
    tails = comparison.quantile_speedups(
        control, np.full(200, 5.0), metric="tpot", confidence=0.95, rng=np.random.default_rng(1)
    )
    assert [t.quantile for t in tails] == [0.5, 0.9, 0.99]
    assert [t.estimate for t in tails] == pytest.approx(
        [float(np.quantile(control, q)) / 5.0 for q in (0.5, 0.9, 0.99)]
    )


@pytest.mark.parametrize("n", [10, 11, 37, 1000, 9001])
def test_bootstrap_quantiles_are_numpy_s_of_the_same_resamples_without_holding_them(n: int) -> None:
    """The counting bootstrap (bounded memory, benchmarks/scale/results_100k.py) gives exactly what
    `np.quantile(sample[idx], q, axis=1)` gives for the same draws, ties and both tails included."""
    rng = np.random.default_rng(n)
    x, y = rng.lognormal(size=n), np.round(rng.lognormal(size=n), 1)  # y: many ties
    q = np.array([0.0, 0.5, 0.9, 0.99, 1.0])
    idx = np.random.default_rng(5).integers(0, n, size=(comparison.BOOTSTRAP_RESAMPLES, n))
    got = comparison.bootstrap_quantiles((x, y), q, rng=np.random.default_rng(5))
    assert np.array_equal(got[0], np.quantile(x[idx], q, axis=1))
    assert np.array_equal(got[1], np.quantile(y[idx], q, axis=1))


def test_bootstrap_quantiles_count_a_resample_in_full_when_its_order_statistic_leaves_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bootstrap sums a resample's counts in rank order only near each quantile; with the window
    narrowed to 16 ranks either side, many resamples' order statistics fall outside it and are
    counted in full: still exactly numpy's quantiles of the same draws."""
    monkeypatch.setattr(comparison, "BOOTSTRAP_WINDOW_SD", 0.0)
    n = 9001
    rng = np.random.default_rng(n)
    x, y = rng.lognormal(size=n), np.round(rng.lognormal(size=n), 1)
    q = np.array([0.0, 0.5, 0.9, 0.99, 1.0])
    idx = np.random.default_rng(5).integers(0, n, size=(comparison.BOOTSTRAP_RESAMPLES, n))
    got = comparison.bootstrap_quantiles((x, y), q, rng=np.random.default_rng(5))
    assert np.array_equal(got[0], np.quantile(x[idx], q, axis=1))
    assert np.array_equal(got[1], np.quantile(y[idx], q, axis=1))


@pytest.mark.parametrize("method", ["exact", "wilson"])
@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_proportion_intervals_are_scipy_s_binomtest_intervals(method: str, confidence: float) -> None:
    """The closed forms give scipy's root-found intervals, at the ends (0 and all successes) too."""
    for trials in (1, 2, 7, 40, 333, 5000):
        for successes in sorted({0, 1, trials // 3, trials // 2, trials - 1, trials}):
            expected = stats.binomtest(successes, trials).proportion_ci(
                confidence_level=confidence, method=method
            )
            low, high = comparison.proportion_interval(
                successes,
                trials,
                confidence=confidence,
                method="exact" if method == "exact" else "wilson",
            )
            assert (low, high) == pytest.approx((expected.low, expected.high), abs=1e-9), (successes, trials)


def test_pairs_that_share_a_wave_get_an_interval_over_waves_not_pairs() -> None:
    # Identical arms whose waves of 16 share one moment each (a shared slowdown): 300 pairs are ~19
    # independent units. The pair-by-pair interval excludes 1.0 most of the time; the blocked one
    # covers it about as often as its level says.
    rng = np.random.default_rng(5)
    runs, covered_iid, covered = 400, 0, 0
    for _ in range(runs):
        d = np.repeat(rng.normal(0.0, 0.1, 19), 16)[:300] + rng.normal(0.0, 0.05, 300)
        _, low, high, _ = comparison.paired_t(d, threshold=0.0, confidence=0.95)
        covered_iid += low <= 0.0 <= high
        _, low, high, _ = comparison.paired_t(d, threshold=0.0, confidence=0.95, unit=16)
        covered += low <= 0.0 <= high
    assert covered_iid / runs < 0.6
    assert covered / runs > 0.92
    # one wave is one unit: no interval
    one = comparison.compare(np.ones(64), np.ones(64) * 0.9, metric="tpot", min_speedup=1.1, unit=64)
    assert one.label is comparison.Label.NO_DATA and "fewer than two sampling units" in one.reason


def test_a_verdict_withheld_by_an_undecided_guardrail_names_it_in_its_message() -> None:
    """60 clean pairs cannot show the default limits (299 needed): the message says which guardrail,
    at which stage, as a failed guardrail's does."""
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup={"low": 1.4, "c16": 1.4}, n=60)
    result = verdict.analyse(spec, records, windows)
    assert (result.verdict, result.reason) == (Verdict.INCONCLUSIVE, ReasonCode.GUARDRAIL_UNDECIDED)
    assert result.message.startswith(
        "guardrail undecided (not shown to hold): errorRate at low, outputMatch at low, errorRate at c16, "
        "outputMatch at c16; tpot speed-up 1."
    ), result.message


@pytest.mark.parametrize(("n", "block"), [(10, 3), (37, 4), (1000, 16), (9001, 64)])
def test_the_block_bootstrap_resamples_circular_runs_of_consecutive_pairs_exactly_as_numpy_would(
    n: int, block: int
) -> None:
    """Issue 35 item 1 for tails: with a sampling unit of `block` pairs, every resample is made of
    circular runs of `block` consecutive indices (the last one cut to n), and the counting bootstrap
    gives numpy's quantiles of exactly those draws."""
    draws = comparison.block_draws(np.random.default_rng(1), 50, n, block)
    assert draws.shape == (50, n) and draws.min() >= 0 and draws.max() < n
    steps = (np.diff(draws, axis=1) % n)[:, : (n - 1) // block * block]
    inside = np.ones(steps.shape[1], dtype=bool)
    inside[block - 1 :: block] = False  # a block's last index to the next block's start: anywhere
    assert (steps[:, inside] == 1).all()
    assert np.array_equal(
        comparison.block_draws(np.random.default_rng(1), 50, n, 1),
        np.random.default_rng(1).integers(0, n, size=(50, n)),
    )
    rng = np.random.default_rng(n)
    x, y = rng.lognormal(size=n), np.round(rng.lognormal(size=n), 1)
    q = np.array([0.0, 0.5, 0.9, 0.99, 1.0])
    idx = comparison.block_draws(np.random.default_rng(5), comparison.BOOTSTRAP_RESAMPLES, n, block)
    got = comparison.bootstrap_quantiles((x, y), q, rng=np.random.default_rng(5), block=block)
    assert np.array_equal(got[0], np.quantile(x[idx], q, axis=1))
    assert np.array_equal(got[1], np.quantile(y[idx], q, axis=1))


def test_the_tails_bootstrap_uses_the_speed_up_interval_s_blocks_and_widens_for_their_few_degrees_of_freedom() -> (
    None
):
    """Blocks of at least one sampling unit, at most MAX_BLOCKS of them (`sequential.block_size`); G
    blocks widen the percentile interval by sqrt(G / (G - 1)) t_{G-1} / z; a unit of one pair is the
    plain paired bootstrap (benchmarks/verdict/tails.py: A/A coverage 0.46 -> 0.93 at c64's p50)."""
    assert comparison.bootstrap_block(300, 1, 0.95) == (1, 1.0)
    block, widen = comparison.bootstrap_block(300, 4, 0.95)  # 10 blocks of 30
    assert block == 30 and widen == pytest.approx(math.sqrt(10 / 9) * stats.t.ppf(0.975, 9) / 1.959964)
    block, widen = comparison.bootstrap_block(300, 64, 0.90)  # 4 blocks of 64
    assert block == 64 and widen == pytest.approx(math.sqrt(4 / 3) * stats.t.ppf(0.95, 3) / 1.644854)
