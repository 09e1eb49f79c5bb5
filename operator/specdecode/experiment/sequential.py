"""A group-sequential design with error spending for the mean of paired log-ratios (sequential stopping).

The load generator looks at a stage's results while it runs and may end the stage early. A fixed-
horizon interval checked after every few requests would be wrong far more often than its nominal
level (repeated looks inflate the error), so the boundaries here come from a *group-sequential
design* (Jennison & Turnbull, "Group Sequential Methods with Applications to Clinical Trials", 2000):

- Looks are *planned*: after every `look_every(horizon)` pairs of the stage (counted in request
  order), not before `first_look(concurrency)` pairs, and at the stage's last pair. They depend only
  on the stage's request bound and concurrency, never on the data, so the caller may evaluate the
  rule as often as it likes: it always sees the same looks.
- In a closed loop at concurrency C the first look waits for `MIN_WAVES` waves (MIN_WAVES·C pairs):
  the requests of one wave start together and share their server's moments (the batch filling and
  draining), so their pairs are not independent. `benchmarks/verdict/waves.py`: with one wave of 64
  at C = 64 the reported interval was 2.3x narrower than the run-to-run spread and the estimate
  biased (1.01x against 0.92x at five waves); at five waves the two agreed (ratio 0.93).
- The error is *spent* over the looks with the Hwang-Shih-DeCani function (γ = `GAMMA`), which spends
  most of it early, where a real speed-up is decided. The two-sided boundary c_k at look k is found
  by recursive numerical integration (J&T ch. 19) so that the probability of crossing at look k
  without having crossed before is exactly the error spent there. With unknown variance the
  boundary is carried to the t scale at each look (J&T §11.3).
- The intervals are *repeated confidence intervals* (J&T ch. 9): mean_k ± q_k · sd_k / √n_k. With
  probability ≥ `confidence` they cover the true mean at every planned look simultaneously, so
  stopping as soon as one clears `log(minSpeedup)` keeps the false-promotion rate below
  `(1 - confidence) / 2`. The stage's interval is the one of the look that decided it.
- Unlike inverted SPRTs, the intervals shrink like 1/√n and the last look's boundary is close to a
  fixed-horizon test's, so an effect between minSpeedup and the design's alternative still gets
  decided by the end of the stage.
- A stage that ends before its bound for a reason that is not the data (its duration elapsed, the
  run was interrupted) gets a final look at its last pair that spends all the remaining error.

The point estimate that goes with a stage's interval is `median_unbiased` at the deciding look
(stagewise ordering, J&T §8.4): the plain mean there is biased away from the threshold by the early
stop. `detectable` is the design's noise floor: the smallest mean it decides above the threshold
with a given probability at a given per-pair spread. Both integrate the same recursion as the
boundaries, with drift (`_beyond`).

There is no futility stop: a stage whose speed-up sits at minSpeedup runs to its bound (the Monte
Carlo study found that a rule "even the last look could not separate" never fires before the end
once intervals are taken at the deciding look, and any earlier stop costs power at effects just
above minSpeedup, which are the ones worth measuring).

`benchmarks/verdict` measures the error rates, the power and the requests used on heavy-tailed samples.

Invariants: pure numpy/scipy; inputs are finite arrays in a data-independent order (request index);
empty input gives empty output, never a warning; boundaries are cached per design.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from scipy import optimize, special, stats

FloatArray = npt.NDArray[np.float64]

#: no interval at all before this many pairs (a stage cut short below it has no data)
MIN_PAIRS = 10
#: the first planned look is never earlier: latency samples are heavy-tailed, and a t-interval on a
#: handful of pairs is where the Monte Carlo study saw its few wrong-way decisions
FIRST_LOOK = 20
#: in a closed loop, the first planned look waits for this many waves of the stage's concurrency
MIN_WAVES = 4
#: pairs between planned looks for small stages ...
LOOK_EVERY = 10
#: ... and at most this many planned looks for large ones
MAX_LOOKS = 25
#: Hwang-Shih-DeCani spending parameter (1 ≈ Pocock-like, 2 spends a little earlier still; -4 ≈
#: O'Brien-Fleming-like); chosen in benchmarks/verdict for the fewest requests at equal power
GAMMA = 2.0
#: a boundary this large means "no stopping at this look"
Z_MAX = 8.0
#: grid points of the numerical integration
GRID = 201
#: the pairs of a look are cut into at most this many contiguous blocks (in request order) for the
#: cluster-robust variance (`spread`): batch means, each block at least one sampling unit long
MAX_BLOCKS = 10

SQRT_2PI = math.sqrt(2.0 * math.pi)


def look_every(horizon: int) -> int:
    """Pairs between planned looks, for a stage of at most `horizon` pairs."""
    return max(LOOK_EVERY, math.ceil(horizon / MAX_LOOKS))


def first_look(concurrency: int | None = None) -> int:
    """The fewest pairs before a stage's first planned look: `FIRST_LOOK`, and in a closed loop at
    `concurrency` C at least `MIN_WAVES`·C (the module docstring). An open-loop stage: None."""
    return max(FIRST_LOOK, MIN_WAVES * (concurrency or 0))


def planned_looks(horizon: int, first: int = FIRST_LOOK) -> tuple[int, ...]:
    """The pair counts at which the design looks: every `look_every(horizon)` pairs from `first`
    (`first_look`) on, and at `horizon` (the only look when `first` is not below it)."""
    if horizon < 1:
        return ()
    every = look_every(horizon)
    start = every * math.ceil(max(first, FIRST_LOOK) / every)
    return (*range(start, horizon, every), horizon)


def spent(fraction: float, alpha: float, gamma: float | None = None) -> float:
    """Error spent (two-sided) by the information fraction `fraction` (Hwang-Shih-DeCani; γ = GAMMA)."""
    t = min(max(fraction, 0.0), 1.0)
    gamma = GAMMA if gamma is None else gamma
    if gamma == 0.0:
        return alpha * t
    return alpha * (1.0 - math.exp(-gamma * t)) / (1.0 - math.exp(-gamma))


def _simpson(n: int, h: float) -> FloatArray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    result: FloatArray = w * h / 3.0
    return result


def _excess(c: float, z: FloatArray, wf: FloatArray, a: float, b: float, s: float, target: float) -> float:
    """P(|Z_next| ≥ c, no earlier crossing) - target, for continuation density weights `wf` on grid `z`.

    Z_next·b = Z·a + N(0, s²) with a = √t_prev, b = √t, s = √(t - t_prev).
    """
    return 2.0 * float(np.dot(wf, special.ndtr((z * a - c * b) / s))) - target


@lru_cache(maxsize=512)
def z_bounds(fractions: tuple[float, ...], cumulative: tuple[float, ...]) -> tuple[float, ...]:
    """Two-sided boundaries c_k (z scale) for looks at `fractions` spending `cumulative` error in all.

    Under H0 (drift 0, unit variance per unit of information), the probability that |Z_k| ≥ c_k for
    the first time at look k equals cumulative[k] - cumulative[k-1]. Z_MAX marks a look that spends
    nothing. Recursive integration of the continuation density on a Simpson grid (J&T ch. 19).
    """
    out: list[float] = []
    z = np.zeros(0)
    f = np.zeros(0)
    w = np.zeros(0)
    prev_t, prev_cum = 0.0, 0.0
    for k, (t, cum) in enumerate(zip(fractions, cumulative, strict=True)):
        inc = cum - prev_cum
        a, b, s = math.sqrt(prev_t), math.sqrt(t), math.sqrt(t - prev_t)
        if k == 0:
            c = float(-special.ndtri(inc / 2.0)) if inc > 0.0 else Z_MAX
        else:
            args = (z, w * f, a, b, s, inc)
            if inc <= 0.0 or _excess(Z_MAX, *args) >= 0.0:
                c = Z_MAX
            elif _excess(0.0, *args) <= 0.0:
                c = 0.0
            else:
                c = float(optimize.brentq(_excess, 0.0, Z_MAX, args=args, xtol=1e-10))
        c = min(c, Z_MAX)
        out.append(c)
        new_z = np.linspace(-c, c, GRID)
        new_w = _simpson(GRID, (2.0 * c) / (GRID - 1))
        if k == 0:
            new_f = np.exp(-0.5 * new_z * new_z) / SQRT_2PI
        else:
            u = (new_z[:, None] * b - z[None, :] * a) / s
            kernel = np.exp(-0.5 * u * u) * (b / (s * SQRT_2PI))
            new_f = kernel @ (w * f)
        z, f, w = new_z, new_f, new_w
        prev_t, prev_cum = t, cum
    return tuple(out)


@dataclass(frozen=True)
class Design:
    """The looks of one stage and their boundaries on the t scale."""

    looks: tuple[int, ...]
    """Pairs at each look."""
    z: tuple[float, ...]
    """Two-sided boundaries on the z scale."""
    q: tuple[float, ...]
    """The same boundaries on the t scale (n_k - 1 degrees of freedom): the interval half-widths in sd/√n."""


@lru_cache(maxsize=512)
def design(horizon: int, *, alpha: float, final_at: int | None = None, first: int = FIRST_LOOK) -> Design:
    """The design of a stage of at most `horizon` pairs, at two-sided error `alpha`, its first look
    at `first` pairs or later (`first_look`).

    `final_at`: the stage ended after `final_at` < `horizon` pairs for a reason that is not the data;
    the looks are the planned ones before it plus a final one there, spending all remaining error.
    """
    planned = planned_looks(horizon, first)
    if final_at is not None and 0 < final_at < horizon:
        looks = (*(n for n in planned if n < final_at), final_at)
    else:
        looks = planned
    fractions = tuple(n / horizon for n in looks)
    cumulative = (*(spent(t, alpha) for t in fractions[:-1]), alpha)
    zs = z_bounds(fractions, cumulative)
    q = tuple(_t_scale(c, n) for c, n in zip(zs, looks, strict=True))
    return Design(looks, zs, q)


def _t_scale(c: float, n: int) -> float:
    if c >= Z_MAX or n < 2:
        return math.inf
    return float(stats.t.isf(stats.norm.sf(c), n - 1))


# ------------------------------------------------------------------------------- the sampling unit


def block_size(n: int, unit: int = 1) -> int:
    """Pairs per block of a look at `n` pairs: at least one sampling `unit` (a closed-loop wave, the
    requests in flight at once in an open loop) and at most `MAX_BLOCKS` blocks. A unit of one
    request (concurrency 1, an open loop with about one in flight) has no shared batches: every
    pair is its own block, and the intervals are the iid ones."""
    if unit <= 1:
        return 1
    return max(unit, math.ceil(n / MAX_BLOCKS))


def blocks_of(n: int, unit: int = 1) -> int:
    """Blocks of a look at `n` pairs (`block_size`); the last one takes the remainder."""
    return n // block_size(n, unit)


def cluster_se(x: FloatArray, n: int, unit: int = 1) -> FloatArray:
    """The standard error of the mean of the first `n` values of `x` (last axis) over contiguous blocks.

    The values are cut into G = `blocks_of(n, unit)` blocks (the last one takes the remainder) with
    residual sums r_g = S_g - n_g·m (S_g the block sums, n_g their sizes, m the mean). The variance
    is the cluster-robust (CR1) one, G/(G-1)·Σ r_g² / n², widened by the covariance of adjacent
    blocks with Bartlett's weight ½ (Newey-West at lag 1, never below CR1): consecutive
    closed-loop waves overlap in time (request i runs beside i ± C), so neighbouring blocks are
    not quite independent, while blocks two apart are. inf with fewer than 2 blocks. With blocks of
    one value and no lag-1 covariance it is the iid standard error."""
    b = block_size(n, unit)
    g = n // b
    shape = x.shape[:-1]
    if g < 2:
        return np.full(shape, np.inf)
    edges = np.asarray([*range(0, g * b, b), n])
    csum = np.concatenate([np.zeros((*shape, 1)), np.cumsum(x[..., :n], axis=-1)], axis=-1)
    sums = np.diff(csum[..., edges], axis=-1)
    sizes = np.diff(edges).astype(np.float64)
    resid = sums - sizes * (csum[..., n : n + 1] / n)
    squares = np.sum(resid * resid, axis=-1)
    lagged = np.sum(resid[..., 1:] * resid[..., :-1], axis=-1)
    out: FloatArray = np.sqrt(g / (g - 1) * (squares + np.maximum(lagged, 0.0))) / n
    return out


def pair_sd(x: FloatArray, unit: int = 1) -> float:
    """The per-pair standard deviation the pairs of `x` are worth: the sample one, or the
    cluster-robust standard error times √n when the blocks vary more than independent pairs would
    (the design effect of correlated pairs); inf with fewer than 2 blocks of `unit`."""
    x = np.asarray(x, dtype=np.float64)
    n = int(x.size)
    if n < 2:
        return math.nan
    sd = float(np.std(x, ddof=1))
    if block_size(n, unit) == 1:
        return sd
    return max(sd, float(cluster_se(x, n, unit)) * math.sqrt(n))


def spread(x: FloatArray, n: int, c: float, unit: int = 1) -> tuple[float, float]:
    """The standard error of the mean of `x[:n]` and its degrees of freedom, as a look with z-scale
    boundary `c` uses them: the iid one (n - 1 df) or the cluster-robust one (`cluster_se`, G - 1 df),
    whichever gives the wider interval."""
    x = np.asarray(x, dtype=np.float64)
    iid = float(np.std(x[:n], ddof=1)) / math.sqrt(n)
    robust = float(_robust_half(x, n, c, unit))
    if not math.isfinite(robust):
        return math.inf, 1.0
    if robust > _t_scale(c, n) * iid:
        return float(cluster_se(x, n, unit)), float(blocks_of(n, unit) - 1)
    return iid, float(n - 1)


def _robust_half(x: FloatArray, n: int, c: float, unit: int) -> FloatArray:
    """The cluster-robust half-width of a look at `n` pairs with z-scale boundary `c`: the boundary on
    the t scale of G - 1 degrees of freedom times `cluster_se`; inf when either is (fewer than 2
    blocks, a look that spends nothing)."""
    tq = _t_scale(c, blocks_of(n, unit))
    se = cluster_se(x, n, unit)
    if not math.isfinite(tq):
        return np.full(se.shape, np.inf)
    out: FloatArray = tq * se
    return out


@dataclass(frozen=True)
class LookBounds:
    """Per planned look: the estimate and the repeated confidence interval."""

    n: npt.NDArray[np.int64]
    """Pairs at each look."""
    mean: FloatArray
    """Mean after n pairs (last axis: looks)."""
    sd: FloatArray
    """Sample standard deviation after n pairs (ddof=1)."""
    low: FloatArray
    """Lower bound of the repeated confidence interval."""
    high: FloatArray
    """Upper bound of the repeated confidence interval."""


def look_bounds(x: FloatArray, d: Design, unit: int = 1) -> LookBounds:
    """The repeated confidence intervals of `x` at the looks of `d` that `x` has reached.

    `x` is 1-D, or 2-D with independent experiments in rows (the Monte Carlo study). `unit`: pairs
    per sampling unit (`block_size`). Each interval's half-width is the wider of the iid one
    (q_k · sd / √n_k, n_k - 1 df) and the cluster-robust one (the boundary on the t scale with
    G_k - 1 df times `cluster_se`): pairs that share engine batches are correlated, and an iid
    interval over them is too narrow (benchmarks/README.md, "Correlated pairs").
    """
    x = np.asarray(x, dtype=np.float64)
    n_obs = x.shape[-1]
    looks = np.asarray([n for n in d.looks if n <= n_obs and n >= MIN_PAIRS], dtype=np.int64)
    q = np.asarray([qq for n, qq in zip(d.looks, d.q, strict=True) if n <= n_obs and n >= MIN_PAIRS])
    shape = (*x.shape[:-1], looks.size)
    if looks.size == 0:
        empty = np.empty(shape)
        return LookBounds(looks, empty, empty, empty, empty)
    # Centre on the first value before accumulating squares (numerically stable enough here).
    centred = x - x[..., :1]
    s1 = np.cumsum(centred, axis=-1)[..., looks - 1]
    s2 = np.cumsum(centred * centred, axis=-1)[..., looks - 1]
    nn = looks.astype(np.float64)
    cmean = s1 / nn
    mean = cmean + x[..., :1]
    sd = np.sqrt(np.maximum(s2 - nn * cmean * cmean, 0.0) / (nn - 1.0))
    half = np.where(np.isinf(q), np.inf, q * sd / np.sqrt(nn))
    zs = [c for n, c in zip(d.looks, d.z, strict=True) if n <= n_obs and n >= MIN_PAIRS]
    for k, (n, c) in enumerate(zip(looks.tolist(), zs, strict=True)):
        if block_size(n, unit) > 1:
            half[..., k] = np.maximum(half[..., k], _robust_half(x, n, c, unit))
    return LookBounds(looks, mean, sd, mean - half, mean + half)


@dataclass(frozen=True)
class Look:
    """What the design says about a stage so far."""

    decided: bool
    """The stage can end now."""
    why: str
    """`above`, `below`, `undecided` or `too-few`."""
    n: int
    """Pairs at the look that decided (else at the last look reached)."""
    low: float
    """Lower bound of that look's repeated confidence interval (log scale)."""
    high: float
    """Upper bound of that look's repeated confidence interval (log scale)."""


