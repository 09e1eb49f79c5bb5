"""Guardrails of a stage, each with its own uncertainty, and the output-equivalence check.

Pure; owns `status.stages[].guardrails`, `categories` and `turns`.

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
The proportion guardrails (errorRate, outputMatch, goodput: `decided_guardrails`) must also be shown
to hold: a lossy or failing treatment is a rare event that a short stage may not show at all (a 5%
mismatch shows none in 20 pairs a third of the time). Their outcome is Holds only when the
one-sided bound at the analysis confidence is within the limit (errorRate's upper, outputMatch's
lower, goodput's lower against -maxGoodputDrop); an estimate within the limit whose bound is not is
Undecided, which blocks a Pass and keeps the load generator running the stage (`verdict.stage_decided`)
until it is decided or the stage's budget ends. With no failure at all, errorRate <= 1% is shown
after 299 requests at 95% and outputMatch >= 0.99 after 299 identical pairs (`pairs_to_show`):
the default `requestsPerStage` 300 is enough. A limit at the boundary (`maxErrorRate` 0,
`minOutputMatch` 1) cannot be shown by a bound: there, no failure observed holds.
Goodput per arm (status `goodput`): requests that succeeded with every SLO metric within its
largest limit / requests sent, Wilson interval, and per second of the arm's own active time.
Output mismatch under greedy sampling is critical: Breached already fails the stage, and anywhere it
happens the experiment is rejected (the minOutputMatch tolerance is the allowance for numeric noise).
Output match is not evaluated with temperature > 0. Two identical servers need not agree bitwise
either (batching changes the order of floating-point sums): `guardrails.baselineMismatchRate`, the
rate an A/A run measured, is taken off the limit, and then only a sure breach (the whole interval
below the limit) is critical.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any

import numpy as np
from scipy import stats

from specdecode.experiment.acceptance import acceptance_counts
from specdecode.experiment.comparison import (
    FloatArray,
    compare,
    paired_proportion_difference,
    proportion_interval,
    quantile_change,
)
from specdecode.experiment.pairing import LATENCY_FIELDS, Pairs, meets_slo, paired_values
from specdecode.experiment.records import Request
from specdecode.experiment.spec import (
    AnalysisSpec,
    ExperimentSpec,
    PrimaryMetric,
)
from specdecode.experiment.status import (
    Acceptance,
    CategoryResult,
    GuardrailResult,
    StageResult,
)


class Outcome(StrEnum):
    """What a guardrail decided."""

    HOLDS = "Holds"
    """The estimate is within the limit."""
    BREACHED = "Breached"
    """The estimate is beyond the limit: blocks a Pass."""
    SURELY_BREACHED = "SurelyBreached"
    """The favourable bound is beyond the limit: fails the stage."""
    UNDECIDED = "Undecided"
    """A proportion guardrail whose estimate is within the limit but not yet its one-sided bound:
    blocks a Pass; the load generator runs the stage on."""
    NOT_EVALUATED = "NotEvaluated"
    """No data, or not applicable (e.g. output match with sampling)."""


def _outcome(
    estimate: float,
    favourable: float,
    limit: float,
    *,
    upper_is_bad: bool,
    unfavourable: float | None = None,
) -> Outcome:
    """Holds / Breached / SurelyBreached from the estimate and the favourable bound; with the
    `unfavourable` (one-sided) bound, a Holds whose bound is beyond the limit is Undecided."""
    if upper_is_bad:
        if favourable > limit:
            return Outcome.SURELY_BREACHED
        if estimate > limit:
            return Outcome.BREACHED
        return Outcome.UNDECIDED if unfavourable is not None and unfavourable > limit else Outcome.HOLDS
    if favourable < limit:
        return Outcome.SURELY_BREACHED
    if estimate < limit:
        return Outcome.BREACHED
    return Outcome.UNDECIDED if unfavourable is not None and unfavourable < limit else Outcome.HOLDS


def _two_sided_level(confidence: float) -> float:
    """The two-sided level whose each limit is a one-sided bound at `confidence`: 2·confidence - 1."""
    return max(0.0, 2 * confidence - 1)


def one_sided(successes: int, trials: int, *, confidence: float, upper: bool) -> float:
    """The one-sided Clopper-Pearson bound at `confidence`."""
    low, high = proportion_interval(successes, trials, confidence=_two_sided_level(confidence))
    return high if upper else low


def pairs_to_show(rate: float, confidence: float) -> int | None:
    """Trials without a single event after which the one-sided bound shows the event rate <= `rate`
    (299 for 1% at 95%); None when no number can (`rate` 0: observed only)."""
    if rate <= 0.0:
        return None
    if rate >= 1.0:
        return 1
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - rate))


def guardrails(
    spec: ExperimentSpec,
    pairs: Pairs,
    acc: Acceptance | None,
    *,
    rng: np.random.Generator,
    acc_counts: tuple[int, int] = (0, 0),
    unit: int = 1,
) -> list[GuardrailResult]:
    """Every configured guardrail of one stage, with its estimate, interval and outcome (`unit`: the
    stage's sampling unit in pairs, the bootstrap's block)."""
    g = spec.analysis.guardrails
    conf = spec.analysis.confidence
    out: list[GuardrailResult] = []
    both = pairs.both_ok()

    if g.max_ttft_regression is not None:
        out.append(ttft_regression(spec, both, rng=rng, unit=unit))
    out.extend(slo_guardrails(spec, pairs, confidence=conf))

    out.extend(decided_guardrails(spec.analysis, pairs, greedy=spec.workload.sampling.temperature == 0.0))

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


def decided_guardrails(analysis: AnalysisSpec, pairs: Pairs, *, greedy: bool) -> list[GuardrailResult]:
    """The guardrails that must be shown to hold (Undecided otherwise): goodput (with SLOs and
    `maxGoodputDrop`), errorRate, and outputMatch (`greedy`: temperature 0). What the stage rule
    and the load generator's stop rule both read."""
    g = analysis.guardrails
    out: list[GuardrailResult] = []
    if g.max_goodput_drop is not None and analysis.slo.limits():
        out.append(goodput_guardrail(analysis, pairs))
    out.append(error_rate(analysis, list(pairs.treatment.values())))
    out.append(output_equivalence(analysis, pairs.both_ok(), greedy=greedy))
    return out


