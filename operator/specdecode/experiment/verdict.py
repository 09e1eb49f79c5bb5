"""The verdict: paired statistics per stage, guardrails, output equivalence, the overall rule, a recommendation.

Pure: numpy/scipy on `RequestRecord`s and `StageWindow`s (records.py) in, status models (status.py) out.
Owns `status.stages`, `verdict`, `reason`, `message`, `speedupSummary` and `recommendation`.

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

Guardrails carry their own uncertainty. Each is Holds, Breached (its estimate is beyond the limit:
a Pass is blocked, the stage is at best Inconclusive) or SurelyBreached (even the favourable
confidence bound is beyond it: the stage Fails):
| guardrail        | estimate                                   | interval                        |
| ttftRegression   | p90(TTFT treatment) / p90(TTFT control) - 1 | paired bootstrap; counts only   |
|                  | and p90 difference in ms                   | beyond ttftToleranceMs too      |
| slo<Metric>P<q>  | treatment's q-th percentile (failed = ∞)   | order statistics; NotEvaluated  |
|                  |                                            | where the control misses it too |
| goodput          | paired change of the fraction meeting      | Newcombe paired score; upper    |
|                  | every SLO (treatment - control)            | bound < 0 blocks, < -max fails  |
| errorRate        | treatment errors / treatment requests      | Clopper-Pearson                 |
| outputMatch      | identical greedy outputs / pairs           | Clopper-Pearson; Breached fails |
|                  | limit minOutputMatch - baselineMismatchRate | when set: only SurelyBreached   |
|                  |                                            | fails, Breached blocks a Pass   |
| acceptanceRate   | accepted / drafted tokens                  | Clopper-Pearson on token counts |
Goodput per arm (status `goodput`): requests that succeeded with every SLO metric within its
largest limit / requests sent, Wilson interval, and per second of the arm's own active time.
Output mismatch under greedy sampling is critical: Breached already fails the stage, and anywhere it
happens the experiment is rejected (the minOutputMatch tolerance is the allowance for numeric noise).
Output match is not evaluated with temperature > 0. Two identical servers need not agree bitwise
either (batching changes the order of floating-point sums): `guardrails.baselineMismatchRate`, the
rate an A/A run measured, is taken off the limit, and then only a sure breach (the whole interval
below the limit) is critical.

Noise floor (`analysis.mode: NoiseFloor`, an A/A run: both arms without speculation). Each stage
runs in full (no sequential stop) and is reported in `status.noiseFloor`: the A/A speed-up with its
paired t interval (every pair, one look; the stage's own `speedup` is computed the same way), `equivalent` (the interval within [1/minSpeedup,
minSpeedup]), `minDetectable` (`min_detectable` at threshold 1.0 with the Compare run's design: the
smallest speed-up the stage tells from none, 9 times in 10, at the noise measured), `measurable`
(minDetectable ≤ minSpeedup), and the greedy-output mismatch rate with its Wilson interval; the
pooled upper Wilson bound is the suggested `baselineMismatchRate`. The stages are not judged and
the verdict is Inconclusive with reason `NoiseFloor`: a measurement, not a gate.

Stage rule: invalid measurement or too few pairs -> Inconclusive; a guardrail SurelyBreached (or
output match Breached) -> Fail; speed-up upper bound < minSpeedup -> Fail; lower bound >= minSpeedup
and no guardrail Breached -> Pass; otherwise Inconclusive.
Overall (`requireStages`): an output mismatch anywhere -> Reject. `all` / a list: any required stage
Fail -> Reject; all Pass -> Promote; else Inconclusive. `any`: one Pass -> Promote; all Fail -> Reject;
else Inconclusive. Inconclusive is never promoted. No measured request at all, or a run marked
invalid, is "could not measure": `verdict` None, the caller ends the experiment Failed.

Validity block (from the load generator; assumed shape, tolerant of more keys):
`{"valid": bool, "reasons": [str], "stages": {name: {"valid": bool, "reasons": [str]}}}`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

from specdecode.experiment import breakeven, releases, sequential
from specdecode.experiment.records import ArmServerMetrics, RequestRecord, StageWindow
from specdecode.experiment.spec import (
    AnalysisMode,
    AnalysisSpec,
    ExperimentSpec,
    PrimaryMetric,
    Slo,
    Stage,
    SyntheticDataset,
)
from specdecode.experiment.status import (
    Acceptance,
    ArmSummary,
    CategoryResult,
    ExperimentStatus,
    Goodput,
    GuardrailResult,
    LengthRecommendation,
    NoiseFloor,
    Phase,
    QuantileSpeedup,
    Recommendation,
    Speedup,
    StageNoiseFloor,
    StageResult,
    StageVerdict,
    Verdict,
)

FloatArray = npt.NDArray[np.float64]

CONTROL = "control"
TREATMENT = "treatment"

#: fewest pairs for a fixed-horizon interval (the sequential one needs sequential.MIN_PAIRS)
MIN_PAIRS_FIXED = 3
#: bootstrap resamples for quantile ratios
BOOTSTRAP_RESAMPLES = 2000
#: quantiles compared between the arms
TAIL_QUANTILES = (0.5, 0.9, 0.99)
#: the power at which `min_detectable` reports the smallest speed-up a stage could show
DETECTABLE_POWER = 0.9
#: the largest absolute difference between acceptance-rate estimates that still counts as agreement
ACCEPTANCE_TOLERANCE = 0.05
#: the upper end of the last range of a batch-size schedule
SCHEDULE_MAX_BATCH = 4096

_LATENCY_FIELDS = {"tpot": "tpot_ms", "e2e": "e2e_ms", "ttft": "ttft_ms"}


class Reason(StrEnum):
    """CamelCase machine reasons of the overall verdict (status.reason)."""

    SPEEDUP_CONFIRMED = "SpeedupConfirmed"
    """Every required stage passed."""
    SLOWER_THAN_REQUIRED = "SlowerThanRequired"
    """A required stage is surely below minSpeedup."""
    GUARDRAIL_FAILED = "GuardrailFailed"
    """A guardrail surely failed at a required stage."""
    OUTPUT_MISMATCH = "OutputMismatch"
    """Greedy outputs of the treatment differ from the control's (critical, whatever the speed)."""
    INSUFFICIENT_EVIDENCE = "InsufficientEvidence"
    """Neither confirmed nor refuted at a required stage."""
    INVALID_MEASUREMENT = "InvalidMeasurement"
    """The load generator marked the measurement untrustworthy."""
    NO_DATA = "NoData"
    """Nothing (or too little) was measured."""
    NOISE_FLOOR = "NoiseFloor"
    """An A/A run (`analysis.mode: NoiseFloor`): measured, not judged; see `status.noiseFloor`."""


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


class Outcome(StrEnum):
    """What a guardrail decided."""

    HOLDS = "Holds"
    """The estimate is within the limit."""
    BREACHED = "Breached"
    """The estimate is beyond the limit: blocks a Pass."""
    SURELY_BREACHED = "SurelyBreached"
    """The favourable bound is beyond the limit: fails the stage."""
    NOT_EVALUATED = "NotEvaluated"
    """No data, or not applicable (e.g. output match with sampling)."""


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