def look(
    x: FloatArray,
    *,
    threshold: float,
    confidence: float,
    horizon: int,
    final: bool = False,
    first: int = FIRST_LOOK,
    unit: int = 1,
) -> Look:
    """Whether a stage whose paired log-ratios so far are `x` can stop, and its interval.

    Decided at the first planned look whose interval lies wholly above or below `threshold`, or at
    the stage's bound. `final`: the stage has ended (after `len(x)` pairs); if no planned look
    decided, a final look at `len(x)` spends the remaining error.
    """
    x = np.asarray(x, dtype=np.float64)
    n = int(x.size)
    horizon = max(horizon, n)
    alpha = 1.0 - confidence
    d = design(horizon, alpha=alpha, first=first)
    b = look_bounds(x, d, unit)
    if b.n.size:
        stop = (b.low > threshold) | (b.high < threshold)
        hit = np.flatnonzero(stop | (b.n >= horizon))
        if hit.size:
            # The stage ends at its first deciding look; its interval is that look's (pairs still in
            # flight at the stop only refine the point estimate).
            k = int(hit[0])
            low, high = float(b.low[k]), float(b.high[k])
            return Look(True, _side(low, high, threshold), int(b.n[k]), low, high)
    if final and n >= MIN_PAIRS and (not b.n.size or b.n[-1] < n):
        b = look_bounds(x, design(horizon, alpha=alpha, final_at=n, first=first), unit)
        low, high = float(b.low[-1]), float(b.high[-1])
        return Look(True, _side(low, high, threshold), n, low, high)
    if not b.n.size:
        return Look(False, "too-few", n, -math.inf, math.inf)
    return Look(False, "undecided", int(b.n[-1]), float(b.low[-1]), float(b.high[-1]))


