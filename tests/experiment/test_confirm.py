"""The confirmation round (`analysis.confirm`): planning, judging and folding it, and where it is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdecode.experiment import confirm, manifests, validation, verdict
from specdecode.experiment.spec import Arm, ExperimentSpec
from specdecode.experiment.status import ConfirmationStage, Recommendation, Speedup, StageVerdict
from tests.factories import experiment_document
from tests.report import synthetic

SCHEDULE = [[1, 1, 5], [2, 4096, 0]]


def make_document(
    *,
    speculative: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    analysis: dict[str, Any] | None = None,
) -> dict[str, Any]:
    doc = experiment_document(
        workload={"stages": [{"name": "c1", "concurrency": 1}, {"name": "c16", "concurrency": 16}]},
        analysis={"confirm": True, **(analysis or {})},
    )
    if speculative is not None:
        doc["spec"]["speculative"] = speculative
    if engine is not None:
        doc["spec"]["engine"] = engine
    return doc


def make_spec() -> ExperimentSpec:
    spec, _ = validation.parse_experiment(make_document())
    return spec


def first_round(spec: ExperimentSpec, **speedup: float) -> verdict.Analysis:
    records, windows = synthetic.run(spec, speedup=speedup, n=300)
    return verdict.analyse(spec, records, windows)


def confirmation(
    spec: ExperimentSpec, *, noise: float = 0.05, seed: int = 1, **speedup: float
) -> Recommendation:
    """A first round where c16 fails (so the schedule stops speculating above 1), then a round of `speedup`."""
    first = first_round(spec, c1=1.4, c16=0.85)
    assert first.recommendation is not None
    schedule = first.recommendation.num_speculative_tokens_per_batch_size
    assert schedule == SCHEDULE
    planned = confirm.plan(spec, first.stages, schedule)
    second = confirm.treatment_spec(spec, schedule)
    # 300 requests: at c16 that is 18 waves, the independent units of its interval, and enough
    # clean pairs to show errorRate and outputMatch hold (299)
    records, windows = synthetic.run(second, speedup=speedup, n=300, noise=noise, seed=seed)
    return confirm.fold(first.recommendation, confirm.judge(second, planned, records, windows))


def test_each_stage_is_judged_by_minspeedup_where_the_schedule_speculates_and_as_non_inferior_where_not() -> (
    None
):
    spec = make_spec()
    first = first_round(spec, c1=1.4, c16=0.85)
    planned = confirm.plan(spec, first.stages, SCHEDULE)
    assert planned == [
        confirm.Planned("c1", 5, spec.analysis.min_speedup),
        confirm.Planned("c16", 0, confirm.NON_INFERIORITY),
    ]


def test_the_schedule_is_confirmed_when_speculation_still_pays_below_and_costs_nothing_above() -> None:
    rec = confirmation(make_spec(), c1=1.4, c16=1.0)
    assert rec.confirmed is True and rec.confirmation_reason == "Confirmed"
    by_name = {c.name: c for c in rec.confirmation}
    assert by_name["c1"].verdict is StageVerdict.PASS and by_name["c1"].k == 5
    # a speed-up of 1.0 fails minSpeedup 1.10 but is non-inferior at 0.98
    c16 = by_name["c16"]
    assert c16.k == 0 and c16.threshold == confirm.NON_INFERIORITY
    assert c16.verdict is StageVerdict.PASS
    assert c16.speedup is not None and c16.speedup.ci_low is not None and c16.speedup.ci_high is not None
    assert c16.speedup.ci_low >= confirm.NON_INFERIORITY and c16.speedup.ci_high < spec_min_speedup()
    assert rec.num_speculative_tokens_per_batch_size == SCHEDULE  # the prediction itself is kept


def spec_min_speedup() -> float:
    return make_spec().analysis.min_speedup


def test_a_stage_where_the_schedule_still_loses_refutes_it() -> None:
    rec = confirmation(make_spec(), c1=1.4, c16=0.85)
    assert rec.confirmed is False and rec.confirmation_reason == "Refuted"
    assert {c.name: c.verdict for c in rec.confirmation} == {
        "c1": StageVerdict.PASS,
        "c16": StageVerdict.FAIL,
    }


def test_speculation_that_no_longer_pays_below_the_switch_refutes_it() -> None:
    rec = confirmation(make_spec(), c1=0.9, c16=1.0)
    assert rec.confirmed is False
    assert {c.name: c.verdict for c in rec.confirmation}["c1"] is StageVerdict.FAIL


def test_an_inconclusive_stage_does_not_refute_and_is_listed() -> None:
    rec = confirmation(make_spec(), noise=0.6, c1=1.12, c16=1.0)
    verdicts = {c.name: c.verdict for c in rec.confirmation}
    assert StageVerdict.INCONCLUSIVE in verdicts.values() and StageVerdict.FAIL not in verdicts.values()
    assert rec.confirmed is True


def test_a_round_that_measured_nothing_is_neither_confirmed_nor_refuted() -> None:
    spec = make_spec()
    first = first_round(spec, c1=1.4, c16=0.85)
    assert first.recommendation is not None
    planned = confirm.plan(spec, first.stages, SCHEDULE)
    rec = confirm.fold(first.recommendation, confirm.judge(spec, planned, [], []))
    assert rec.confirmed is None and rec.confirmation_reason == "NotMeasured"
    assert [c.verdict for c in rec.confirmation] == [StageVerdict.INCONCLUSIVE] * 2


def test_the_treatment_of_the_round_is_rendered_with_the_schedule() -> None:
    spec = make_spec()
    second = confirm.treatment_spec(spec, SCHEDULE)
    rendered = json.loads(manifests.speculative_config_json(second.speculative))
    assert rendered["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert rendered["num_speculative_tokens"] == 5
    assert "--speculative-config" not in manifests.serve_args(second, Arm.CONTROL)
    assert (
        "num_speculative_tokens_per_batch_size" not in spec.speculative.extra
    )  # the first round's spec is unchanged


def test_not_run_says_why_and_the_summary_line_names_each_stage() -> None:
    rec = confirm.not_run(
        Recommendation(num_speculative_tokens_per_batch_size=SCHEDULE),
        confirm.Reason.ROUND_FAILED,
    )
    assert rec.confirmed is None and rec.confirmation_reason == "RoundFailed" and rec.confirmation == []
    assert rec.num_speculative_tokens_per_batch_size == SCHEDULE
    assert confirm.summary(rec) == "confirmation RoundFailed"
    done = Recommendation(
        confirmed=True,
        confirmation_reason="Confirmed",
        confirmation=[
            ConfirmationStage(
                name="c1",
                k=4,
                threshold=1.1,
                speedup=Speedup(metric="tpot", estimate=1.123, n=9),
                verdict=StageVerdict.PASS,
            ),
            ConfirmationStage(
                name="c16",
                k=0,
                threshold=0.98,
                speedup=Speedup(metric="tpot", estimate=1.0, n=9),
                verdict=StageVerdict.PASS,
            ),
        ],
    )
    assert (
        confirm.summary(done) == "confirmation Confirmed: c1 1.12x Pass (k=4), c16 1.00x Pass (k=0, >= 0.98)"
    )
    assert confirm.summary(Recommendation()) == ""


def test_the_status_carries_the_confirmation_in_camel_case() -> None:
    rec = confirmation(make_spec(), c1=1.4, c16=1.0)
    wire = rec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert wire["confirmed"] is True and wire["confirmationReason"] == "Confirmed"
    assert {"name", "k", "threshold", "speedup", "verdict", "code"} <= set(wire["confirmation"][0])
    assert wire["confirmation"][0]["code"] == "SpeedupConfirmed"  # the stage rule's code, not read from text


def problems(**kwargs: Any) -> list[str]:
    return [str(p) for p in validation.check_document(make_document(**kwargs))]


def test_confirm_is_accepted_for_a_method_and_release_that_honour_the_schedule() -> None:
    assert problems() == []


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"speculative": {"method": "suffix"}}, "needs speculative.numSpeculativeTokens"),
        (
            {"speculative": {"method": "suffix", "numSpeculativeTokens": 8}},
            "may drop num_speculative_tokens_per_batch_size for method 'suffix'",
        ),
        ({"engine": {"vllmVersion": "0.22.0"}}, "vLLM 0.22 has no num_speculative_tokens_per_batch_size"),
        (
            {
                "speculative": {
                    "method": "ngram",
                    "numSpeculativeTokens": 4,
                    "extra": {"num_speculative_tokens_per_batch_size": [[1, 8, 4]]},
                }
            },
            "speculative.extra.num_speculative_tokens_per_batch_size is set",
        ),
        ({"analysis": {"mode": "NoiseFloor"}}, "a NoiseFloor run does not speculate"),
    ],
)
def test_confirm_is_refused_where_it_cannot_work(kwargs: dict[str, Any], fragment: str) -> None:
    found = problems(**kwargs)
    assert any(f.startswith("spec.analysis.confirm: ") and fragment in f for f in found), found


def test_a_deprecated_mtp_name_is_not_refused_for_confirm_only_for_its_spelling() -> None:
    found = problems(speculative={"method": "qwen3_next_mtp", "numSpeculativeTokens": 2})
    assert found and not any(f.startswith("spec.analysis.confirm") for f in found), found
