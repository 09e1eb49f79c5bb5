"""Sequential stopping of a stage: a pair of SPRTs on the paired log-ratios, and their confidence sequence.

The load generator looks at a stage's results while it runs and may end the stage early. A fixed-
horizon interval checked after every few requests would be wrong far more often than its nominal
level (repeated looks inflate the error), so the decision here is a sequential test whose error
guarantee holds however the looks fall.

Method (issue 5 asks for few requests at a real speed-up *and* a false-promote rate ≤ 1 - confidence):
the paired log-ratios d_i have mean μ (speed-up = exp μ) and sd σ; θ0 = log(minSpeedup); δ = log
`DESIGN_RATIO` (the speed-up we want to confirm fast is 1.2 × minSpeedup, the power target of issue
5). Two one-sided sequential probability ratio tests (Wald), with α = (1 - confidence) / 2 each:
- promote: H0 μ ≤ θ0 against μ = θ0 + δ; stop and Pass when the log likelihood ratio
  ℓ⁺ = δ √V z - δ² V / 2 ≥ log(1/α) - c, with V = n / σ̂² (the information) and z the t statistic of
  θ0 mapped to the normal scale through its t(n-1) tail probability (J&T §3.8: the plug-in σ̂ is
  noisy at small n, and without the mapping the rule promotes too often there);
- fail: the mirror, H0 μ ≥ θ0 against μ = θ0 - δ.
With known σ and continuous monitoring exp(ℓ⁺) is a nonnegative supermartingale under H0, so Ville's
inequality bounds the false-promote probability by α under any stopping rule. Looks are discrete,
so the boundary is pulled in by Siegmund's correction c = ρ δ √ΔV (ρ = `SIEGMUND_RHO`, ΔV the
information between analysis points): the "Christmas tree" correction of Whitehead, *The Design and
Analysis of Sequential Clinical Trials* (1997) §4.2, which keeps the error at its continuous-
monitoring value. We use ρ = 0.5 instead of the asymptotic 0.583, a hedge for the plug-in σ̂ and
heavy tails measured in `benchmarks/verdict`.

Analysis points. The rule acts only at n ∈ {10, 15, 20, …} (`MIN_PAIRS` + k · `LOOK_EVERY`) and at
the stage's bound `horizon`. A look between two points sees the last point (the newer pairs wait for
the next one), so the load generator may look at *any* time, as often as it likes: whatever it does
is a subset of the analysis points, and the guarantee is the one for all of them. (Evaluating the
corrected boundary at every pair would not be covered.)

Futility (non-binding): the stage ends without a decision when both likelihood ratios favour θ0 by
1 / `FUTILITY_RATIO` (ℓ⁺ and ℓ⁻ ≤ log `FUTILITY_RATIO`): the data say the speed-up is near
minSpeedup, neither confirmable nor refutable soon. It only ever stops *without* promoting and the
promote boundary is computed as if it did not exist, so ignoring it cannot raise false promotions.

Interval. Inverting the tests for every θ gives the confidence sequence mean ± q σ̂ / √n, with q the
t(n-1) quantile of the normal tail beyond b = (log(1/α) - c) / (δ √V) + δ √V / 2; it covers μ at
every analysis point simultaneously with probability ≈ ≥ 1 - 2α, so its running intersection is valid
at whatever point the stage stopped, and Pass ⇔ its lower bound ≥ minSpeedup ⇔ the promote test
stopped. Its half-width never falls below ≈ δ/2 (it is tuned to decide fast near the design effect,
not to be short after very many pairs).

The guarantee is asymptotic (plug-in σ̂), so no decision is taken before `MIN_PAIRS` pairs;
`benchmarks/verdict` measures the actual error rates and the interval's coverage at the stopping
time on heavy-tailed samples.

Invariants: pure numpy/scipy; inputs are finite arrays in a data-independent order (request index)
along the last axis; empty input gives empty output, never a warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: no sequential decision, and no confidence sequence, before this many pairs (the first analysis point)
MIN_PAIRS = 10
#: pairs between analysis points
LOOK_EVERY = 5
#: the design alternative: the speed-up confirmed fast is DESIGN_RATIO × minSpeedup
DESIGN_RATIO = 1.2
#: futility: both likelihood ratios favour "speed-up = minSpeedup" by 1 / this (non-binding)
FUTILITY_RATIO = 0.05
#: Siegmund's discrete-monitoring correction (asymptotic value 0.583; smaller is more conservative)
SIEGMUND_RHO = 0.5

_DELTA = math.log(DESIGN_RATIO)


def analysis_points(n_obs: int, horizon: int) -> BoolArray:
    """Which prefixes 1..n_obs are analysis points, for a stage of at most `horizon` pairs."""
    t = np.arange(1, n_obs + 1)
    result: BoolArray = ((t >= MIN_PAIRS) & ((t - MIN_PAIRS) % LOOK_EVERY == 0)) | (t == horizon)
    return result


def _gaps(points: BoolArray) -> FloatArray:
    """Pairs since the previous analysis point (LOOK_EVERY for the first), at each prefix."""
    idx = np.flatnonzero(points) + 1
    gaps = np.full(points.shape, float(LOOK_EVERY))
    if idx.size > 1:
        gaps[idx[1:] - 1] = np.minimum(np.diff(idx), LOOK_EVERY)
    return gaps


@dataclass(frozen=True)
class RunningBounds:
    """Running (intersected) confidence bounds after each prefix of the observations."""

    mean: FloatArray
    """Running mean after 1..n observations."""
    sd: FloatArray
    """Running sample standard deviation (ddof=1; 0 for one observation)."""
    low: FloatArray
    """Running-intersection lower bound over the analysis points so far (-inf before the first)."""
    high: FloatArray
    """Running-intersection upper bound (+inf before the first analysis point)."""


def _running(x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(n, running mean, running sd) along the last axis."""
    n_obs = x.shape[-1]
    t = np.arange(1, n_obs + 1, dtype=np.float64)
    mean = np.cumsum(x, axis=-1) / t
    # Centre on the first value before accumulating squares (numerically stable enough here).
    centred = x - x[..., :1]
    cmean = np.cumsum(centred, axis=-1) / t
    ss = np.cumsum(centred * centred, axis=-1) - t * cmean * cmean
    sd = np.sqrt(np.maximum(ss, 0.0) / np.maximum(t - 1.0, 1.0))
    return t, mean, sd