def _side(low: float, high: float, threshold: float) -> str:
    return "above" if low > threshold else "below" if high < threshold else "undecided"


def repeated_p_value(
    x: FloatArray,
    *,
    threshold: float,
    confidence: float,
    horizon: int,
    upto: int,
    first: int = FIRST_LOOK,
    unit: int = 1,
) -> float:
    """The repeated p-value of "the mean equals `threshold`" at the looks up to `upto` pairs.

    The smallest two-sided error at which some repeated confidence interval of the design (same
    looks, same spending shape) excludes `threshold` (J&T §9.3); 1 when none would.
    """
    x = np.asarray(x, dtype=np.float64)[:upto]
    n = int(x.size)
    horizon = max(horizon, n)
    if n < MIN_PAIRS:
        return 1.0
    planned = planned_looks(horizon, first)
    final_at = None if n in planned else n

    def excluded(alpha: float) -> bool:
        b = look_bounds(x, design(horizon, alpha=alpha, final_at=final_at, first=first), unit)
        return bool(b.n.size) and bool(np.any((b.low > threshold) | (b.high < threshold)))

    if not excluded(1.0 - 1e-9):
        return 1.0
    lo, hi = -12.0, 0.0  # log10 alpha
    if excluded(10.0**lo):
        return float(10.0**lo)
    for _ in range(30):
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if excluded(10.0**mid) else (mid, hi)
        if hi - lo < 1e-4:
            break
    return float(10.0**hi)


