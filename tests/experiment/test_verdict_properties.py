"""Properties of the paired comparison (hypothesis)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode.experiment import verdict

latency = st.floats(min_value=0.1, max_value=1e4, allow_nan=False, allow_infinity=False)
samples = st.integers(min_value=10, max_value=60).flatmap(
    lambda n: st.tuples(st.lists(latency, min_size=n, max_size=n), st.lists(latency, min_size=n, max_size=n))
)


@settings(max_examples=60, deadline=None)
@given(samples, st.booleans())
def test_interval_contains_the_estimate(pair: tuple[list[float], list[float]], seq: bool) -> None:
    v = verdict.compare(pair[0], pair[1], metric="tpot", min_speedup=1.1, sequential_ci=seq)
    assert v.ci is not None and v.effect is not None
    assert v.ci[0] <= v.effect * (1 + 1e-9) and v.effect <= v.ci[1] * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(samples, st.booleans())
def test_swapping_the_arms_inverts_the_ratio(pair: tuple[list[float], list[float]], seq: bool) -> None:
    # With sequential analysis the threshold decides which looks end the stage, so the statement is
    # equivariance: swapping the arms *and* inverting minSpeedup inverts the estimate and interval.
    a = verdict.compare(pair[0], pair[1], metric="tpot", min_speedup=1.1, sequential_ci=seq)
    b = verdict.compare(pair[1], pair[0], metric="tpot", min_speedup=1 / 1.1, sequential_ci=seq)
    assert a.effect is not None and b.effect is not None and a.ci is not None and b.ci is not None
    assert math.isclose(a.effect * b.effect, 1.0, rel_tol=1e-9)
    assert math.isclose(a.ci[0] * b.ci[1], 1.0, rel_tol=1e-9)
    assert math.isclose(a.ci[1] * b.ci[0], 1.0, rel_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(samples)
def test_pass_and_fail_are_never_both_possible(pair: tuple[list[float], list[float]]) -> None:
    v = verdict.compare(pair[0], pair[1], metric="tpot", min_speedup=1.1)
    assert v.ci is not None
    if v.label is verdict.Label.PASS:
        assert v.ci[0] >= 1.1 * (1 - 1e-12)
    if v.label is verdict.Label.FAIL:
        assert v.ci[1] < 1.1