def _alpha(confidence: float) -> float:
    return (1.0 - confidence) / 2.0


def _half_width(t: FloatArray, sd: FloatArray, gaps: FloatArray, *, alpha: float) -> FloatArray:
    """Half-width of the inverted tests at each prefix (δ/2 when sd is 0, the limit of the normal case)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        root_v = np.sqrt(t) / sd
        b = math.log(1.0 / alpha) / (_DELTA * root_v) + _DELTA * root_v / 2.0
        b = b - SIEGMUND_RHO * np.sqrt(gaps / t)
        tail = stats.norm.sf(b)
        q = np.where(tail > 0.0, stats.t.isf(tail, np.maximum(t - 1.0, 1.0)), b)
        width: FloatArray = np.where(sd > 0.0, q * sd / np.sqrt(t), _DELTA / 2.0)
    return width


def confidence_sequence(x: FloatArray, *, confidence: float, horizon: int) -> RunningBounds:
    """The confidence sequence for the mean of `x`, at every prefix of `x` (along the last axis).

    `x` must be finite; a 2-D array holds independent experiments in rows (the Monte Carlo study).
    `horizon` is the most observations the stage can have (its last analysis point).
    """
    x = np.asarray(x, dtype=np.float64)
    n_obs = x.shape[-1] if x.ndim else 0
    if n_obs == 0:
        empty = np.empty(x.shape, dtype=np.float64)
        return RunningBounds(empty, empty, empty, empty)
    points = analysis_points(n_obs, horizon)
    t, mean, sd = _running(x)
    width = _half_width(t, sd, _gaps(points), alpha=_alpha(confidence))
    low = np.where(points, mean - width, -np.inf)
    high = np.where(points, mean + width, np.inf)
    return RunningBounds(mean, sd, np.maximum.accumulate(low, axis=-1), np.minimum.accumulate(high, axis=-1))


def _log_ratios(
    x: FloatArray, *, threshold: float, horizon: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(ℓ⁺, ℓ⁻, c) at every prefix: the two log likelihood ratios and the discrete-look correction."""
    n_obs = x.shape[-1]
    t, mean, sd = _running(x)
    gaps = _gaps(analysis_points(n_obs, horizon))
    with np.errstate(divide="ignore", invalid="ignore"):
        root_v = np.sqrt(t) / sd
        tstat = (mean - threshold) * root_v
        df = np.maximum(t - 1.0, 1.0)
        z = np.where(
            tstat > 0.0, stats.norm.isf(stats.t.sf(tstat, df)), stats.norm.ppf(stats.t.cdf(tstat, df))
        )
        up = _DELTA * root_v * z - _DELTA**2 * root_v**2 / 2.0
        down = -_DELTA * root_v * z - _DELTA**2 * root_v**2 / 2.0
        corr = SIEGMUND_RHO * _DELTA * np.sqrt(gaps) / sd
    # No spread (ties): the limit of the normal case, the interval mean ± δ/2.
    flat = sd == 0.0
    up = np.where(flat, np.where(mean - threshold > _DELTA / 2.0, np.inf, -np.inf), up)
    down = np.where(flat, np.where(threshold - mean > _DELTA / 2.0, np.inf, -np.inf), down)
    corr = np.where(flat, 0.0, corr)
    return up, down, corr


