"""Always-valid confidence sequences for the mean of paired log-ratios (sequential stopping).

The load generator looks at a stage's results while it runs and may end the stage early. A fixed-
horizon interval checked after every few requests would be wrong far more often than its nominal
level (repeated looks inflate the error), so the intervals here are *confidence sequences*: with
probability ≥ `confidence`, the true mean lies inside the interval at every look simultaneously,
however often one looks and whenever one stops (Ville's inequality). Stopping as soon as the
interval clears `log(minSpeedup)` therefore keeps the false-promotion rate below `(1 - confidence)`.

Method: the two-sided normal-mixture (Robbins) boundary with a plug-in standard deviation, the
asymptotic confidence sequence of Waudby-Smith, Arbour, Sinha, Kennedy and Ramdas, "Time-uniform
central limit theory and asymptotic confidence sequences" (2021, arXiv:2103.06476, eq. (13)):

    mean_t  ±  sd_t * sqrt( 2 (t ρ² + 1) / (t² ρ²) * log( sqrt(t ρ² + 1) / α ) )

ρ tunes where the boundary is tightest; ρ² = (-2 log α + log(-2 log α + 1)) / t* makes it tightest
near t* pairs. We take t* = max(20, horizon / 10): under a real speed-up the decision comes early,
which is where the saving matters. Because the guarantee holds at every t, the *running
intersection* of the intervals is valid too, and it makes decisions monotone: once the interval
excludes the threshold it never includes it again ("the decision can no longer change").

The guarantee is asymptotic (it uses the sample standard deviation), so no decision is taken before
`MIN_PAIRS` pairs; `benchmarks/verdict` measures the actual error rates on heavy-tailed samples.

Invariants: pure numpy; inputs are finite 1-D arrays in a data-independent order (request index);
empty input gives empty output, never a warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

#: no sequential decision, and no confidence sequence, before this many pairs
MIN_PAIRS = 10
#: the smallest t* (pairs at which the boundary is tightest)
MIN_T_STAR = 20


def t_star(horizon: int) -> float:
    """Where the boundary is tightest, for a stage of at most `horizon` pairs."""
    return float(max(MIN_T_STAR, horizon // 10))


def _rho2(alpha: float, tstar: float) -> float:
    return (-2.0 * math.log(alpha) + math.log(-2.0 * math.log(alpha) + 1.0)) / tstar


def half_width_factor(n: FloatArray | float, *, alpha: float, tstar: float) -> FloatArray:
    """The boundary's half-width per unit of standard deviation after `n` observations."""
    t = np.asarray(n, dtype=np.float64)
    r2 = _rho2(alpha, tstar)
    result: FloatArray = np.sqrt(2.0 * (t * r2 + 1.0) / (t * t * r2) * np.log(np.sqrt(t * r2 + 1.0) / alpha))
    return result


@dataclass(frozen=True)
class RunningBounds:
    """Running (intersected) confidence bounds after each prefix of the observations."""

    mean: FloatArray
    """Running mean after 1..n observations."""
    sd: FloatArray
    """Running sample standard deviation (ddof=1; 0 for one observation)."""
    low: FloatArray
    """Running-intersection lower bound (-inf before MIN_PAIRS)."""
    high: FloatArray
    """Running-intersection upper bound (+inf before MIN_PAIRS)."""


def confidence_sequence(x: FloatArray, *, confidence: float, horizon: int) -> RunningBounds:
    """The confidence sequence for the mean of `x`, at every prefix of `x` (along the last axis).

    `x` must be finite; a 2-D array holds independent experiments in rows (the Monte Carlo study).
    `horizon` is the most observations the stage can have (tunes t*).
    """
    x = np.asarray(x, dtype=np.float64)
    n_obs = x.shape[-1] if x.ndim else 0
    if n_obs == 0:
        empty = np.empty(x.shape, dtype=np.float64)
        return RunningBounds(empty, empty, empty, empty)
    alpha = 1.0 - confidence
    t = np.arange(1, n_obs + 1, dtype=np.float64)
    mean = np.cumsum(x, axis=-1) / t
    # Centre on the first value before accumulating squares (numerically stable enough here).
    centred = x - x[..., :1]
    cmean = np.cumsum(centred, axis=-1) / t
    ss = np.cumsum(centred * centred, axis=-1) - t * cmean * cmean
    var = np.maximum(ss, 0.0) / np.maximum(t - 1.0, 1.0)
    sd = np.sqrt(var)
    width = sd * half_width_factor(t, alpha=alpha, tstar=t_star(max(horizon, n_obs)))
    low = mean - width
    high = mean + width
    early = t < MIN_PAIRS
    low[..., early] = -np.inf
    high[..., early] = np.inf
    return RunningBounds(mean, sd, np.maximum.accumulate(low, axis=-1), np.minimum.accumulate(high, axis=-1))