# --------------------------------------------------------------------------------------- comparison


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
) -> MetricVerdict:
    """Speed-up of `candidate` (treatment) over `baseline` (control), pair by pair.

    `baseline[i]` and `candidate[i]` are the same request in both arms. Latencies: speed-up is
    baseline / candidate; with `higher_is_better` (throughput) candidate / baseline. `horizon` is
    the most pairs the stage could have had and `first_look` the fewest before its first look
    (`sequential.first_look` of its concurrency): they set the sequential design's looks.
    """
    d = log_ratios(baseline, candidate, higher_is_better=higher_is_better)
    n = int(d.size)
    threshold = math.log(min_speedup)
    method = "groupSequential" if sequential_ci else "pairedT"
    need = sequential.MIN_PAIRS if sequential_ci else MIN_PAIRS_FIXED
    if n == 0:
        return MetricVerdict(Label.NO_DATA, None, None, None, 0, f"no valid {metric} pairs", method)
    mean = float(np.mean(d))
    if n < need:
        return MetricVerdict(
            Label.NO_DATA,
            math.exp(mean),
            None,
            None,
            n,
            f"{n} valid {metric} pairs, fewer than {need}",
            method,
        )
    decided_at: int | None = None
    if sequential_ci:
        h = max(horizon or n, n)
        at = sequential.look(
            d, threshold=threshold, confidence=confidence, horizon=h, final=True, first=first_look
        )
        # Estimate and interval both come from the look that decided the stage: pairs that finished
        # after it (in flight at the stop) would move a mean outside that look's interval.
        low, high, decided_at = at.low, at.high, at.n
        mean = sequential_estimate(
            d, at, threshold=threshold, confidence=confidence, horizon=h, first=first_look
        )
        p = sequential.repeated_p_value(
            d, threshold=threshold, confidence=confidence, horizon=h, upto=at.n, first=first_look
        )
    else:
        sd = float(np.std(d, ddof=1))
        if sd == 0.0:
            low = high = mean
            p = 0.0 if mean > threshold else 1.0
        else:
            se = sd / math.sqrt(n)
            crit = float(stats.t.ppf(0.5 + confidence / 2.0, n - 1))
            low, high = mean - crit * se, mean + crit * se
            p = float(stats.t.sf((mean - threshold) / se, n - 1))
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
    )
    return MetricVerdict(label, math.exp(mean), ci, p, n, f"{metric} {why}", method, decided_at, floor)


def min_detectable(
    d: FloatArray,
    *,
    threshold: float,
    confidence: float,
    horizon: int | None,
    sequential_ci: bool,
    first_look: int = sequential.FIRST_LOOK,
) -> float | None:
    """The noise floor of a stage: the smallest speed-up its design promotes with probability
    `DETECTABLE_POWER`, at the standard deviation of its paired log-ratios taken as the truth.

    Sequential: the group-sequential design over the stage's request bound (`sequential.detectable`);
    fixed horizon: the paired t test on the pairs that ran. A speed-up below it was unlikely to be
    shown at this load, whatever its size: measure more requests, or accept a lower minSpeedup.
    None without spread (ties) or with too few pairs.
    """
    n = int(d.size)
    if n < 3:
        return None
    sd = float(np.std(d, ddof=1))
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
) -> list[QuantileSpeedup]:
    """Quantile ratios (control quantile / treatment quantile for latencies) with paired-bootstrap intervals."""
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
    if b.size >= sequential.MIN_PAIRS:
        idx = rng.integers(0, b.size, size=(BOOTSTRAP_RESAMPLES, b.size))
        boot = np.quantile(num[idx], q, axis=1) / np.quantile(den[idx], q, axis=1)  # (len(q), B)
        tail = (1.0 - confidence) / 2.0
        lows, highs = np.quantile(boot, tail, axis=1), np.quantile(boot, 1.0 - tail, axis=1)
    for i, qq in enumerate(quantiles):
        item = QuantileSpeedup(metric=metric, quantile=qq, estimate=float(estimate[i]))
        if b.size >= sequential.MIN_PAIRS:
            item.ci_low, item.ci_high = float(lows[i]), float(highs[i])
        out.append(item)
    return out


def proportion_interval(
    successes: int, trials: int, *, confidence: float, method: Literal["exact", "wilson"] = "exact"
) -> tuple[float, float]:
    """Clopper-Pearson (`exact`) or `wilson` score interval of a binomial proportion; (0, 1) with no trials."""
    if trials <= 0:
        return 0.0, 1.0
    ci = stats.binomtest(successes, trials).proportion_ci(confidence_level=confidence, method=method)
    return float(ci.low), float(ci.high)


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
) -> QuantileChange | None:
    """treatment quantile / control quantile and treatment - control, over pairs (same resamples for both)."""
    b = np.asarray(control, dtype=np.float64)
    c = np.asarray(treatment, dtype=np.float64)
    keep = np.isfinite(b) & np.isfinite(c) & (b > 0) & (c > 0)
    b, c = b[keep], c[keep]
    if b.size == 0:
        return None
    qb, qc = float(np.quantile(b, quantile)), float(np.quantile(c, quantile))
    if b.size < sequential.MIN_PAIRS:
        return QuantileChange(qc / qb, qc - qb, None, None)
    idx = rng.integers(0, b.size, size=(BOOTSTRAP_RESAMPLES, b.size))
    boot_b, boot_c = np.quantile(b[idx], quantile, axis=1), np.quantile(c[idx], quantile, axis=1)
    tail = (1.0 - confidence) / 2.0
    ratio = np.quantile(boot_c / boot_b, [tail, 1.0 - tail])
    diff = np.quantile(boot_c - boot_b, [tail, 1.0 - tail])
    return QuantileChange(
        qc / qb, qc - qb, (float(ratio[0]), float(ratio[1])), (float(diff[0]), float(diff[1]))
    )


# -------------------------------------------------------------------------------------------- pairing


@dataclass(frozen=True)
class Pairs:
    """The records of one stage, split by arm and matched by index."""

    control: dict[int, RequestRecord]
    treatment: dict[int, RequestRecord]

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> Pairs:
        """Index records by arm; warm-up excluded; the last record wins on a duplicate index."""
        control: dict[int, RequestRecord] = {}
        treatment: dict[int, RequestRecord] = {}
        for r in records:
            if r.warmup:
                continue
            if r.arm == CONTROL:
                control[r.index] = r
            elif r.arm == TREATMENT:
                treatment[r.index] = r
        return cls(control, treatment)

    def both_ok(self) -> list[tuple[RequestRecord, RequestRecord]]:
        """Pairs where both arms succeeded, in index order (a data-independent order)."""
        return [
            (self.control[i], self.treatment[i])
            for i in sorted(self.control.keys() & self.treatment.keys())
            if self.control[i].ok and self.treatment[i].ok
        ]

    def prefix(self) -> Pairs:
        """Only the longest run of indices, from the first, that both arms have finished.

        At a look during a stage, later requests may still be in flight; using only a complete
        prefix keeps the order of observations independent of their values (slow pairs would
        otherwise arrive late and bias early looks).
        """
        common = self.control.keys() & self.treatment.keys()
        every = self.control.keys() | self.treatment.keys()
        if not every:
            return self
        i = min(every)
        keep: list[int] = []
        while i in common:
            keep.append(i)
            i += 1
        return Pairs({k: self.control[k] for k in keep}, {k: self.treatment[k] for k in keep})


def metric_value(record: RequestRecord, metric: str) -> float:
    """The per-request value of a metric (ms for latencies; tokens/s for throughput); NaN when undefined."""
    if metric == PrimaryMetric.THROUGHPUT:
        if record.completion_tokens is None or record.e2e_ms is None or record.e2e_ms <= 0:
            return math.nan
        return record.completion_tokens / (record.e2e_ms / 1000.0)
    value = getattr(record, _LATENCY_FIELDS[metric])
    return math.nan if value is None else float(value)