def error_rate(analysis: AnalysisSpec, treated: Sequence[Request]) -> GuardrailResult:
    """The treatment's failed fraction against `maxErrorRate`; Holds once its one-sided upper bound is within."""
    limit, conf = analysis.guardrails.max_error_rate, analysis.confidence
    item = GuardrailResult(name="errorRate", limit=limit, outcome=Outcome.NOT_EVALUATED)
    if not treated:
        return item
    errors = sum(not r.ok for r in treated)
    low, high = proportion_interval(errors, len(treated), confidence=conf)
    item.estimate, item.ci_low, item.ci_high = errors / len(treated), low, high
    bound = one_sided(errors, len(treated), confidence=conf, upper=True) if limit > 0 else None
    item.outcome = _outcome(item.estimate, low, limit, upper_is_bad=True, unfavourable=bound)
    if item.outcome == Outcome.UNDECIDED and bound is not None:
        item.note = _undecided_note("upper", bound, limit, pairs_to_show(limit, conf), "failure", conf)
    return item


def output_equivalence(
    analysis: AnalysisSpec, both: Sequence[tuple[Request, Request]], *, greedy: bool
) -> GuardrailResult:
    """Identical greedy outputs against `minOutputMatch` (less `baselineMismatchRate`); Holds once
    the one-sided lower bound is within. Not evaluated with sampling (`greedy` False)."""
    g, conf = analysis.guardrails, analysis.confidence
    baseline = g.baseline_mismatch_rate
    limit = g.min_output_match if baseline is None else max(0.0, g.min_output_match - baseline)
    item = GuardrailResult(name="outputMatch", limit=limit, tolerance=baseline, outcome=Outcome.NOT_EVALUATED)
    same, compared = output_agreement(both) if greedy else (0, 0)
    if not compared:
        return item
    low, high = proportion_interval(same, compared, confidence=conf)
    item.estimate, item.ci_low, item.ci_high = same / compared, low, high
    bound = one_sided(same, compared, confidence=conf, upper=False) if limit < 1.0 else None
    item.outcome = _outcome(item.estimate, high, limit, upper_is_bad=False, unfavourable=bound)
    if baseline is not None and item.outcome == Outcome.BREACHED:
        item.note = (
            f"below minOutputMatch - baselineMismatchRate = {limit:.3g}, but within the noise"
            " of what identical servers already disagree on: blocks a Pass, not critical"
        )
    elif item.outcome == Outcome.UNDECIDED and bound is not None:
        item.note = _undecided_note("lower", bound, limit, pairs_to_show(1.0 - limit, conf), "mismatch", conf)
    return item


def _undecided_note(
    side: str, bound: float, limit: float, needed: int | None, event: str, conf: float
) -> str:
    return f"not yet shown: the one-sided {conf:.0%} {side} bound {bound:.3g} is beyond {limit:g}" + (
        f"; showing it takes at least {needed} requests without a {event}" if needed is not None else ""
    )


def is_failing(g: GuardrailResult) -> bool:
    """The guardrail fails the stage whatever more pairs show: SurelyBreached, or an output
    mismatch that is critical (`is_critical`)."""
    if g.outcome == Outcome.SURELY_BREACHED:
        return True
    return g.name == "outputMatch" and g.tolerance is None and g.outcome == Outcome.BREACHED