# ---------------------------------------------------------------------------------- the point estimate


def _beyond(delta: float, fractions: tuple[float, ...], c: tuple[float, ...], z_obs: float) -> float:
    """P_δ(exit above at a look before the last one given, or reach it with Z ≥ `z_obs`).

    Z_j ~ N(δ·√t_j, 1) with independent increments of Z·√t (Brownian motion with drift δ at
    information t); two-sided boundaries ±c_j at every look before the last; the same recursive
    integration as `z_bounds`, with drift.
    """
    total = 0.0
    z = np.zeros(0)
    wf = np.zeros(0)
    prev_t = 0.0
    last = len(fractions) - 1
    for j, t in enumerate(fractions):
        x = z_obs if j == last else c[j]
        b, a, s = math.sqrt(t), math.sqrt(prev_t), math.sqrt(t - prev_t)
        if j == 0:
            total += float(special.ndtr(delta * b - x))
        else:
            total += float(np.dot(wf, special.ndtr((z * a + delta * s * s - x * b) / s)))
        if j == last:
            break
        new_z = np.linspace(-c[j], c[j], GRID)
        if j == 0:
            u = new_z - delta * b
            new_f = np.exp(-0.5 * u * u) / SQRT_2PI
        else:
            u = (new_z[:, None] * b - z[None, :] * a - delta * s * s) / s
            new_f = (np.exp(-0.5 * u * u) * (b / (s * SQRT_2PI))) @ wf
        z, wf = new_z, _simpson(GRID, (2.0 * c[j]) / (GRID - 1)) * new_f
        prev_t = t
    return total