def paired_values(
    pairs: Sequence[tuple[RequestRecord, RequestRecord]], metric: str
) -> tuple[FloatArray, FloatArray]:
    """(control values, treatment values) of a metric over pairs."""
    b = np.array([metric_value(c, metric) for c, _ in pairs], dtype=np.float64)
    c = np.array([metric_value(t, metric) for _, t in pairs], dtype=np.float64)
    return b, c


# ---------------------------------------------------------------------------------------- summaries


def _quantile(values: FloatArray, q: float) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.quantile(finite, q)) if finite.size else None


def active_seconds(records: Sequence[RequestRecord]) -> float:
    """One arm's active time in a stage: its first request sent → its last response finished (s).

    Per arm, not the stage window: the window ends when the slower arm drains, so dividing both
    arms' tokens by it gives a faster arm the slower one's throughput. Failed requests count (they
    occupied the arm); 0 when no request finished.
    """
    ends = [r.end for r in records if r.end is not None]
    if not ends:
        return 0.0
    return max(0.0, max(ends) - min(r.sent for r in records))


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    """The request succeeded and each metric with an SLO is within that metric's largest limit."""
    if not record.ok:
        return False
    for metric, limits in (("ttft", slo.ttft), ("tpot", slo.tpot), ("e2e", slo.e2e)):
        if limits is None:
            continue
        value = getattr(record, _LATENCY_FIELDS[metric])
        if metric == "tpot" and value is None and record.completion_tokens == 1:
            continue  # one output token: no time per output token to miss
        if value is None or not math.isfinite(value) or value > max(ms for _, ms in limits.limits()):
            return False
    return True


def goodput(records: Sequence[RequestRecord], slo: Slo, *, confidence: float) -> Goodput | None:
    """Requests of one arm meeting every SLO, with a Wilson interval; None without SLOs or requests."""
    if not slo.limits() or not records:
        return None
    good = sum(meets_slo(r, slo) for r in records)
    low, high = proportion_interval(good, len(records), confidence=confidence, method="wilson")
    active = active_seconds(records)
    return Goodput(
        requests=len(records),
        good=good,
        fraction=good / len(records),
        ci_low=low,
        ci_high=high,
        per_second=good / active if active > 0 else None,
    )


def summarise_arm(
    records: Sequence[RequestRecord], *, slo: Slo | None = None, confidence: float = 0.95
) -> ArmSummary:
    """Per-arm numbers of one stage: counts, latency quantiles (successful requests), output tok/s,
    goodput (with `slo`).

    Output tok/s = completion tokens of the arm's successful requests / the arm's own active time
    (`active_seconds`).
    """
    ok = [r for r in records if r.ok]
    summary = ArmSummary(requests=len(records), errors=len(records) - len(ok))
    for name, attr in _LATENCY_FIELDS.items():
        values = np.array(
            [math.nan if getattr(r, attr) is None else getattr(r, attr) for r in ok], dtype=np.float64
        )
        for q, suffix in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            setattr(summary, f"{name}_{suffix}", _quantile(values, q))
    tokens = sum(r.completion_tokens or 0 for r in ok)
    duration = active_seconds(records)
    if ok and duration > 0:
        summary.output_tokens_per_second = tokens / duration
    if slo is not None:
        summary.goodput = goodput(records, slo, confidence=confidence)
    return summary


# --------------------------------------------------------------------------------------- acceptance


def acceptance(
    treatment: Sequence[RequestRecord], server: ArmServerMetrics | None, *, k: int | None
) -> Acceptance | None:
    """Draft acceptance of one stage's treatment (see `acceptance_counts`)."""
    return acceptance_counts(treatment, server, k=k)[0]


def acceptance_counts(
    treatment: Sequence[RequestRecord], server: ArmServerMetrics | None, *, k: int | None
) -> tuple[Acceptance | None, tuple[int, int]]:
    """Draft acceptance estimated up to three ways, the preferred one reported, agreement flagged.

    perRequest: the server's per-request `speculative_decoding` summed over successful requests
    (exactly this stage's measured requests; preferred). prometheus: the stage window's counter
    deltas of `vllm:spec_decode_*`. clientProxy: tokens per SSE event after the first, an estimate
    of the mean acceptance length (rate = (length - 1) / k); streams that coalesce steps inflate it.
    Also returns (accepted, drafted) token counts behind the reported rate, for its interval.
    """
    rates: dict[str, float] = {}
    lengths: dict[str, float] = {}
    positions: dict[str, list[float]] = {}
    counts: dict[str, tuple[int, int]] = {}

    accepted = drafted = steps = 0
    histogram: list[int] = []
    for r in treatment:
        sd = r.spec_decode
        if not r.ok or not sd:
            continue
        accepted += int(sd.get("num_accepted_draft_tokens") or 0)
        drafted += int(sd.get("num_draft_tokens") or 0)
        steps += int(sd.get("num_spec_steps") or 0)
        hist = sd.get("acceptance_histogram") or []
        if len(hist) > len(histogram):
            histogram.extend([0] * (len(hist) - len(histogram)))
        for j, count in enumerate(hist):
            histogram[j] += int(count)
        if k is None and sd.get("num_spec_tokens"):
            k = int(sd["num_spec_tokens"])
    if drafted > 0:
        rates["perRequest"] = accepted / drafted
        counts["perRequest"] = (accepted, drafted)
    if steps > 0:
        lengths["perRequest"] = 1.0 + accepted / steps
    if histogram and sum(histogram) > 0:
        total = sum(histogram)
        positions["perRequest"] = [sum(histogram[j + 1 :]) / total for j in range(len(histogram) - 1)]

    if server is not None and server.num_draft_tokens:
        acc = server.num_accepted_tokens or 0.0
        rates["prometheus"] = acc / server.num_draft_tokens
        counts["prometheus"] = (round(acc), round(server.num_draft_tokens))
        if server.num_drafts:
            lengths["prometheus"] = 1.0 + acc / server.num_drafts
            if server.accepted_per_position:
                positions["prometheus"] = [p / server.num_drafts for p in server.accepted_per_position]

    tokens = events = 0
    for r in treatment:
        if r.ok and len(r.events) >= 2:
            tokens += r.events[-1][1] - r.events[0][1]
            events += len(r.events) - 1
    if events > 0:
        lengths["clientProxy"] = tokens / events
        if k:
            rates["clientProxy"] = min(1.0, max(0.0, (lengths["clientProxy"] - 1.0) / k))

    if not rates and not lengths:
        return None, (0, 0)
    source = next(
        (s for s in ("perRequest", "prometheus", "clientProxy") if s in rates or s in lengths), None
    )
    result = Acceptance(source=source, sources=rates)
    if source is not None:
        result.rate = rates.get(source)
        result.mean_length = lengths.get(source)
        result.per_position = positions.get(source) or next(iter(positions.values()), [])
    if len(rates) >= 2:
        result.agreement = max(rates.values()) - min(rates.values()) <= ACCEPTANCE_TOLERANCE
    return result, counts.get(source or "", (0, 0))


# --------------------------------------------------------------------------------------- guardrails


def _outcome(estimate: float, favourable: float, limit: float, *, upper_is_bad: bool) -> Outcome:
    if upper_is_bad:
        if favourable > limit:
            return Outcome.SURELY_BREACHED
        return Outcome.BREACHED if estimate > limit else Outcome.HOLDS
    if favourable < limit:
        return Outcome.SURELY_BREACHED
    return Outcome.BREACHED if estimate < limit else Outcome.HOLDS


