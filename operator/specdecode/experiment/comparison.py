"""Paired comparisons of the two arms: the speed-up with its interval, tails, proportions.

Pure: numpy/scipy on paired arrays in, `MetricVerdict`s and interval tuples out. `verdict.py` applies
them per stage; `guardrails.py` and `noisefloor.py` reuse the intervals.

Speed-up (per stage, primary metric). Request i of a stage went to both arms with the same prompt at
the same time, so the natural unit is the pair: d_i = log(control_i / treatment_i) for latencies
(tpot, e2e, ttft), log(treatment_i / control_i) for throughput (output tokens / E2E of the request).
The speed-up is exp(mean d): the geometric mean of the per-request ratios. Per-prompt heterogeneity
(long prompts are slow in both arms) cancels in the ratio, the log makes it scale-free and symmetric
(swapping the arms inverts it exactly), and heavy right tails are tamed. Its interval:
- `analysis.sequential: true` (default): the repeated confidence interval of the group-sequential
  design in `sequential.py` (looks planned from the stage's request bound, error spent over them),
  at the configured confidence, taken at the look that decided the stage. The load generator may
  have stopped the stage early on the same design (`stage_decided`); the interval stays valid.
  The point estimate is the median-unbiased one at that look (stagewise ordering,
  `sequential.median_unbiased`), which lies inside the interval: the plain mean there overshoots,
  since a stage stops early when its mean happens to lie far from minSpeedup. Pairs that finished
  after the deciding look (in flight at the stop) enter neither: a mean over them sat on or
  outside the interval's end (issue 14: `c4: 1.198 [1.198, 1.438]`).
- `sequential: false`: the paired t interval on d (exact under normal d, robust by the CLT at the
  hundreds of pairs a stage has; the Monte Carlo study checks coverage on heavy-tailed samples).
Tails (p50, p90, p99 of each arm, their ratio) get paired-bootstrap percentile intervals; they are
reported, not decisive: quantile ratios of a few hundred requests are too noisy to gate on (p99).
The bootstrap resamples the stage's sampling unit (`pairing.sampling_unit`): pairs of one wave share
engine batches, so with a unit of L pairs it draws circular blocks of L consecutive pairs (Politis &
Romano's circular block bootstrap), as the speed-up's interval is cluster-robust over blocks of L
(issue 35 item 1); L = 1 is the plain paired bootstrap, draw for draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

from specdecode.experiment import sequential
from specdecode.experiment.status import (
    QuantileSpeedup,
)

FloatArray = npt.NDArray[np.float64]


#: fewest pairs for a fixed-horizon interval (the sequential one needs sequential.MIN_PAIRS)
MIN_PAIRS_FIXED = 3
#: bootstrap resamples for quantile ratios
BOOTSTRAP_RESAMPLES = 2000
#: quantiles compared between the arms
TAIL_QUANTILES = (0.5, 0.9, 0.99)
#: the power at which `min_detectable` reports the smallest speed-up a stage could show
DETECTABLE_POWER = 0.9


class Label(StrEnum):
    """The outcome of one comparison (`compare`)."""

    PASS = "Pass"
    """The interval lies at or above the threshold."""
    FAIL = "Fail"
    """The interval lies below the threshold."""
    INCONCLUSIVE = "Inconclusive"
    """The interval straddles the threshold."""
    NO_DATA = "NoData"
    """Too few valid pairs to say anything."""


@dataclass(frozen=True)
class MetricVerdict:
    """One paired comparison: the speed-up `effect` with its interval `ci`, and what it says."""

    label: Label
    effect: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    n: int
    reason: str
    method: str
    decided_at: int | None = None
    """Pairs at the sequential look that decided (estimate and interval use those); None: all `n`."""
    detectable: float | None = None
    """The smallest speed-up this design promotes with probability `DETECTABLE_POWER` at the noise measured."""


def log_ratios(
    baseline: Sequence[float] | FloatArray,
    candidate: Sequence[float] | FloatArray,
    *,
    higher_is_better: bool = False,
) -> FloatArray:
    """Per-pair log speed-ups; pairs where either value is missing, NaN, infinite or ≤ 0 are dropped."""
    b = np.asarray(baseline, dtype=np.float64)
    c = np.asarray(candidate, dtype=np.float64)
    if b.shape != c.shape:
        raise ValueError(f"paired samples differ in length: {b.shape} vs {c.shape}")
    keep = np.isfinite(b) & np.isfinite(c) & (b > 0) & (c > 0)
    d: FloatArray = np.log(c[keep] / b[keep]) if higher_is_better else np.log(b[keep] / c[keep])
    return d


def _apart(below: float, limit: float) -> tuple[str, str]:
    """`below` < `limit` written at a precision that shows it: 3 decimals, more while they round alike
    (an upper bound of 1.0498 against minSpeedup 1.05 reads `1.0498 < 1.0500`, not `1.050 < 1.05`)."""
    for decimals in range(3, 10):
        shown, line = f"{below:.{decimals}f}", f"{limit:.{decimals}f}"
        if shown != line:  # at 3 decimals the limit reads as written (`1.05`); beyond, as precise
            return shown, f"{limit:g}" if decimals == 3 else line
    return repr(below), repr(limit)


def compare(
    baseline: Sequence[float] | FloatArray,
    candidate: Sequence[float] | FloatArray,
    *,
    metric: str,
    min_speedup: float,
    confidence: float = 0.95,
    sequential_ci: bool = True,
    horizon: int | None = None,
    higher_is_better: bool = False,
    first_look: int = sequential.FIRST_LOOK,
    unit: int = 1,
) -> MetricVerdict:
    """Speed-up of `candidate` (treatment) over `baseline` (control), pair by pair.

    `baseline[i]` and `candidate[i]` are the same request in both arms. Latencies: speed-up is
    baseline / candidate; with `higher_is_better` (throughput) candidate / baseline. `horizon` is
    the most pairs the stage could have had and `first_look` the fewest before its first look
    (`sequential.first_look` of its concurrency): they set the sequential design's looks. `unit`
    is the stage's sampling unit in pairs (`sampling_unit`): every interval is the wider of the iid
    one and the cluster-robust one over blocks of at least `unit` pairs.
    """
    d = log_ratios(baseline, candidate, higher_is_better=higher_is_better)
    n = int(d.size)
    threshold = math.log(min_speedup)
    method = "groupSequential" if sequential_ci else "pairedT"
    need = sequential.MIN_PAIRS if sequential_ci else MIN_PAIRS_FIXED
    if n == 0:
        return MetricVerdict(Label.NO_DATA, None, None, None, 0, f"no valid {metric} pairs", method)
    mean = float(np.mean(d))
    short = _too_few(n, need, unit)
    if short is not None:
        return MetricVerdict(
            Label.NO_DATA, math.exp(mean), None, None, n, f"{n} valid {metric} pairs, {short}", method
        )
    decided_at: int | None = None
    if sequential_ci:
        h = max(horizon or n, n)
        at = sequential.look(
            d, threshold=threshold, confidence=confidence, horizon=h, final=True, first=first_look, unit=unit
        )
        # Estimate and interval both come from the look that decided the stage: pairs that finished
        # after it (in flight at the stop) would move a mean outside that look's interval.
        low, high, decided_at = at.low, at.high, at.n
        mean = sequential_estimate(
            d, at, threshold=threshold, confidence=confidence, horizon=h, first=first_look
        )
        p = sequential.repeated_p_value(
            d,
            threshold=threshold,
            confidence=confidence,
            horizon=h,
            upto=at.n,
            first=first_look,
            unit=unit,
        )
    else:
        mean, low, high, p = paired_t(d, threshold=threshold, confidence=confidence, unit=unit)
    ci = (math.exp(low), math.exp(high))
    if low >= threshold:
        label, why = Label.PASS, f"lower bound {ci[0]:.3f} ≥ {min_speedup:g}"
    elif high < threshold:
        label, why = Label.FAIL, "upper bound {} < {}".format(*_apart(ci[1], min_speedup))
    else:
        label, why = Label.INCONCLUSIVE, f"interval [{ci[0]:.3f}, {ci[1]:.3f}] contains {min_speedup:g}"
    floor = min_detectable(
        d,
        threshold=threshold,
        confidence=confidence,
        horizon=horizon,
        sequential_ci=sequential_ci,
        first_look=first_look,
        unit=unit,
    )
    return MetricVerdict(label, math.exp(mean), ci, p, n, f"{metric} {why}", method, decided_at, floor)


def _too_few(n: int, need: int, unit: int) -> str | None:
    """Why `n` pairs get no interval (fewer than `need`, or fewer than two sampling units of `unit`), or None."""
    if n < need:
        return f"fewer than {need}"
    if sequential.blocks_of(n, unit) < 2:
        return f"fewer than two sampling units of {unit} (waves or requests in flight)"
    return None


def paired_t(
    d: FloatArray, *, threshold: float, confidence: float, unit: int = 1
) -> tuple[float, float, float, float]:
    """The fixed-horizon interval of the mean of `d` (log scale): mean, low, high and the one-sided
    p-value of "mean ≤ threshold". The wider of the paired t interval (n - 1 df) and the
    cluster-robust one over blocks of at least `unit` pairs (`sequential.cluster_se`, G - 1 df)."""
    n = int(d.size)
    mean = float(np.mean(d))
    z = float(stats.norm.ppf(0.5 + confidence / 2.0))
    se, df = sequential.spread(d, n, z, unit)
    if se == 0.0:
        return mean, mean, mean, 0.0 if mean > threshold else 1.0
    if not math.isfinite(se):
        return mean, -math.inf, math.inf, 1.0
    crit = float(stats.t.ppf(0.5 + confidence / 2.0, df))
    return mean, mean - crit * se, mean + crit * se, float(stats.t.sf((mean - threshold) / se, df))


def min_detectable(
    d: FloatArray,
    *,
    threshold: float,
    confidence: float,
    horizon: int | None,
    sequential_ci: bool,
    first_look: int = sequential.FIRST_LOOK,
    unit: int = 1,
) -> float | None:
    """The noise floor of a stage: the smallest speed-up its design promotes with probability
    `DETECTABLE_POWER`, at the standard deviation of its paired log-ratios taken as the truth.

    Sequential: the group-sequential design over the stage's request bound (`sequential.detectable`);
    fixed horizon: the paired t test on the pairs that ran. A speed-up below it was unlikely to be
    shown at this load, whatever its size: measure more requests, or accept a lower minSpeedup.
    None without spread (ties) or with too few pairs. The spread is the one the pairs are worth
    (`sequential.pair_sd` over blocks of `unit` pairs): correlated pairs carry less information.
    """
    n = int(d.size)
    if n < 3:
        return None
    sd = sequential.pair_sd(d, unit)
    if not math.isfinite(sd) or sd == 0.0:
        return None
    if sequential_ci:
        h = max(horizon or n, n)
        floor = sequential.detectable(
            sd,
            threshold=threshold,
            confidence=confidence,
            horizon=h,
            power=DETECTABLE_POWER,
            first=first_look,
            unit=unit,
        )
        return math.exp(floor) if math.isfinite(floor) else None
    crit = float(stats.t.ppf(0.5 + confidence / 2.0, n - 1) + stats.t.ppf(DETECTABLE_POWER, n - 1))
    return math.exp(threshold + crit * sd / math.sqrt(n))


def sequential_estimate(
    d: FloatArray,
    at: sequential.Look,
    *,
    threshold: float,
    confidence: float,
    horizon: int,
    first: int = sequential.FIRST_LOOK,
) -> float:
    """The point estimate (log scale) that goes with the repeated confidence interval of `at`.

    The median-unbiased estimate at the deciding look (`sequential.median_unbiased`): the naive
    mean there is biased away from minSpeedup, because a stage stops early exactly when its mean
    happens to lie far from it. It lies inside the interval (the interval is wider than the
    stagewise one around it); where it would not (a statistic that jumped far past the boundary
    between two looks, which the stagewise ordering cannot rank above earlier exits), or cannot be
    computed, the interval's own centre (the mean at the look) is reported instead.
    """
    centre = float(np.mean(d[: at.n]))
    estimate = sequential.median_unbiased(
        d, at, threshold=threshold, confidence=confidence, horizon=horizon, first=first
    )
    if math.isfinite(estimate) and at.low <= estimate <= at.high:
        return estimate
    return centre


def quantile_speedups(
    baseline: FloatArray,
    candidate: FloatArray,
    *,
    metric: str,
    confidence: float,
    rng: np.random.Generator,
    quantiles: Sequence[float] = TAIL_QUANTILES,
    higher_is_better: bool = False,
    unit: int = 1,
) -> list[QuantileSpeedup]:
    """Quantile ratios (control quantile / treatment quantile for latencies) with paired-bootstrap
    intervals, resampling blocks of `unit` consecutive pairs (the stage's sampling unit)."""
    b = np.asarray(baseline, dtype=np.float64)
    c = np.asarray(candidate, dtype=np.float64)
    keep = np.isfinite(b) & np.isfinite(c) & (b > 0) & (c > 0)
    b, c = b[keep], c[keep]
    if b.size == 0:
        return []
    q = np.asarray(quantiles)
    num, den = (c, b) if higher_is_better else (b, c)
    estimate = np.quantile(num, q) / np.quantile(den, q)
    out: list[QuantileSpeedup] = []
    block, widen = bootstrap_block(b.size, unit, confidence)
    if b.size >= sequential.MIN_PAIRS:
        boot_num, boot_den = bootstrap_quantiles((num, den), q, rng=rng, block=block)
        boot = boot_num / boot_den  # (len(q), B)
        tail = (1.0 - confidence) / 2.0
        lows, highs = np.quantile(boot, tail, axis=1), np.quantile(boot, 1.0 - tail, axis=1)
        if widen != 1.0:
            lows, highs = (
                _widened(estimate, lows, widen, log=True),
                _widened(estimate, highs, widen, log=True),
            )
    for i, qq in enumerate(quantiles):
        item = QuantileSpeedup(metric=metric, quantile=qq, estimate=float(estimate[i]))
        if b.size >= sequential.MIN_PAIRS:
            item.ci_low, item.ci_high = float(lows[i]), float(highs[i])
        out.append(item)
    return out


#: resampled draws held at once by `bootstrap_quantiles` (8 MiB of counts)
BOOTSTRAP_CHUNK = 1 << 20
#: `bootstrap_quantiles` sums a resample's counts in order only in a window of ranks around each
#: quantile's order statistics, this many standard deviations of the count below a rank wide on
#: either side (plus 16 ranks); a row whose statistic lies outside (~1 in 10^6) is summed in full
BOOTSTRAP_WINDOW_SD = 5.0


def bootstrap_block(n: int, unit: int, confidence: float) -> tuple[int, float]:
    """The block of the tails' bootstrap for `n` pairs of a stage whose sampling unit is `unit` pairs,
    and the factor that widens its percentile interval about the estimate.

    The blocks are the speed-up interval's (`sequential.block_size`: at least one unit, at most
    `sequential.MAX_BLOCKS` of them). With G blocks the bootstrap's spread is that of G independent
    blocks, too small by sqrt(G / (G - 1)) (as CR1 corrects), and its quantiles are the normal's where
    G - 1 degrees of freedom want the t's: the factor is sqrt(G / (G - 1)) t_{G-1} / z (1 for a unit
    of one pair: the plain paired bootstrap, unchanged). Measured in `benchmarks/verdict/tails.py`."""
    block = sequential.block_size(n, unit)
    if block <= 1:
        return 1, 1.0
    g = max(2, n // block)
    p = 0.5 + confidence / 2.0
    return block, math.sqrt(g / (g - 1)) * float(stats.t.ppf(p, g - 1) / stats.norm.ppf(p))


def _widened(estimate: Any, bound: Any, widen: float, *, log: bool) -> Any:
    """An interval's `bound` moved `widen` times as far from `estimate` (on the log scale for a
    ratio); floats or arrays alike (`bootstrap_block`'s factor)."""
    return estimate * (bound / estimate) ** widen if log else estimate + widen * (bound - estimate)


def block_draws(rng: np.random.Generator, rows: int, n: int, block: int) -> npt.NDArray[np.intp]:
    """`rows` resamples of n indices of 0..n-1: iid draws (`block` 1: `rng.integers(0, n, (rows, n))`),
    else circular blocks of `block` consecutive indices from uniform starts, cut to n per row."""
    if block <= 1 or n < 2:
        return rng.integers(0, n, size=(rows, n))
    block = min(block, n)
    count = -(-n // block)
    starts = rng.integers(0, n, size=(rows, count))
    draws = (starts[:, :, None] + np.arange(block)).reshape(rows, count * block)[:, :n]
    return np.asarray(draws % n, dtype=np.intp)


def bootstrap_quantiles(
    samples: Sequence[FloatArray], q: FloatArray, *, rng: np.random.Generator, block: int = 1
) -> list[FloatArray]:
    """Quantiles `q` of `BOOTSTRAP_RESAMPLES` paired resamples of equally long `samples`: for each
    sample, exactly `np.quantile(sample[idx], q, axis=1)` with `idx = block_draws(rng, B, n, block)`
    (iid draws for `block` 1, circular blocks of `block` consecutive pairs else; the same draws,
    order statistics and linear interpolation), shape (len(q), B).

    Without forming `sample[idx]` (B x n floats, 200 MB at 12,500 pairs, and a partition of it
    per quantile call): the draws come `BOOTSTRAP_CHUNK` at a time and each row's draws are counted
    per index, once for all samples. A row's order statistic of rank k is the sample's value at the
    first rank whose running count (the counts summed over the sample's ranks in order) exceeds k;
    that running count is needed only near k, so it is summed in order only over a window of ranks
    around each quantile, from the count below the window. Those counts, of every window in every
    sample, come from one sum per group of indices (grouped by the window starts their ranks reach
    in each sample) (benchmarks/README.md, "Results at scale")."""
    n = len(samples[0])
    virtual = (n - 1) * np.asarray(q, dtype=np.float64)  # numpy's "linear" method
    previous = np.floor(virtual)
    nxt = previous + 1
    previous[virtual >= n - 1] = nxt[virtual >= n - 1] = n - 1
    previous_i, next_i = previous.astype(np.intp), nxt.astype(np.intp)
    gamma = virtual - np.where(virtual >= n - 1, -1, previous_i)  # as numpy's (-1 there: any gamma)
    # each quantile's window of ranks [lo, hi), where its two order statistics are looked for
    share = (previous_i + 1) / n
    reach = np.ceil(BOOTSTRAP_WINDOW_SD * np.sqrt(n * share * (1 - share))).astype(np.intp) + 16
    lo, hi = np.maximum(previous_i - reach, 0), np.minimum(next_i + reach + 1, n)
    starts = np.unique(lo)  # the windows' starts, in rank order
    # each index's group: for every sample, how many window starts its rank reaches (a rank below
    # starts[e] reaches at most e of them), so that one sum per group gives every count below a window
    ranked, group = [], np.zeros(n, dtype=np.intp)
    for sample in samples:
        order = np.argsort(sample, kind="stable")
        rank = np.empty(n, dtype=np.intp)
        rank[order] = np.arange(n)
        ranked.append((np.asarray(sample)[order], order))
        group = group * (len(starts) + 1) + np.searchsorted(starts, rank, side="right")
    by_group = np.argsort(group, kind="stable")
    groups, firsts = np.unique(group[by_group], return_index=True)
    reached = [
        groups // (len(starts) + 1) ** (len(samples) - 1 - s) % (len(starts) + 1) for s in range(len(samples))
    ]
    # below[s][e, g]: whether group g's indices rank below starts[e] in sample s
    below = [(reached_s[None, :] <= np.arange(len(starts))[:, None]).astype(np.intp) for reached_s in reached]
    stats_of: list[list[FloatArray]] = [[] for _ in samples]
    rows = max(1, BOOTSTRAP_CHUNK // n)
    for start in range(0, BOOTSTRAP_RESAMPLES, rows):
        m = min(rows, BOOTSTRAP_RESAMPLES - start)
        idx = block_draws(rng, m, n, block)
        idx += np.arange(m)[:, None] * n
        counts = np.bincount(idx.ravel(), minlength=m * n).reshape(m, n)
        sums = np.add.reduceat(np.take(counts, by_group, axis=1), firsts, axis=1)  # (m, groups)
        for (ordered, order), below_s, out in zip(ranked, below, stats_of, strict=True):
            unders = sums @ below_s.T  # (m, starts): each row's draws ranking below each window
            at = np.empty((m, 2, len(q)), dtype=np.intp)  # the ranks of each row's order statistics
            for i in range(len(q)):
                under = unders[:, np.searchsorted(starts, lo[i])]
                running = np.cumsum(np.take(counts, order[lo[i] : hi[i]], axis=1), axis=1) + under[:, None]
                for j, k in enumerate((previous_i[i], next_i[i])):
                    at[:, j, i] = lo[i] + np.count_nonzero(running <= k, axis=1)
                    for r in np.flatnonzero((under > k) | (running[:, -1] <= k)):  # outside the window
                        at[r, j, i] = np.searchsorted(np.cumsum(counts[r, order]), k, side="right")
            out.append(ordered[at.reshape(m, -1)])  # (m, 2 len(q)): the order statistics of each row
    result = []
    for chunks in stats_of:
        order_stats = np.concatenate(chunks).T  # (2 len(q), B)
        low, high = order_stats[: len(virtual)], order_stats[len(virtual) :]
        t = gamma[:, None]
        diff = high - low
        value = low + diff * t
        np.subtract(high, diff * (1 - t), out=value, where=t >= 0.5)  # as numpy's _lerp
        result.append(value)
    return result


def proportion_interval(
    successes: int, trials: int, *, confidence: float, method: Literal["exact", "wilson"] = "exact"
) -> tuple[float, float]:
    """Clopper-Pearson (`exact`) or `wilson` score interval of a binomial proportion; (0, 1) with no trials.

    In closed form, the numbers of `scipy.stats.binomtest(...).proportion_ci` (which finds the exact
    limits by root finding, ~1 ms a call: a stage asks a handful, fifty collections at once ~1 s):
    the exact limits are the beta distribution's quantiles, Wilson's the score formula.
    """
    if trials <= 0:
        return 0.0, 1.0
    alpha = 1.0 - confidence
    if method == "exact":
        low = 0.0 if successes <= 0 else float(stats.beta.ppf(alpha / 2, successes, trials - successes + 1))
        high = (
            1.0
            if successes >= trials
            else float(stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
        )
        return low, high
    z = float(stats.norm.ppf(1 - alpha / 2))
    p = successes / trials
    denominator = 1 + z * z / trials
    center = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def paired_proportion_difference(
    control: Sequence[bool], treatment: Sequence[bool], *, confidence: float
) -> tuple[float, float, float] | None:
    """treatment rate - control rate over paired successes, with Newcombe's hybrid score interval
    for paired proportions (Newcombe 1998, method 10: Wilson limits of each rate, combined with the
    pairs' phi correlation). None without pairs.

    Pairing matters: both arms served the same prompts, so their successes are correlated and the
    difference is known far better than from two independent samples.
    """
    n = len(control)
    if n == 0 or len(treatment) != n:
        return None
    both = sum(c and t for c, t in zip(control, treatment, strict=True))
    only_t = sum(t and not c for c, t in zip(control, treatment, strict=True))
    only_c = sum(c and not t for c, t in zip(control, treatment, strict=True))
    neither = n - both - only_t - only_c
    p_t, p_c = (both + only_t) / n, (both + only_c) / n
    l_t, u_t = proportion_interval(both + only_t, n, confidence=confidence, method="wilson")
    l_c, u_c = proportion_interval(both + only_c, n, confidence=confidence, method="wilson")
    a = (both + only_t) * (only_c + neither) * (both + only_c) * (only_t + neither)
    phi = (both * neither - only_t * only_c) / math.sqrt(a) if a > 0 else 0.0
    down = math.sqrt(max(0.0, (p_t - l_t) ** 2 - 2 * phi * (p_t - l_t) * (u_c - p_c) + (u_c - p_c) ** 2))
    up = math.sqrt(max(0.0, (u_t - p_t) ** 2 - 2 * phi * (u_t - p_t) * (p_c - l_c) + (p_c - l_c) ** 2))
    diff = p_t - p_c
    return diff, max(-1.0, diff - down), min(1.0, diff + up)


@dataclass(frozen=True)
class QuantileChange:
    """How one quantile moved from control to treatment: ratio and difference, with paired-bootstrap bounds."""

    ratio: float
    difference: float
    ratio_ci: tuple[float, float] | None
    difference_ci: tuple[float, float] | None


def quantile_change(
    control: FloatArray,
    treatment: FloatArray,
    *,
    quantile: float,
    confidence: float,
    rng: np.random.Generator,
    unit: int = 1,
) -> QuantileChange | None:
    """treatment quantile / control quantile and treatment - control, over pairs (same resamples for
    both, in blocks of `unit` consecutive pairs)."""
    b = np.asarray(control, dtype=np.float64)
    c = np.asarray(treatment, dtype=np.float64)
    keep = np.isfinite(b) & np.isfinite(c) & (b > 0) & (c > 0)
    b, c = b[keep], c[keep]
    if b.size == 0:
        return None
    qb, qc = float(np.quantile(b, quantile)), float(np.quantile(c, quantile))
    if b.size < sequential.MIN_PAIRS:
        return QuantileChange(qc / qb, qc - qb, None, None)
    block, widen = bootstrap_block(b.size, unit, confidence)
    drawn = bootstrap_quantiles((b, c), np.array([quantile]), rng=rng, block=block)
    boot_b, boot_c = (boot[0] for boot in drawn)
    tail = (1.0 - confidence) / 2.0
    ratio, diff = qc / qb, qc - qb
    ratio_ci = tuple(float(v) for v in np.quantile(boot_c / boot_b, [tail, 1.0 - tail]))
    diff_ci = tuple(float(v) for v in np.quantile(boot_c - boot_b, [tail, 1.0 - tail]))
    if widen != 1.0:
        ratio_ci = tuple(_widened(ratio, v, widen, log=True) for v in ratio_ci)
        diff_ci = tuple(_widened(diff, v, widen, log=False) for v in diff_ci)
    return QuantileChange(ratio, diff, (ratio_ci[0], ratio_ci[1]), (diff_ci[0], diff_ci[1]))