def _z_looks(d: Design, horizon: int, upto: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Information fractions and z-scale boundaries of the looks of `d` that can stop a stage, up to
    `upto` pairs (looks before MIN_PAIRS never stop one: leaving them out is the same design)."""
    kept = [(n, min(c, Z_MAX)) for n, c in zip(d.looks, d.z, strict=True) if MIN_PAIRS <= n <= upto]
    return tuple(n / horizon for n, _ in kept), tuple(c for _, c in kept)


def median_unbiased(
    x: FloatArray,
    at: Look,
    *,
    threshold: float,
    confidence: float,
    horizon: int,
    first: int = FIRST_LOOK,
) -> float:
    """The median-unbiased estimate of the mean (log scale) at the look `at` that ended the stage.

    The mean of the pairs at a deciding look is biased away from `threshold`: a stage stops early
    exactly when its mean happens to lie far from it. Ordering the outcomes of the design
    stagewise (J&T §8.4: an exit above at an earlier look beats any later outcome, outcomes at the
    same look are ordered by their statistic, exits below at earlier looks rank lowest), the
    estimate is the mean μ at which the observed outcome is the median: P_μ(an outcome ranked at
    least as high) = 1/2. A stage that ended below is mirrored (x → -x), so only exits above are
    ever ranked. Computed on the z scale with the look's standard deviation taken as
    known (the t statistic is carried to z through its tail probability, as the boundaries are)
    and carried back to the t scale; the observed outcome is the one `look` reports. The spread is
    the pairs' own (iid): the ordering is the design's, and a cluster-robust spread chosen by the
    data would bias the estimate toward the threshold (`sequential_estimate` keeps it inside the
    interval, which is the cluster-robust one).

    `x`: the stage's paired log-ratios in request order; `at`: `look(x, ..., final=True)` of the
    same arguments. Returns the mean at `at` itself when it has no interval (too few pairs) or no
    spread.
    """
    x = np.asarray(x, dtype=np.float64)
    horizon = max(horizon, int(x.size))
    alpha = 1.0 - confidence
    d = design(horizon, alpha=alpha, first=first)
    if at.n not in d.looks:
        d = design(horizon, alpha=alpha, final_at=at.n, first=first)
    upto = x[: at.n]
    mean = float(np.mean(upto)) if upto.size else math.nan
    if upto.size < MIN_PAIRS or not math.isfinite(at.low) or not math.isfinite(at.high):
        return mean
    sd = float(np.std(upto, ddof=1))
    if sd == 0.0:
        return mean
    t_obs = (mean - threshold) / sd * math.sqrt(at.n)
    if t_obs < 0.0:
        # Mirror a stage that ended low: the same computation on -x keeps swapping the arms exactly
        # equivariant (and the ordering only ever ranks exits above).
        mirrored = Look(at.decided, at.why, at.n, -at.high, -at.low)
        return -median_unbiased(
            -x, mirrored, threshold=-threshold, confidence=confidence, horizon=horizon, first=first
        )
    df = at.n - 1
    se = sd / math.sqrt(at.n)
    fractions, bounds = _z_looks(d, horizon, at.n)
    z_obs = min(float(-special.ndtri(stats.t.sf(t_obs, df))), 4.0 * Z_MAX)
    root_t = math.sqrt(fractions[-1])

    def excess(delta: float) -> float:
        return _beyond(delta, fractions, bounds, z_obs) - 0.5

    lo, hi = (z_obs - 10.0) / root_t, (z_obs + 10.0) / root_t
    while excess(lo) > 0.0:
        lo -= 10.0 / root_t
    while excess(hi) < 0.0:
        hi += 10.0 / root_t
    delta = float(optimize.brentq(excess, lo, hi, xtol=1e-9))
    t_centre = float(stats.t.isf(special.ndtr(-delta * root_t), df))
    return threshold + t_centre * se


def detectable(
    sd: float,
    *,
    threshold: float,
    confidence: float,
    horizon: int,
    power: float = 0.9,
    first: int = FIRST_LOOK,
    unit: int = 1,
) -> float:
    """The smallest mean (log scale) a stage of `horizon` pairs with per-pair standard deviation `sd`
    decides above `threshold` with probability `power`: the design's noise floor.

    P(the first exit is above) under drift δ is the recursive integration of `_beyond` with the
    last look's boundary; δ is found by root-finding and carried back with `sd` taken as known
    (as the z-scale design does). inf when `sd` is not a positive finite number or the stage is
    too short for an interval. `unit`: pairs per sampling unit; with blocks (`block_size`) the last
    look's interval is on the t scale of its G - 1 degrees of freedom, and `sd` is widened by that
    scale's ratio to the z boundary.
    """
    if not math.isfinite(sd) or sd <= 0.0 or horizon < MIN_PAIRS:
        return math.inf
    if block_size(horizon, unit) > 1:
        c = design(horizon, alpha=1.0 - confidence, first=first).z[-1]
        sd *= _t_scale(c, blocks_of(horizon, unit)) / c
    return threshold + _detectable_drift(horizon, confidence, power, first) * sd / math.sqrt(horizon)


@lru_cache(maxsize=512)
def _detectable_drift(horizon: int, confidence: float, power: float, first: int) -> float:
    """`detectable`'s δ (z scale): it depends on the design alone, not on the data, so the root
    finding (~40% of a 200-pair stage's analysis CPU) runs once per design in the process."""
    fractions, bounds = _z_looks(design(horizon, alpha=1.0 - confidence, first=first), horizon, horizon)

    def shortfall(delta: float) -> float:
        return _beyond(delta, fractions, bounds, bounds[-1]) - power

    hi = 10.0
    while shortfall(hi) < 0.0:
        hi *= 2.0
    return float(optimize.brentq(shortfall, 0.0, hi, xtol=1e-9))