def guardrails(
    spec: ExperimentSpec,
    pairs: Pairs,
    acc: Acceptance | None,
    *,
    rng: np.random.Generator,
    acc_counts: tuple[int, int] = (0, 0),
) -> list[GuardrailResult]:
    """Every configured guardrail of one stage, with its estimate, interval and outcome."""
    g = spec.analysis.guardrails
    conf = spec.analysis.confidence
    out: list[GuardrailResult] = []
    both = pairs.both_ok()

    if g.max_ttft_regression is not None:
        out.append(ttft_regression(spec, both, rng=rng))
    out.extend(slo_guardrails(spec, pairs, confidence=conf))
    if g.max_goodput_drop is not None and spec.analysis.slo.limits():
        out.append(goodput_guardrail(spec, pairs))

    treated = list(pairs.treatment.values())
    item = GuardrailResult(name="errorRate", limit=g.max_error_rate, outcome=Outcome.NOT_EVALUATED)
    if treated:
        errors = sum(not r.ok for r in treated)
        low, high = proportion_interval(errors, len(treated), confidence=conf)
        item.estimate, item.ci_low, item.ci_high = errors / len(treated), low, high
        item.outcome = _outcome(item.estimate, low, g.max_error_rate, upper_is_bad=True)
    out.append(item)

    baseline = g.baseline_mismatch_rate
    limit = g.min_output_match if baseline is None else max(0.0, g.min_output_match - baseline)
    item = GuardrailResult(name="outputMatch", limit=limit, tolerance=baseline, outcome=Outcome.NOT_EVALUATED)
    if spec.workload.sampling.temperature == 0.0:
        same, compared = output_agreement(both)
        if compared:
            low, high = proportion_interval(same, compared, confidence=conf)
            item.estimate, item.ci_low, item.ci_high = same / compared, low, high
            item.outcome = _outcome(item.estimate, high, limit, upper_is_bad=False)
            if baseline is not None and item.outcome == Outcome.BREACHED:
                item.note = (
                    f"below minOutputMatch - baselineMismatchRate = {limit:.3g}, but within the noise"
                    " of what identical servers already disagree on: blocks a Pass, not critical"
                )
    out.append(item)

    if g.min_acceptance_rate is not None:
        item = GuardrailResult(
            name="acceptanceRate", limit=g.min_acceptance_rate, outcome=Outcome.NOT_EVALUATED
        )
        if acc is not None and acc.rate is not None:
            item.estimate = acc.rate
            accepted, drafted = acc_counts
            if drafted > 0:
                item.ci_low, item.ci_high = proportion_interval(accepted, drafted, confidence=conf)
                favourable = item.ci_high
            else:
                favourable = 1.0  # client proxy only: no interval, never "surely"
            item.outcome = _outcome(acc.rate, favourable, g.min_acceptance_rate, upper_is_bad=False)
        out.append(item)
    return out


def ttft_regression(
    spec: ExperimentSpec, both: Sequence[tuple[RequestRecord, RequestRecord]], *, rng: np.random.Generator
) -> GuardrailResult:
    """p90 TTFT, treatment over control: a regression beyond `maxTtftRegression` *and* `ttftToleranceMs`.

    Breached: both estimates are beyond their limits; SurelyBreached: both favourable (lower)
    bounds are (an intersection-union test: each bound at the analysis confidence keeps the level).
    """
    g = spec.analysis.guardrails
    limit = g.max_ttft_regression if g.max_ttft_regression is not None else math.inf
    item = GuardrailResult(
        name="ttftRegression", limit=limit, tolerance=g.ttft_tolerance_ms, outcome=Outcome.NOT_EVALUATED
    )
    b, c = paired_values(both, "ttft")
    change = quantile_change(b, c, quantile=0.9, confidence=spec.analysis.confidence, rng=rng)
    if change is None:
        return item
    item.estimate, item.difference = change.ratio - 1.0, change.difference
    if change.ratio_ci is None or change.difference_ci is None:
        return item
    item.ci_low, item.ci_high = change.ratio_ci[0] - 1.0, change.ratio_ci[1] - 1.0
    item.difference_ci_low, item.difference_ci_high = change.difference_ci
    tol = g.ttft_tolerance_ms
    if item.ci_low > limit and item.difference_ci_low > tol:
        item.outcome = Outcome.SURELY_BREACHED
    elif item.estimate > limit and item.difference > tol:
        item.outcome = Outcome.BREACHED
    else:
        item.outcome = Outcome.HOLDS
        if item.estimate > limit:
            item.note = f"p90 TTFT +{item.difference:.1f} ms is within the {tol:g} ms tolerance"
    return item


def _latencies(records: Iterable[RequestRecord], metric: str) -> FloatArray:
    """One value per request, failed requests (and missing values) as +inf: they miss every SLO."""
    values = [getattr(r, _LATENCY_FIELDS[metric]) if r.ok else None for r in records]
    return np.array([math.inf if v is None else float(v) for v in values], dtype=np.float64)


def slo_guardrails(spec: ExperimentSpec, pairs: Pairs, *, confidence: float) -> list[GuardrailResult]:
    """One guardrail per SLO limit: the treatment's percentile against it.

    Estimate: the treatment's percentile (failed requests count as missing it); interval: the
    distribution-free order-statistic interval of that percentile. Breached: the estimate is over
    the limit; SurelyBreached: the lower bound is. NotEvaluated where the control misses the limit
    too (the stage's load is beyond the SLO either way; goodput compares the arms there).
    """
    out: list[GuardrailResult] = []
    for metric, percentile, ms in spec.analysis.slo.limits():
        name = f"slo{metric.capitalize()}P{percentile}"
        item = GuardrailResult(name=name, limit=ms, outcome=Outcome.NOT_EVALUATED)
        out.append(item)
        treated = _latencies(pairs.treatment.values(), metric)
        control = _latencies(pairs.control.values(), metric)
        if treated.size == 0 or control.size == 0:
            continue
        q = percentile / 100.0
        estimate = float(np.quantile(treated, q, method="inverted_cdf"))
        # Order statistics whose ranks a Binomial(n, q) brackets (scipy types it loosely); a rank
        # beyond the sample is NaN, a failed request +inf: neither goes to status (JSON has no such numbers).
        ci: Any = stats.quantile_test(treated, q=ms, p=q).confidence_interval(confidence)
        low = float(ci.low) if math.isfinite(ci.low) else (math.inf if ci.low == math.inf else -math.inf)
        item.estimate = estimate if math.isfinite(estimate) else None
        item.ci_low = low if math.isfinite(low) else None
        item.ci_high = float(ci.high) if math.isfinite(ci.high) else None
        if not math.isfinite(estimate):
            item.note = f"more than {100 - percentile}% of the treatment's requests failed"
        control_p = float(np.quantile(control, q, method="inverted_cdf"))
        if control_p > ms:
            item.note = (
                f"the control misses it too (p{percentile} {control_p:.4g} ms): goodput compares the arms"
            )
            continue
        item.outcome = _outcome(estimate, low, ms, upper_is_bad=True)
    return out


def goodput_guardrail(spec: ExperimentSpec, pairs: Pairs) -> GuardrailResult:
    """Goodput must not drop: the paired change of the fraction of requests meeting every SLO.

    Breached (blocks a Pass): the interval's upper bound is below 0 (goodput surely dropped);
    SurelyBreached: below -maxGoodputDrop. A drop within the noise changes nothing.
    """
    limit = spec.analysis.guardrails.max_goodput_drop or 0.0
    item = GuardrailResult(name="goodput", limit=limit, outcome=Outcome.NOT_EVALUATED)
    slo = spec.analysis.slo
    both = sorted(pairs.control.keys() & pairs.treatment.keys())
    change = paired_proportion_difference(
        [meets_slo(pairs.control[i], slo) for i in both],
        [meets_slo(pairs.treatment[i], slo) for i in both],
        confidence=spec.analysis.confidence,
    )
    if change is None:
        return item
    item.estimate, item.ci_low, item.ci_high = change
    if item.ci_high < -limit:
        item.outcome = Outcome.SURELY_BREACHED
    elif item.ci_high < 0.0:
        item.outcome = Outcome.BREACHED
    else:
        item.outcome = Outcome.HOLDS
    return item