@dataclass(frozen=True)
class Stops:
    """Per prefix (along the last axis): what the rule says at that analysis point (False elsewhere)."""

    above: BoolArray
    """The promote test stopped: the interval lies above the threshold (Pass)."""
    below: BoolArray
    """The fail test stopped: the interval lies below the threshold (Fail)."""
    futile: BoolArray
    """Both likelihood ratios favour the threshold itself (end without a decision)."""
    points: BoolArray
    """The analysis points."""


def stops(x: FloatArray, *, threshold: float, confidence: float, horizon: int) -> Stops:
    """The rule at every prefix of `x` (1-D, or 2-D with experiments in rows); vectorised for the study."""
    x = np.asarray(x, dtype=np.float64)
    n_obs = x.shape[-1] if x.ndim else 0
    points = analysis_points(n_obs, horizon)
    if n_obs == 0:
        none = np.zeros(x.shape, dtype=np.bool_)
        return Stops(none, none, none, points)
    seq = confidence_sequence(x, confidence=confidence, horizon=horizon)
    up, down, corr = _log_ratios(x, threshold=threshold, horizon=horizon)
    # Pass/Fail are read off the interval (the same inequality as ℓ± ≥ log(1/α) - c, running).
    above = (seq.low >= threshold) & points & np.isfinite(seq.low)
    below = (seq.high < threshold) & points & np.isfinite(seq.high)
    limit = math.log(FUTILITY_RATIO)
    futile = (up <= limit + corr) & (down <= limit + corr) & points
    return Stops(above, below, futile, points)


@dataclass(frozen=True)
class Look:
    """What one look at a stage says."""

    decided: bool
    """The stage can end now."""
    why: str
    """`above`, `below`, `futile` or `undecided` (or `too-few`)."""
    n: int
    """Observations used (the last analysis point)."""
    low: float
    """Current lower bound (log scale)."""
    high: float
    """Current upper bound (log scale)."""


def look(x: FloatArray, *, threshold: float, confidence: float, horizon: int, futility: bool = True) -> Look:
    """Whether a stage whose paired log-ratios so far are `x` can stop (at the last analysis point).

    Decided when the running interval lies wholly at/above or below `threshold` (final: the running
    intersection never widens), at `horizon`, or, with `futility`, when both likelihood ratios favour
    the threshold itself by 1 / FUTILITY_RATIO (ends without a decision; cannot raise false promotions).
    """
    x = np.asarray(x, dtype=np.float64)
    points = np.flatnonzero(analysis_points(int(x.size), horizon)) + 1
    if points.size == 0:
        return Look(False, "too-few", int(x.size), -math.inf, math.inf)
    n = int(points[-1])
    x = x[:n]
    seq = confidence_sequence(x, confidence=confidence, horizon=horizon)
    low, high = float(seq.low[-1]), float(seq.high[-1])
    if low >= threshold:
        return Look(True, "above", n, low, high)
    if high < threshold:
        return Look(True, "below", n, low, high)
    if n >= horizon:
        return Look(True, "undecided", n, low, high)
    if futility and bool(stops(x, threshold=threshold, confidence=confidence, horizon=horizon).futile[-1]):
        return Look(True, "futile", n, low, high)
    return Look(False, "undecided", n, low, high)


def anytime_p_value(x: FloatArray, *, threshold: float, confidence: float, horizon: int) -> float:
    """Anytime-valid two-sided p-value of "the mean equals `threshold`" over the analysis points so far.

    2 · exp(-max(ℓ⁺ + c, ℓ⁻ + c)) over the points, capped at 1: below 1 - confidence exactly when
    the confidence sequence at `confidence` excludes `threshold`. It does not depend on
    `confidence` (kept in the signature for symmetry with the interval).
    """
    del confidence
    x = np.asarray(x, dtype=np.float64)
    points = analysis_points(int(x.size), horizon)
    if not points.any():
        return 1.0
    up, down, corr = _log_ratios(x, threshold=threshold, horizon=horizon)
    best = float(np.max(np.maximum(up, down)[points] + corr[points]))
    # Capping the exponent at log 2 keeps exp finite and the p-value at most 1 (NaN: no evidence).
    return float(2.0 * math.exp(-max(best, math.log(2.0)))) if best == best else 1.0
