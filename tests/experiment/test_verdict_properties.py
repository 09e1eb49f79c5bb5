"""Properties of the paired comparison (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode.experiment import comparison, sequential

latency = st.floats(min_value=0.1, max_value=1e4, allow_nan=False, allow_infinity=False)
samples = st.integers(min_value=10, max_value=60).flatmap(
    lambda n: st.tuples(st.lists(latency, min_size=n, max_size=n), st.lists(latency, min_size=n, max_size=n))
)


@settings(max_examples=60, deadline=None)
@given(samples, st.booleans())
def test_interval_contains_the_estimate(pair: tuple[list[float], list[float]], seq: bool) -> None:
    v = comparison.compare(pair[0], pair[1], metric="tpot", min_speedup=1.1, sequential_ci=seq)
    assert v.ci is not None and v.effect is not None
    assert v.ci[0] <= v.effect * (1 + 1e-9) and v.effect <= v.ci[1] * (1 + 1e-9)


@st.composite
def drifting(draw: st.DrawFn) -> tuple[list[float], list[float]]:
    """Pairs whose effect changes after the first `n1`: the pairs after a deciding look (still in
    flight at the stop) may then pull a mean of all pairs outside that look's interval."""
    n1, n2 = draw(st.integers(10, 60)), draw(st.integers(0, 80))
    effects = draw(st.tuples(st.floats(-0.7, 0.7), st.floats(-0.7, 0.7)))
    noise = draw(st.floats(0.01, 1.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    control = np.exp(rng.normal(2.0, 0.5, n1 + n2))
    shift = np.r_[np.full(n1, effects[0]), np.full(n2, effects[1])] + rng.normal(0.0, noise, n1 + n2)
    return control.tolist(), (control / np.exp(shift)).tolist()


@settings(max_examples=80, deadline=None)
@given(st.one_of(samples, drifting()), st.integers(min_value=0, max_value=200), st.floats(0.8, 1.5))
def test_the_sequential_estimate_lies_in_the_deciding_look_s_own_interval(
    pair: tuple[list[float], list[float]], extra: int, min_speedup: float
) -> None:
    # The interval is the repeated confidence interval of the look that decided, not widened to
    # reach an estimate made from other pairs; the estimate lies inside it.
    horizon = len(pair[0]) + extra
    v = comparison.compare(pair[0], pair[1], metric="tpot", min_speedup=min_speedup, horizon=horizon)
    d = comparison.log_ratios(pair[0], pair[1])
    at = sequential.look(d, threshold=math.log(min_speedup), confidence=0.95, horizon=horizon, final=True)
    assert v.ci is not None and v.effect is not None and v.decided_at == at.n
    assert v.ci == (math.exp(at.low), math.exp(at.high))
    assert at.low <= math.log(v.effect) <= at.high


@settings(max_examples=60, deadline=None)
@given(samples, st.booleans())
def test_swapping_the_arms_inverts_the_ratio(pair: tuple[list[float], list[float]], seq: bool) -> None:
    # With sequential analysis the threshold decides which looks end the stage, so the statement is
    # equivariance: swapping the arms *and* inverting minSpeedup inverts the estimate and interval.
    a = comparison.compare(pair[0], pair[1], metric="tpot", min_speedup=1.1, sequential_ci=seq)
    b = comparison.compare(pair[1], pair[0], metric="tpot", min_speedup=1 / 1.1, sequential_ci=seq)
    assert a.effect is not None and b.effect is not None and a.ci is not None and b.ci is not None
    assert math.isclose(a.effect * b.effect, 1.0, rel_tol=1e-9)
    assert math.isclose(a.ci[0] * b.ci[1], 1.0, rel_tol=1e-9)
    assert math.isclose(a.ci[1] * b.ci[0], 1.0, rel_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(samples)
def test_pass_and_fail_are_never_both_possible(pair: tuple[list[float], list[float]]) -> None:
    v = comparison.compare(pair[0], pair[1], metric="tpot", min_speedup=1.1)
    assert v.ci is not None
    if v.label is comparison.Label.PASS:
        assert v.ci[0] >= 1.1 * (1 - 1e-12)
    if v.label is comparison.Label.FAIL:
        assert v.ci[1] < 1.1