def categories(
    spec: ExperimentSpec, both: Sequence[tuple[RequestRecord, RequestRecord]]
) -> list[CategoryResult]:
    """Speed-up (paired t interval, informative) and acceptance per prompt category, by name.

    Speculation helps code and math more than open chat; this shows which traffic benefits. Empty
    when no pair carries a category; pairs without one are left out.
    """
    return _groups(spec, both, lambda pair: pair[1].category or pair[0].category, order=str)


def turns(spec: ExperimentSpec, both: Sequence[tuple[RequestRecord, RequestRecord]]) -> list[CategoryResult]:
    """Multi-turn sessions: the same per turn index (`name` is the turn, from 1), in turn order.

    Later turns carry longer prompts, mostly served from the prefix cache; this shows whether the
    speed-up holds as a conversation grows. Empty without sessions.
    """
    return _groups(spec, both, lambda pair: None if pair[1].turn is None else str(pair[1].turn), order=int)


def _groups(
    spec: ExperimentSpec,
    both: Sequence[tuple[RequestRecord, RequestRecord]],
    key: Callable[[tuple[RequestRecord, RequestRecord]], str | None],
    *,
    order: Callable[[str], Any],
) -> list[CategoryResult]:
    """Speed-up and acceptance of the pairs grouped by `key` (None: left out), groups sorted by `order`."""
    a = spec.analysis
    by_name: dict[str, list[tuple[RequestRecord, RequestRecord]]] = {}
    for pair in both:
        name = key(pair)
        if name is not None:
            by_name.setdefault(name, []).append(pair)
    out: list[CategoryResult] = []
    for name in sorted(by_name, key=order):
        group = by_name[name]
        control, treatment = paired_values(group, a.primary_metric.value)
        mv = compare(
            control,
            treatment,
            metric=a.primary_metric.value,
            min_speedup=a.min_speedup,
            confidence=a.confidence,
            sequential_ci=False,
            higher_is_better=a.primary_metric is PrimaryMetric.THROUGHPUT,
        )
        acc = (
            acceptance_counts([t for _, t in group], None, k=spec.speculative.num_speculative_tokens)[0]
            if spec.speculates
            else None
        )
        out.append(
            CategoryResult(
                name=name,
                pairs=len(group),
                speedup=mv.effect,
                ci_low=mv.ci[0] if mv.ci else None,
                ci_high=mv.ci[1] if mv.ci else None,
                acceptance_rate=acc.rate if acc is not None else None,
                mean_length=acc.mean_length if acc is not None else None,
            )
        )
    return out


def _text_key(record: RequestRecord) -> str | None:
    return record.text_hash if record.text_hash is not None else record.text


def output_agreement(both: Sequence[tuple[RequestRecord, RequestRecord]]) -> tuple[int, int]:
    """(pairs with identical outputs, pairs whose outputs are known in both arms)."""
    compared = [(c, t) for c, t in both if _text_key(c) is not None and _text_key(t) is not None]
    return sum(_text_key(c) == _text_key(t) for c, t in compared), len(compared)


def _output_match(stage: StageResult) -> GuardrailResult | None:
    return next((g for g in stage.guardrails if g.name == "outputMatch"), None)


def _output_limit(stage: StageResult) -> float:
    om = _output_match(stage)
    return om.limit if om is not None else 1.0


def _is_critical(stage: StageResult) -> bool:
    """An output mismatch that rejects: any breach, or only a sure one with `baselineMismatchRate`
    (which the guardrail records as its `tolerance`)."""
    om = _output_match(stage)
    if om is None:
        return False
    if om.tolerance is not None:
        return om.outcome == Outcome.SURELY_BREACHED
    return om.outcome in {Outcome.BREACHED, Outcome.SURELY_BREACHED}


# --------------------------------------------------------------------------------------------- stages


@dataclass(frozen=True)
class StageValidity:
    """What the validity block says about one stage."""

    valid: bool
    reasons: list[str] = field(default_factory=list)


def stage_validity(validity: Mapping[str, Any] | None, stage: str) -> StageValidity:
    """The run's and the stage's validity (a missing block or key means valid)."""
    if not validity:
        return StageValidity(True)
    reasons = [str(r) for r in validity.get("reasons") or []]
    valid = bool(validity.get("valid", True))
    per_stage = (validity.get("stages") or {}).get(stage) or {}
    if isinstance(per_stage, Mapping):
        valid = valid and bool(per_stage.get("valid", True))
        reasons += [str(r) for r in per_stage.get("reasons") or []]
    return StageValidity(valid, reasons)


def batch_size(stage: Stage, treatment: Sequence[RequestRecord]) -> float | None:
    """Running requests in the treatment: concurrency, or rate × mean E2E (Little's law)."""
    if stage.concurrency is not None:
        return float(stage.concurrency)
    e2e = [r.e2e_ms for r in treatment if r.ok and r.e2e_ms is not None and math.isfinite(r.e2e_ms)]
    if stage.rate is None or not e2e:
        return None
    return stage.rate * (sum(e2e) / len(e2e)) / 1000.0