def futile(
    low: FloatArray, high: FloatArray, sd: FloatArray, *, threshold: float, confidence: float, horizon: int
) -> npt.NDArray[np.bool_]:
    """Whether even the interval at `horizon` (with today's sd) could not separate from `threshold`
    for any effect inside today's interval [low, high]."""
    final_width = sd * half_width_factor(float(horizon), alpha=1.0 - confidence, tstar=t_star(horizon))
    result: npt.NDArray[np.bool_] = (threshold - final_width < low) & (high < threshold + final_width)
    return result


@dataclass(frozen=True)
class Look:
    """What one look at a stage says."""

    decided: bool
    """The stage can end now."""
    why: str
    """`above`, `below`, `futile` or `undecided` (or `too-few`)."""
    n: int
    """Observations used."""
    low: float
    """Current lower bound (log scale)."""
    high: float
    """Current upper bound (log scale)."""


def look(x: FloatArray, *, threshold: float, confidence: float, horizon: int, futility: bool = True) -> Look:
    """Whether a stage whose paired log-ratios so far are `x` can stop.

    Decided when the running interval lies wholly above or below `threshold` (final: the running
    intersection never widens), or, with `futility`, when even the interval the stage would have at
    `horizon` (with today's standard deviation) could not separate from the threshold for any effect
    the data still allow. Futility only ever ends a stage *without* a decision, so it cannot raise
    false promotions; it costs a little power, measured in `benchmarks/verdict`.
    """
    seq = confidence_sequence(x, confidence=confidence, horizon=horizon)
    n = int(seq.mean.size)
    if n < MIN_PAIRS:
        return Look(False, "too-few", n, -math.inf, math.inf)
    low, high = float(seq.low[-1]), float(seq.high[-1])
    if low > threshold:
        return Look(True, "above", n, low, high)
    if high < threshold:
        return Look(True, "below", n, low, high)
    if n >= horizon:
        return Look(True, "undecided", n, low, high)
    if futility:
        final_width = float(
            seq.sd[-1] * half_width_factor(float(horizon), alpha=1.0 - confidence, tstar=t_star(horizon))
        )
        if threshold - final_width < low and high < threshold + final_width:
            return Look(True, "futile", n, low, high)
    return Look(False, "undecided", n, low, high)


def anytime_p_value(x: FloatArray, *, threshold: float, confidence: float, horizon: int) -> float:
    """Anytime-valid p-value of "the mean equals `threshold`": 1 / the largest mixture martingale value.

    The same normal mixture as the confidence sequence (the interval excludes `threshold` exactly
    when this p-value is below 1 - confidence, at some look), with the plug-in variance.
    """
    x = np.asarray(x, dtype=np.float64)
    n_obs = x.size
    if n_obs < MIN_PAIRS:
        return 1.0
    seq = confidence_sequence(x, confidence=confidence, horizon=horizon)
    t = np.arange(1, n_obs + 1, dtype=np.float64)
    r2 = _rho2(1.0 - confidence, t_star(max(horizon, n_obs)))
    s = (seq.mean - threshold) * t
    var = np.maximum(seq.sd * seq.sd, 1e-300)
    log_m = -0.5 * np.log1p(r2 * t) + r2 * (s * s / var) / (2.0 * (1.0 + r2 * t))
    log_m = log_m[MIN_PAIRS - 1 :]
    return float(min(1.0, math.exp(-float(np.max(log_m))))) if log_m.size else 1.0