def ttft_regression(
    spec: ExperimentSpec, both: Sequence[tuple[Request, Request]], *, rng: np.random.Generator, unit: int = 1
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
    change = quantile_change(b, c, quantile=0.9, confidence=spec.analysis.confidence, rng=rng, unit=unit)
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


def _latencies(records: Iterable[Request], metric: str) -> FloatArray:
    """One value per request, failed requests (and missing values) as +inf: they miss every SLO."""
    values = [getattr(r, LATENCY_FIELDS[metric]) if r.ok else None for r in records]
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


def goodput_guardrail(analysis: AnalysisSpec, pairs: Pairs) -> GuardrailResult:
    """Goodput must not drop: the paired change of the fraction of requests meeting every SLO.

    Breached (blocks a Pass): the interval's upper bound is below 0 (goodput surely dropped);
    SurelyBreached: below -maxGoodputDrop. Holds once the one-sided lower bound shows the drop is
    at most maxGoodputDrop; before that Undecided.
    """
    limit = analysis.guardrails.max_goodput_drop or 0.0
    item = GuardrailResult(name="goodput", limit=limit, outcome=Outcome.NOT_EVALUATED)
    slo = analysis.slo
    both = sorted(pairs.control.keys() & pairs.treatment.keys())
    control = [meets_slo(pairs.control[i], slo) for i in both]
    treatment = [meets_slo(pairs.treatment[i], slo) for i in both]
    change = paired_proportion_difference(control, treatment, confidence=analysis.confidence)
    if change is None:
        return item
    item.estimate, item.ci_low, item.ci_high = change
    if item.ci_high < -limit:
        item.outcome = Outcome.SURELY_BREACHED
    elif item.ci_high < 0.0:
        item.outcome = Outcome.BREACHED
    else:
        one = paired_proportion_difference(
            control, treatment, confidence=_two_sided_level(analysis.confidence)
        )
        bound = one[1] if one is not None else -math.inf
        item.outcome = Outcome.HOLDS if bound >= -limit else Outcome.UNDECIDED
        if item.outcome == Outcome.UNDECIDED:
            item.note = (
                f"not yet shown: the one-sided {analysis.confidence:.0%} lower bound {bound:.3g}"
                f" allows a drop beyond {limit:g}"
            )
    return item


def categories(
    spec: ExperimentSpec, both: Sequence[tuple[Request, Request]], *, unit: int = 1
) -> list[CategoryResult]:
    """Speed-up (paired t interval, informative) and acceptance per prompt category, by name.

    Speculation helps code and math more than open chat; this shows which traffic benefits. Empty
    when no pair carries a category; pairs without one are left out. `unit`: the stage's sampling
    unit in pairs (`_groups`).
    """
    return _groups(spec, both, lambda pair: pair[1].category or pair[0].category, order=str, unit=unit)


def turns(
    spec: ExperimentSpec, both: Sequence[tuple[Request, Request]], *, unit: int = 1
) -> list[CategoryResult]:
    """Multi-turn sessions: the same per turn index (`name` is the turn, from 1), in turn order.

    Later turns carry longer prompts, mostly served from the prefix cache; this shows whether the
    speed-up holds as a conversation grows. Empty without sessions.
    """
    return _groups(
        spec, both, lambda pair: None if pair[1].turn is None else str(pair[1].turn), order=int, unit=unit
    )


def _groups(
    spec: ExperimentSpec,
    both: Sequence[tuple[Request, Request]],
    key: Callable[[tuple[Request, Request]], str | None],
    *,
    order: Callable[[str], Any],
    unit: int = 1,
) -> list[CategoryResult]:
    """Speed-up and acceptance of the pairs grouped by `key` (None: left out), groups sorted by `order`.

    A group's pairs share engine batches as the stage's do: a group with a share s of the stage's
    pairs has about s·`unit` of them in each sampling unit, its interval's unit (issue 35 item 1)."""
    a = spec.analysis
    by_name: dict[str, list[tuple[Request, Request]]] = {}
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
            unit=max(1, round(unit * len(group) / len(both))),
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


def _text_key(record: Request) -> str | None:
    return record.text_hash if record.text_hash is not None else record.text


def output_agreement(both: Sequence[tuple[Request, Request]]) -> tuple[int, int]:
    """(pairs with identical outputs, pairs whose outputs are known in both arms)."""
    keys = [(_text_key(c), _text_key(t)) for c, t in both]
    compared = [(a, b) for a, b in keys if a is not None and b is not None]
    return sum(a == b for a, b in compared), len(compared)


def output_match(stage: StageResult) -> GuardrailResult | None:
    return next((g for g in stage.guardrails if g.name == "outputMatch"), None)


def output_limit(stage: StageResult) -> float:
    om = output_match(stage)
    return om.limit if om is not None else 1.0


def is_critical(stage: StageResult) -> bool:
    """An output mismatch that rejects: any breach, or only a sure one with `baselineMismatchRate`
    (which the guardrail records as its `tolerance`)."""
    om = output_match(stage)
    return om is not None and is_failing(om)