def analyse_stage(
    spec: ExperimentSpec,
    stage: Stage,
    records: Sequence[RequestRecord],
    window: StageWindow | None,
    *,
    validity: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> StageResult:
    """Summaries, speed-up, tails, acceptance, guardrails and the verdict of one stage."""
    a = spec.analysis
    rng = np.random.default_rng(seed)
    pairs = Pairs.of(r for r in records if r.stage == stage.name)
    result = StageResult(
        name=stage.name,
        load=stage.load_label,
        control=summarise_arm(list(pairs.control.values()), slo=a.slo, confidence=a.confidence),
        treatment=summarise_arm(list(pairs.treatment.values()), slo=a.slo, confidence=a.confidence),
        stopped_early=bool(window and window.stopped_early),
    )
    result.batch_size = batch_size(stage, list(pairs.treatment.values()))
    for arm, summary in ((CONTROL, result.control), (TREATMENT, result.treatment)):
        server_of_arm = window.server.get(arm) if window is not None else None
        summary.prefix_cache_hit_rate = server_of_arm.prefix_cache_hit_rate if server_of_arm else None
    metric = a.primary_metric.value
    both = pairs.both_ok()
    b, c = paired_values(both, metric)
    higher = a.primary_metric is PrimaryMetric.THROUGHPUT
    mv = compare(
        b,
        c,
        metric=metric,
        min_speedup=a.min_speedup,
        confidence=a.confidence,
        # An A/A stage runs in full (`stage_decided`): one look, the paired t interval over every pair.
        sequential_ci=a.sequential and spec.speculates,
        horizon=spec.stage_requests(stage),
        higher_is_better=higher,
        first_look=sequential.first_look(stage.concurrency),
    )
    result.speedup = Speedup(
        metric=metric,
        estimate=mv.effect,
        ci_low=mv.ci[0] if mv.ci else None,
        ci_high=mv.ci[1] if mv.ci else None,
        p_value=mv.p_value,
        n=mv.n,
        method=mv.method,
        decided_at=mv.decided_at,
        min_detectable=mv.detectable,
    )
    result.tails = quantile_speedups(
        b, c, metric=metric, confidence=a.confidence, rng=rng, higher_is_better=higher
    )
    server = window.server.get(TREATMENT) if window is not None else None
    result.acceptance, acc_counts = (
        acceptance_counts(list(pairs.treatment.values()), server, k=spec.speculative.num_speculative_tokens)
        if spec.speculates
        else (None, (0, 0))  # an A/A run drafts nothing: no acceptance to estimate, not even a proxy
    )
    result.guardrails = guardrails(spec, pairs, result.acceptance, rng=rng, acc_counts=acc_counts)
    result.categories = categories(spec, both)
    result.turns = turns(spec, both)
    om = _output_match(result)
    result.output_match = om.estimate if om is not None else None

    reasons: list[str] = []
    validity_of = stage_validity(validity, stage.name)
    control_list = list(pairs.control.values())
    control_err_low = (
        proportion_interval(sum(not r.ok for r in control_list), len(control_list), confidence=a.confidence)[
            0
        ]
        if control_list
        else 0.0
    )
    surely = [g for g in result.guardrails if g.outcome == Outcome.SURELY_BREACHED]
    breached = [g for g in result.guardrails if g.outcome == Outcome.BREACHED]
    for g in surely + breached:
        reasons.append(_guardrail_line(g))
    if _is_critical(result):
        verdict = StageVerdict.FAIL
        reasons.insert(0, "output mismatch under greedy sampling (critical)")
    elif not validity_of.valid:
        verdict = StageVerdict.INCONCLUSIVE
        reasons.insert(0, "invalid measurement: " + ("; ".join(validity_of.reasons) or "marked invalid"))
    elif not pairs.control or not pairs.treatment:
        verdict = StageVerdict.INCONCLUSIVE
        reasons.insert(
            0,
            "no data: "
            + (
                "no requests"
                if not (pairs.control or pairs.treatment)
                else f"no {CONTROL if not pairs.control else TREATMENT} requests"
            ),
        )
    elif control_err_low > a.guardrails.max_error_rate:
        verdict = StageVerdict.INCONCLUSIVE
        reasons.insert(0, "invalid measurement: the control arm fails too (errors are not speculation's)")
    elif surely:
        verdict = StageVerdict.FAIL
    elif mv.label is Label.NO_DATA:
        verdict = StageVerdict.INCONCLUSIVE
        reasons.insert(0, "no data: " + mv.reason)
    elif mv.label is Label.FAIL:
        verdict = StageVerdict.FAIL
        reasons.insert(0, mv.reason)
    elif mv.label is Label.PASS and not breached:
        verdict = StageVerdict.PASS
        reasons.insert(0, mv.reason)
    else:
        verdict = StageVerdict.INCONCLUSIVE
        reasons.insert(0, mv.reason)
    result.verdict = verdict
    result.reasons = reasons
    if verdict is StageVerdict.FAIL and spec.speculates:
        accepted, drafted = acc_counts
        result.break_even = breakeven.break_even(
            result.speedup,
            result.acceptance,
            k=spec.speculative.num_speculative_tokens,
            min_speedup=a.min_speedup,
            measured_interval=(
                proportion_interval(accepted, drafted, confidence=a.confidence) if drafted > 0 else None
            ),
        )
    return result


def _guardrail_line(g: GuardrailResult) -> str:
    bound = f" [{g.ci_low:.3g}, {g.ci_high:.3g}]" if g.ci_low is not None and g.ci_high is not None else ""
    est = f"{g.estimate:.3g}" if g.estimate is not None else "n/a"
    line = f"{g.name} {est}{bound} vs limit {g.limit:g}"
    if g.name.startswith("slo"):
        line += " ms"
    elif g.name == "goodput":
        line = f"goodput change {est}{bound} vs a drop of 0 (blocks) or {g.limit:g} (fails)"
    if g.difference is not None and g.tolerance is not None:
        diff = (
            f" [{g.difference_ci_low:.3g}, {g.difference_ci_high:.3g}]"
            if g.difference_ci_low is not None and g.difference_ci_high is not None
            else ""
        )
        line += f" and +{g.difference:.3g} ms{diff} vs tolerance {g.tolerance:g} ms"
    return f"{line}: {g.outcome}"


def _stage_code(stage: StageResult) -> Reason:
    """The machine reason behind one stage's verdict."""
    if _is_critical(stage):
        return Reason.OUTPUT_MISMATCH
    first = stage.reasons[0] if stage.reasons else ""
    if first.startswith("invalid measurement"):
        return Reason.INVALID_MEASUREMENT
    if first.startswith("no data"):
        return Reason.NO_DATA
    if stage.verdict is StageVerdict.PASS:
        return Reason.SPEEDUP_CONFIRMED
    if stage.verdict is StageVerdict.FAIL:
        if any(g.outcome == Outcome.SURELY_BREACHED for g in stage.guardrails):
            return Reason.GUARDRAIL_FAILED
        return Reason.SLOWER_THAN_REQUIRED
    return Reason.INSUFFICIENT_EVIDENCE


# -------------------------------------------------------------------------------------------- overall


def combine(require: str | list[str], stages: Sequence[StageResult]) -> tuple[Verdict, Reason]:
    """The overall verdict from the stage verdicts (the rule in the module docstring)."""
    if any(_is_critical(s) for s in stages):
        return Verdict.REJECT, Reason.OUTPUT_MISMATCH
    if not stages:
        return Verdict.INCONCLUSIVE, Reason.NO_DATA
    by_name = {s.name: s for s in stages}
    if require == "any":
        if any(s.verdict is StageVerdict.PASS for s in stages):
            return Verdict.PROMOTE, Reason.SPEEDUP_CONFIRMED
        if all(s.verdict is StageVerdict.FAIL for s in stages):
            return Verdict.REJECT, _worst_fail(stages)
        return Verdict.INCONCLUSIVE, _why_inconclusive(stages)
    names = [s.name for s in stages] if require == "all" else list(require)
    missing = [n for n in names if n not in by_name]
    required = [by_name[n] for n in names if n in by_name]
    failed = [s for s in required if s.verdict is StageVerdict.FAIL]
    if failed:
        return Verdict.REJECT, _worst_fail(failed)
    if not missing and required and all(s.verdict is StageVerdict.PASS for s in required):
        return Verdict.PROMOTE, Reason.SPEEDUP_CONFIRMED
    if missing:
        return Verdict.INCONCLUSIVE, Reason.NO_DATA
    return Verdict.INCONCLUSIVE, _why_inconclusive(
        [s for s in required if s.verdict is not StageVerdict.PASS]
    )


def _worst_fail(failed: Sequence[StageResult]) -> Reason:
    codes = {_stage_code(s) for s in failed}
    for code in (Reason.OUTPUT_MISMATCH, Reason.GUARDRAIL_FAILED):
        if code in codes:
            return code
    return Reason.SLOWER_THAN_REQUIRED


def _why_inconclusive(stages: Sequence[StageResult]) -> Reason:
    codes = {_stage_code(s) for s in stages}
    for code in (Reason.INVALID_MEASUREMENT, Reason.NO_DATA):
        if code in codes:
            return code
    return Reason.INSUFFICIENT_EVIDENCE


def recommend(spec: ExperimentSpec, stages: Sequence[StageResult]) -> Recommendation:
    """The recommendation over all stages (`_recommend`); where they measured more than one prompt
    length, also one per length (`byInputLength`), and the note says for which lengths the overall
    schedule holds: those whose own stages pass at every measured batch size up to its cut-off
    (issue 17)."""
    overall = _recommend(spec, stages)
    lengths = _input_lengths(spec, stages)
    if len(set(lengths.values())) < 2:
        return overall
    table: list[LengthRecommendation] = []
    for tokens in sorted(set(lengths.values())):
        own = _recommend(spec, [s for s in stages if lengths.get(s.name) == tokens])
        table.append(
            LengthRecommendation(
                input_tokens=tokens,
                beneficial_up_to=own.beneficial_up_to,
                num_speculative_tokens_per_batch_size=own.num_speculative_tokens_per_batch_size,
                note=own.note,
            )
        )
    cutoff = _passes_up_to(stages)
    same = [
        str(tokens)
        for tokens in sorted(set(lengths.values()))
        if _passes_up_to([s for s in stages if lengths.get(s.name) == tokens]) >= cutoff
    ]
    if cutoff == 0:  # no schedule to qualify: the table says where each length passes
        return overall.model_copy(update={"by_input_length": table})
    holds = f"holds for inputTokens {', '.join(same)} of {', '.join(str(r.input_tokens) for r in table)}"
    return overall.model_copy(update={"by_input_length": table, "note": f"{overall.note}; {holds}"})


def _passing(stages: Sequence[StageResult]) -> list[StageResult]:
    """The passing run from the lowest load: stages with a batch-size estimate, by batch size, up to
    the first that does not pass."""
    ordered = sorted((s for s in stages if s.batch_size is not None), key=lambda s: s.batch_size or 0.0)
    passing: list[StageResult] = []
    for s in ordered:
        if s.verdict is not StageVerdict.PASS:
            break
        passing.append(s)
    return passing


def _passes_up_to(stages: Sequence[StageResult]) -> float:
    """The batch size up to which the passing run reaches; 0 when speculation does not pass at the lowest load."""
    passing = _passing(stages)
    return passing[-1].batch_size or 0.0 if passing else 0.0


def _input_lengths(spec: ExperimentSpec, stages: Sequence[StageResult]) -> dict[str, int]:
    """Each stage's prompt length, by name, with a synthetic dataset (a search probe, not a listed
    stage, has the dataset's); empty with any other dataset."""
    dataset = spec.workload.dataset
    if not isinstance(dataset, SyntheticDataset):
        return {}
    listed = {stage.name: spec.stage_dataset(stage).input_tokens for stage in spec.workload.stages}
    return {s.name: listed.get(s.name, dataset.input_tokens) for s in stages}


def _recommend(spec: ExperimentSpec, stages: Sequence[StageResult]) -> Recommendation:
    """The highest load at which speculation still passes, and a vLLM batch-size schedule beyond it.

    Stages are ordered by their estimated batch size; the passing run is the one that starts at the
    lowest load (a pass above a non-passing stage is not trusted for the schedule). The schedule is
    `[[1, B, k], [B + 1, 4096, 0]]` with B the passing stage's batch size rounded down (we have no
    evidence beyond it), `[[1, 4096, k]]` when every stage passes.
    """
    k = spec.speculative.num_speculative_tokens
    ordered = sorted((s for s in stages if s.batch_size is not None), key=lambda s: s.batch_size or 0.0)
    if not ordered:
        return Recommendation(note="no stage has a batch-size estimate; no schedule suggested")
    passing = _passing(ordered)
    if not passing:
        return Recommendation(
            note=f"speculation did not pass at the lowest load ({ordered[0].name}); leave it off"
        )
    best = passing[-1]
    upto = max(1, math.floor(best.batch_size or 1.0))
    later_pass = [s.name for s in ordered[len(passing) :] if s.verdict is StageVerdict.PASS]
    extra = f"; also passes at {', '.join(later_pass)} (not monotone in load)" if later_pass else ""
    if k is None:
        return Recommendation(
            beneficial_up_to=best.name,
            note=f"passes up to ~{upto} running requests{extra}; numSpeculativeTokens unset, so no schedule",
        )
    release = releases.resolve(spec.engine)
    if len(passing) == len(ordered):
        return Recommendation(
            beneficial_up_to=best.name,
            num_speculative_tokens_per_batch_size=[[1, max(SCHEDULE_MAX_BATCH, upto), k]]
            if release.batch_schedule
            else None,
            note=f"passes at every measured load (up to ~{upto} running requests)",
        )
    schedule = [[1, upto, k], [upto + 1, max(SCHEDULE_MAX_BATCH, upto + 1), 0]]
    note = f"passes up to {best.name} (~{upto} running requests), not at {ordered[len(passing)].name}{extra}"
    if not release.batch_schedule:
        # Older releases cannot switch speculation off by batch size: say what they can do instead.
        return Recommendation(
            beneficial_up_to=best.name,
            note=(
                f"{note}; {release.short} has no num_speculative_tokens_per_batch_size (vLLM >= "
                f"{releases.minor(releases.BATCH_SCHEDULE_SINCE)} has it: {schedule}), so enable speculation only "
                f"where the load stays at or below ~{upto} running requests (e.g. a low-latency pool with "
                f"--max-num-seqs {upto}), or upgrade"
            ),
        )
    return Recommendation(
        beneficial_up_to=best.name, num_speculative_tokens_per_batch_size=schedule, note=note
    )


@dataclass(frozen=True)
class Analysis:
    """What the verdict writes into status."""

    stages: list[StageResult]
    verdict: Verdict | None
    """None: could not measure (reason NoData or InvalidMeasurement); the experiment ends Failed."""
    reason: str
    message: str
    speedup_summary: str
    recommendation: Recommendation | None
    noise_floor: NoiseFloor | None = None
    """The A/A result (`analysis.mode: NoiseFloor` only)."""

    @property
    def measured(self) -> bool:
        """A verdict was reached (Completed rather than Failed)."""
        return self.verdict is not None

    def apply(self, status: ExperimentStatus) -> ExperimentStatus:
        """A copy of `status` carrying this analysis (phase Completed, or Failed without a verdict)."""
        return status.model_copy(
            update={
                "phase": Phase.COMPLETED if self.measured else Phase.FAILED,
                "verdict": self.verdict,
                "reason": self.reason,
                "message": self.message,
                "speedup_summary": self.speedup_summary,
                "stages": self.stages,
                "recommendation": self.recommendation,
                "noise_floor": self.noise_floor,
            }
        )


def _fmt_speedup(s: StageResult) -> str:
    sp = s.speedup
    if sp is None or sp.estimate is None:
        return f"no data at {s.name}"
    ci = f" [{sp.ci_low:.2f}, {sp.ci_high:.2f}]" if sp.ci_low is not None and sp.ci_high is not None else ""
    return f"{sp.estimate:.2f}x{ci} at {s.name}"


# ---------------------------------------------------------------------------------------- noise floor


def stage_noise_floor(
    spec: ExperimentSpec, stage: Stage, records: Sequence[RequestRecord]
) -> StageNoiseFloor:
    """What one stage of an A/A run measured (the rule in the module docstring)."""
    a = spec.analysis
    pairs = Pairs.of(r for r in records if r.stage == stage.name)
    both = pairs.both_ok()
    b, c = paired_values(both, a.primary_metric.value)
    d = log_ratios(b, c, higher_is_better=a.primary_metric is PrimaryMetric.THROUGHPUT)
    n = int(d.size)
    result = StageNoiseFloor(name=stage.name, load=stage.load_label, pairs=n)
    if n >= MIN_PAIRS_FIXED:
        mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
        half = float(stats.t.ppf(0.5 + a.confidence / 2.0, n - 1)) * sd / math.sqrt(n)
        result.speedup = math.exp(mean)
        result.ci_low, result.ci_high = math.exp(mean - half), math.exp(mean + half)
        result.equivalent = 1.0 / a.min_speedup <= result.ci_low and result.ci_high <= a.min_speedup
        result.min_detectable = min_detectable(
            d,
            threshold=0.0,
            confidence=a.confidence,
            horizon=spec.stage_requests(stage),
            sequential_ci=a.sequential,
            first_look=sequential.first_look(stage.concurrency),
        )
        if result.min_detectable is not None:
            result.measurable = result.min_detectable <= a.min_speedup
    elif n:
        result.speedup = math.exp(float(np.mean(d)))
    if spec.workload.sampling.temperature == 0.0:
        same, compared = output_agreement(both)
        if compared:
            low, high = proportion_interval(
                compared - same, compared, confidence=a.confidence, method="wilson"
            )
            result.compared, result.mismatches = compared, compared - same
            result.mismatch_rate = (compared - same) / compared
            result.mismatch_ci_low, result.mismatch_ci_high = low, high
    return result


def noise_floor(spec: ExperimentSpec, records: Sequence[RequestRecord]) -> NoiseFloor:
    """The A/A result of every stage, and the pooled mismatch bound to carry into a Compare run."""
    a = spec.analysis
    stages = [stage_noise_floor(spec, st, records) for st in spec.workload.stages]
    compared = sum(s.compared for s in stages)
    mismatches = sum(s.mismatches for s in stages)
    suggested = None
    if compared:
        suggested = proportion_interval(mismatches, compared, confidence=a.confidence, method="wilson")[1]
    return NoiseFloor(
        min_speedup=a.min_speedup,
        stages=stages,
        measurable_stages=[s.name for s in stages if s.measurable],
        suggested_baseline_mismatch_rate=suggested,
        note=(
            f"both arms ran without speculation; the speculative config ({spec.speculative.method.value}) "
            "was validated, not used"
        ),
    )


def _noise_floor_message(nf: NoiseFloor) -> str:
    able = nf.measurable_stages
    unable = [
        f"{s.name} ({s.min_detectable:.3f}x)" if s.min_detectable is not None else f"{s.name} (unknown)"
        for s in nf.stages
        if not s.measurable
    ]
    line = f"noise floor (A/A): minSpeedup {nf.min_speedup:g} "
    if able and not unable:
        line += "is measurable at every stage"
    elif able:
        line += f"is measurable at {', '.join(able)}; not at {', '.join(unable)} (smallest detectable)"
    else:
        line += f"is measurable at no stage: {', '.join(unable)} (smallest detectable)"
    rates = [f"{s.name} {s.mismatch_rate:.1%}" for s in nf.stages if s.mismatch_rate is not None]
    if rates:
        line += "; identical servers' greedy outputs differ: " + ", ".join(rates)
    if nf.suggested_baseline_mismatch_rate is not None:
        line += f"; suggested baselineMismatchRate {nf.suggested_baseline_mismatch_rate:.3f}"
    return line


def _unjudged(stage: StageResult) -> StageResult:
    """A stage of an A/A run: its numbers and guardrail findings stay, its verdict does not apply."""
    findings = [
        _guardrail_line(g)
        for g in stage.guardrails
        if g.outcome in {Outcome.SURELY_BREACHED, Outcome.BREACHED}
    ]
    reasons = ["A/A run (analysis.mode NoiseFloor): measured, not judged", *findings]
    return stage.model_copy(update={"verdict": StageVerdict.INCONCLUSIVE, "reasons": reasons})


def analyse(
    spec: ExperimentSpec,
    records: Sequence[RequestRecord],
    windows: Sequence[StageWindow],
    *,
    validity: Mapping[str, Any] | None = None,
) -> Analysis:
    """The whole verdict from the records and stage windows of one run (warm-up excluded)."""
    measured = [r for r in records if not r.warmup]
    win = {w.stage: w for w in windows}
    stages = [
        analyse_stage(spec, st, measured, win.get(st.name), validity=validity, seed=spec.engine.seed + i)
        for i, st in enumerate(spec.workload.stages)
    ]
    metric = spec.analysis.primary_metric.value
    summary = ", ".join(
        f"{s.name} {s.speedup.estimate:.2f}x" if s.speedup and s.speedup.estimate else f"{s.name} -"
        for s in stages
    )
    message = f"{metric} speed-up " + "; ".join(_fmt_speedup(s) for s in stages)
    run_valid = stage_validity(validity, "")
    if not measured:
        return Analysis(stages, None, Reason.NO_DATA, "no measured requests", summary, None)
    if validity and not bool(validity.get("valid", True)):
        why = "; ".join(run_valid.reasons) or "the load generator marked the run invalid"
        return Analysis(
            stages, None, Reason.INVALID_MEASUREMENT, f"invalid measurement: {why}", summary, None
        )
    if spec.analysis.mode is AnalysisMode.NOISE_FLOOR:
        nf = noise_floor(spec, measured)
        return Analysis(
            [_unjudged(s) for s in stages],
            Verdict.INCONCLUSIVE,
            Reason.NOISE_FLOOR,
            _noise_floor_message(nf),
            summary,
            None,
            nf,
        )
    verdict, reason = combine(spec.analysis.require_stages, stages)
    if reason is Reason.OUTPUT_MISMATCH:
        bad = [s for s in stages if _is_critical(s)]
        message = (
            "output mismatch at "
            + ", ".join(f"{s.name} ({(s.output_match or 0.0):.1%} < {_output_limit(s):.1%})" for s in bad)
            + "; "
            + message
        )
    elif reason is Reason.GUARDRAIL_FAILED:
        lines = [
            f"{g.name} at {s.name}"
            for s in stages
            for g in s.guardrails
            if g.outcome == Outcome.SURELY_BREACHED
        ]
        message = "guardrail failed: " + ", ".join(lines) + "; " + message
    return Analysis(stages, verdict, reason, message, summary, recommend(spec, stages))


# ------------------------------------------------------------------------------------ sequential looks


def stage_look(
    analysis: AnalysisSpec,
    control: Sequence[RequestRecord],
    treatment: Sequence[RequestRecord],
    *,
    max_pairs: int,
    concurrency: int | None = None,
) -> sequential.Look:
    """The sequential state of a running stage (see `stage_decided`)."""
    pairs = Pairs.of([*control, *treatment]).prefix()
    metric = analysis.primary_metric.value
    b, c = paired_values(pairs.both_ok(), metric)
    d = log_ratios(b, c, higher_is_better=analysis.primary_metric is PrimaryMetric.THROUGHPUT)
    return sequential.look(
        d,
        threshold=math.log(analysis.min_speedup),
        confidence=analysis.confidence,
        horizon=max_pairs,
        first=sequential.first_look(concurrency),
    )


def stage_decided(
    analysis: AnalysisSpec,
    control: Sequence[RequestRecord],
    treatment: Sequence[RequestRecord],
    *,
    max_pairs: int,
    concurrency: int | None = None,
) -> bool:
    """May the load generator end this stage now? For the load generator's loop; pure and cheap.

    Call it at any time, as often as you like (after each completed pair, or every few): the
    design's looks are planned from `max_pairs` alone, so every call sees the same looks. Pass every
    finished record of the running stage for each arm (ok or failed, warm-up excluded) and the
    stage's request bound (`spec.stage_requests(stage)`) and its closed-loop concurrency (None: open
    loop), which set the design's looks. Only the longest run of indices finished
    in both arms is used. True when, at a planned look, the primary metric's repeated confidence
    interval lies wholly above or below minSpeedup, or the stage reached `max_pairs`; always False
    with `analysis.sequential` off, in an A/A run (`NoiseFloor`: it measures the full stage), or
    before the first planned look (`sequential.first_look`: 20 pairs, in a closed loop at least four
    waves of its concurrency). Guardrails are judged at the end on whatever ran.
    """
    if not analysis.sequential or analysis.mode is AnalysisMode.NOISE_FLOOR:
        return False
    return stage_look(analysis, control, treatment, max_pairs=max_pairs, concurrency=concurrency).decided
