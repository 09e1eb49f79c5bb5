"""Break-even acceptance (#18): known numbers, the edge cases, and a failing stage's status."""

from __future__ import annotations

import math

import pytest

from specdecode.experiment import breakeven, verdict
from specdecode.experiment.status import Acceptance, Speedup, StageVerdict
from tests.experiment.test_verdict import make_spec, stage
from tests.report import synthetic


def test_expected_length_is_the_standard_formula() -> None:
    assert breakeven.expected_length(0.0, 4) == 1.0
    assert breakeven.expected_length(1.0, 4) == 5.0
    assert breakeven.expected_length(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_per_token_alpha_inverts_the_expected_length() -> None:
    for alpha in (0.1, 0.5, 0.8, 0.95):
        assert breakeven.per_token_alpha(breakeven.expected_length(alpha, 5), 5) == pytest.approx(alpha)
    assert breakeven.per_token_alpha(6.5, 5) is None
    assert breakeven.per_token_alpha(0.5, 5) is None


def test_required_rate_from_known_numbers() -> None:
    # k=4, measured rate 0.5 (L = 3) gave 0.9x; 1.2x needs L = 1.2 / 0.9 * 3 = 4, rate 0.75.
    b = breakeven.break_even(
        Speedup(metric="tpot", estimate=0.9, ci_low=0.8, ci_high=1.0),
        Acceptance(rate=0.5, mean_length=3.0),
        k=4,
        min_speedup=1.2,
        measured_interval=(0.48, 0.52),
    )
    assert b is not None and b.reachable
    assert b.acceptance_rate == pytest.approx(0.75)
    assert b.mean_length == pytest.approx(4.0)
    assert b.ci_low == pytest.approx((1.2 / 1.0 * 3 - 1) / 4)
    assert b.ci_high == pytest.approx((1.2 / 0.8 * 3 - 1) / 4)
    assert b.per_token is not None and breakeven.expected_length(b.per_token, 4) == pytest.approx(4.0)
    assert (b.measured_rate, b.measured_ci_low, b.measured_ci_high) == (0.5, 0.48, 0.52)
    line = breakeven.describe("c16", b)
    assert line.startswith("at c16 speculation pays only above acceptance 0.75 [0.65, 0.87] (per token 0.89)")
    assert line.endswith("measured 0.50 [0.48, 0.52]")


def test_a_stage_no_acceptance_can_save_is_unreachable() -> None:
    b = breakeven.break_even(
        Speedup(metric="tpot", estimate=0.5), Acceptance(rate=0.5, mean_length=3.0), k=4, min_speedup=1.1
    )
    assert b is not None and not b.reachable and b.acceptance_rate > 1 and b.per_token is None
    assert "no acceptance pays" in breakeven.describe("c64", b)


def test_mean_length_comes_from_the_rate_and_k_from_both() -> None:
    from_rate = breakeven.break_even(
        Speedup(metric="tpot", estimate=0.9), Acceptance(rate=0.5), k=4, min_speedup=1.2
    )
    assert from_rate is not None and from_rate.acceptance_rate == pytest.approx(0.75)
    # vLLM chose k (MTP): no numSpeculativeTokens in the spec, k = (L - 1) / rate.
    inferred = breakeven.break_even(
        Speedup(metric="tpot", estimate=0.9), Acceptance(rate=0.5, mean_length=3.0), k=None, min_speedup=1.2
    )
    assert inferred is not None and inferred.k == 4


@pytest.mark.parametrize(
    ("speedup", "acceptance"),
    [
        (None, Acceptance(rate=0.5, mean_length=3.0)),
        (Speedup(metric="tpot", estimate=0.9), None),
        (Speedup(metric="ttft", estimate=0.9), Acceptance(rate=0.5, mean_length=3.0)),
        (Speedup(metric="tpot", estimate=None), Acceptance(rate=0.5, mean_length=3.0)),
        (Speedup(metric="tpot", estimate=math.nan), Acceptance(rate=0.5, mean_length=3.0)),
        (Speedup(metric="tpot", estimate=0.9), Acceptance()),
    ],
)
def test_no_break_even_without_a_scaling_speedup_and_an_acceptance(
    speedup: Speedup | None, acceptance: Acceptance | None
) -> None:
    assert breakeven.break_even(speedup, acceptance, k=4, min_speedup=1.1) is None


def test_a_failing_stage_states_its_break_even_and_a_passing_one_does_not() -> None:
    spec = make_spec()
    records, windows = synthetic.run(spec, speedup={"low": 1.4, "c16": 0.85}, n=300, acceptance=0.6)
    result = verdict.analyse(spec, records, windows)
    failing, passing = stage(result, "c16"), stage(result, "low")
    assert failing.verdict is StageVerdict.FAIL and passing.verdict is StageVerdict.PASS
    assert passing.break_even is None
    b = failing.break_even
    assert b is not None and b.k == spec.speculative.num_speculative_tokens
    acc = failing.acceptance
    assert acc is not None and acc.mean_length is not None and failing.speedup is not None
    assert b.measured_rate == acc.rate
    assert b.measured_ci_low is not None and b.measured_ci_high is not None
    assert b.measured_ci_low < b.measured_rate < b.measured_ci_high
    # The identity behind it: the speed-up scales with the mean length, so at the break-even it is minSpeedup.
    est = failing.speedup.estimate
    assert est is not None
    assert est * b.mean_length / acc.mean_length == pytest.approx(spec.analysis.min_speedup)
    assert b.acceptance_rate > b.measured_rate
    assert b.ci_low is not None and b.ci_high is not None and b.ci_low <= b.acceptance_rate <= b.ci_high
    dumped = failing.model_dump(by_alias=True, exclude_none=True)
    assert set(dumped["breakEven"]) >= {"acceptanceRate", "meanLength", "measuredRate", "reachable", "k"}
