"""The verdict: each stage judged from its pairs, the overall rule, the analysis written to status.

Pure: numpy/scipy on `Request`s and `StageWindow`s (records.py) in, status models (`status/`) out.
Owns `status.stages`, `verdict`, `reason`, `message`, `speedupSummary` and `recommendation`.

The verdict's jobs, one module each: the paired comparisons and their intervals (`comparison.py`),
the pairs and each arm's summary (`pairing.py`), draft acceptance (`acceptance.py`), the guardrails
and output equivalence (`guardrails.py`), the recommendation (`recommendation.py`) and the A/A noise
floor (`noisefloor.py`). This module puts them together per stage (`analyse_stage`) and over the
stages (`combine`, `analyse`), and answers the load generator's sequential looks (`stage_look`,
`stage_decided`).

Stage rule: invalid measurement or too few pairs -> Inconclusive; a guardrail SurelyBreached (or
output match Breached) -> Fail; speed-up upper bound < minSpeedup -> Fail; lower bound >= minSpeedup
and no guardrail Breached or Undecided (errorRate, outputMatch, goodput not yet shown to hold:
`guardrails.decided_guardrails`) -> Pass; otherwise Inconclusive.
Overall (`requireStages`): an output mismatch anywhere -> Reject. `all` / a list: any required stage
Fail -> Reject; all Pass -> Promote; else Inconclusive. `any`: one Pass -> Promote; all Fail -> Reject;
else Inconclusive. Inconclusive is never promoted. No measured request at all, or a run marked
invalid, is "could not measure": `verdict` None, the caller ends the experiment Failed.

The validity block (`validity.Validity`, from the load generator): a stage is judged on the run's
and its own `valid` and `reasons`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specdecode.experiment import breakeven, sequential
from specdecode.experiment.acceptance import acceptance_counts
from specdecode.experiment.comparison import (
    Label,
    MetricVerdict,
    compare,
    log_ratios,
    proportion_interval,
    quantile_speedups,
)
from specdecode.experiment.guardrails import (
    Outcome,
    categories,
    decided_guardrails,
    guardrails,
    is_critical,
    is_failing,
    output_limit,
    output_match,
    turns,
)
from specdecode.experiment.noisefloor import noise_floor, noise_floor_message
from specdecode.experiment.pairing import Pairs, in_flight, paired_values, sampling_unit, summarise_arm
from specdecode.experiment.recommendation import recommend
from specdecode.experiment.records import Request, StageWindow
from specdecode.experiment.spec import (
    AnalysisMode,
    AnalysisSpec,
    Arm,
    ExperimentSpec,
    PrimaryMetric,
    Stage,
)
from specdecode.experiment.status import (
    BreakEven,
    ExperimentStatus,
    GuardrailResult,
    NoiseFloor,
    Phase,
    ReasonCode,
    Recommendation,
    Speedup,
    StageResult,
    StageVerdict,
    Verdict,
)
from specdecode.experiment.validity import StageValidity, Validity, of_stage

# --------------------------------------------------------------------------------------------- stages


def batch_size(stage: Stage, treatment: Sequence[Request]) -> float | None:
    """Running requests in the treatment: concurrency, or rate × mean E2E (Little's law)."""
    if stage.concurrency is not None:
        return float(stage.concurrency)
    return in_flight(stage.rate, treatment)


def analyse_stage(
    spec: ExperimentSpec,
    stage: Stage,
    records: Sequence[Request],
    window: StageWindow | None,
    *,
    validity: Validity | None = None,
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
    for arm, summary in ((Arm.CONTROL, result.control), (Arm.TREATMENT, result.treatment)):
        server_of_arm = window.server.get(arm) if window is not None else None
        summary.prefix_cache_hit_rate = server_of_arm.prefix_cache_hit_rate if server_of_arm else None
    metric = a.primary_metric.value
    both = pairs.both_ok()
    b, c = paired_values(both, metric)
    higher = a.primary_metric is PrimaryMetric.THROUGHPUT
    unit = sampling_unit(stage.concurrency, stage.rate, list(pairs.treatment.values()))
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
        unit=unit,
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
        b, c, metric=metric, confidence=a.confidence, rng=rng, higher_is_better=higher, unit=unit
    )
    server = window.server.get(Arm.TREATMENT) if window is not None else None
    result.acceptance, acc_counts = (
        acceptance_counts(list(pairs.treatment.values()), server, k=spec.speculative.num_speculative_tokens)
        if spec.speculates
        else (None, (0, 0))  # an A/A run drafts nothing: no acceptance to estimate, not even a proxy
    )
    result.guardrails = guardrails(spec, pairs, result.acceptance, rng=rng, acc_counts=acc_counts, unit=unit)
    result.categories = categories(spec, both, unit=unit)
    result.turns = turns(spec, both, unit=unit)
    om = output_match(result)
    result.output_match = om.estimate if om is not None else None

    verdict, code, reasons = _judge(a, result, pairs, mv, of_stage(validity, stage.name))
    result.verdict, result.code, result.reasons = verdict, code, reasons
    if verdict is StageVerdict.FAIL and spec.speculates:
        result.break_even = _break_even(spec, result, acc_counts)
    return result


def _break_even(spec: ExperimentSpec, result: StageResult, acc_counts: tuple[int, int]) -> BreakEven | None:
    """The acceptance a failing stage would have needed, beside the one measured (`breakeven.py`)."""
    accepted, drafted = acc_counts
    return breakeven.break_even(
        result.speedup,
        result.acceptance,
        k=spec.speculative.num_speculative_tokens,
        min_speedup=spec.analysis.min_speedup,
        measured_interval=(
            proportion_interval(accepted, drafted, confidence=spec.analysis.confidence)
            if drafted > 0
            else None
        ),
    )


def _judge(
    a: AnalysisSpec, result: StageResult, pairs: Pairs, mv: MetricVerdict, validity: StageValidity
) -> tuple[StageVerdict, ReasonCode, list[str]]:
    """The stage rule on a measured stage (`result` with its guardrails): verdict, code, reason lines."""
    control_list = list(pairs.control.values())
    control_err_low = (
        proportion_interval(sum(not r.ok for r in control_list), len(control_list), confidence=a.confidence)[
            0
        ]
        if control_list
        else 0.0
    )
    findings = [g for g in result.guardrails if g.outcome == Outcome.SURELY_BREACHED] + [
        g for g in result.guardrails if g.outcome == Outcome.BREACHED
    ]
    undecided = [g for g in result.guardrails if g.outcome == Outcome.UNDECIDED]
    verdict, code, first = stage_rule(
        StageFacts(
            critical=is_critical(result),
            validity=validity,
            missing=_missing_arm(pairs),
            control_fails=control_err_low > a.guardrails.max_error_rate,
            surely_breached=any(g.outcome == Outcome.SURELY_BREACHED for g in findings),
            breached=any(g.outcome == Outcome.BREACHED for g in findings),
            undecided=[g.name for g in undecided],
            speedup=mv,
        )
    )
    reasons = [first] if first is not None else []
    reasons += [_guardrail_line(g) for g in findings]
    if code is ReasonCode.GUARDRAIL_UNDECIDED:
        reasons += [_guardrail_line(g) + (f" ({g.note})" if g.note else "") for g in undecided]
    if verdict is StageVerdict.FAIL and first is None and mv.ci is not None:
        # failed on a guardrail: the primary metric's own line says whether the speed-up held
        reasons.append(mv.reason)
    return verdict, code, reasons


@dataclass(frozen=True)
class StageFacts:
    """What the stage rule reads: the measurement's validity and data, the guardrails, the speed-up."""

    critical: bool
    """Greedy outputs differ beyond the allowance (`guardrails.is_critical`)."""
    validity: StageValidity
    missing: str | None
    """`no requests`, `no control requests`, `no treatment requests`; None when both arms have some."""
    control_fails: bool
    """The control's error rate, even at its lower bound, is beyond `maxErrorRate`."""
    surely_breached: bool
    breached: bool
    undecided: list[str]
    """Guardrails not yet shown to hold (`Outcome.UNDECIDED`): they block a Pass."""
    speedup: MetricVerdict


def stage_rule(f: StageFacts) -> tuple[StageVerdict, ReasonCode, str | None]:
    """The stage rule (module docstring): the first row that holds gives the verdict, its code and the
    first reason line (None: the guardrail lines say why)."""
    sp = f.speedup
    rows: tuple[tuple[bool, StageVerdict, ReasonCode, str | None], ...] = (
        (
            f.critical,
            StageVerdict.FAIL,
            ReasonCode.OUTPUT_MISMATCH,
            "output mismatch under greedy sampling (critical)",
        ),
        (
            not f.validity.valid,
            StageVerdict.INCONCLUSIVE,
            ReasonCode.INVALID_MEASUREMENT,
            "invalid measurement: " + ("; ".join(f.validity.reasons) or "marked invalid"),
        ),
        (f.missing is not None, StageVerdict.INCONCLUSIVE, ReasonCode.NO_DATA, f"no data: {f.missing}"),
        (
            f.control_fails,
            StageVerdict.INCONCLUSIVE,
            ReasonCode.INVALID_MEASUREMENT,
            "invalid measurement: the control arm fails too (errors are not speculation's)",
        ),
        (f.surely_breached, StageVerdict.FAIL, ReasonCode.GUARDRAIL_FAILED, None),
        (sp.label is Label.NO_DATA, StageVerdict.INCONCLUSIVE, ReasonCode.NO_DATA, "no data: " + sp.reason),
        (sp.label is Label.FAIL, StageVerdict.FAIL, ReasonCode.SLOWER_THAN_REQUIRED, sp.reason),
        (
            sp.label is Label.PASS and not f.breached and bool(f.undecided),
            StageVerdict.INCONCLUSIVE,
            ReasonCode.GUARDRAIL_UNDECIDED,
            f"{sp.reason}, but {' and '.join(f.undecided)} not shown to hold within the stage's"
            " requests: raise its requests (requestsPerStage) or its guardrail's limit",
        ),
        (
            sp.label is Label.PASS and not f.breached,
            StageVerdict.PASS,
            ReasonCode.SPEEDUP_CONFIRMED,
            sp.reason,
        ),
    )
    for holds, verdict, code, first in rows:
        if holds:
            return verdict, code, first
    return StageVerdict.INCONCLUSIVE, ReasonCode.INSUFFICIENT_EVIDENCE, sp.reason


def _missing_arm(pairs: Pairs) -> str | None:
    if pairs.control and pairs.treatment:
        return None
    if not (pairs.control or pairs.treatment):
        return "no requests"
    return f"no {Arm.CONTROL if not pairs.control else Arm.TREATMENT} requests"


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


# -------------------------------------------------------------------------------------------- overall


def combine(require: str | list[str], stages: Sequence[StageResult]) -> tuple[Verdict, ReasonCode]:
    """The overall verdict from the stage verdicts (the rule in the module docstring)."""
    if any(is_critical(s) for s in stages):
        return Verdict.REJECT, ReasonCode.OUTPUT_MISMATCH
    if not stages:
        return Verdict.INCONCLUSIVE, ReasonCode.NO_DATA
    by_name = {s.name: s for s in stages}
    if require == "any":
        if any(s.verdict is StageVerdict.PASS for s in stages):
            return Verdict.PROMOTE, ReasonCode.SPEEDUP_CONFIRMED
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
        return Verdict.PROMOTE, ReasonCode.SPEEDUP_CONFIRMED
    if missing:
        return Verdict.INCONCLUSIVE, ReasonCode.NO_DATA
    return Verdict.INCONCLUSIVE, _why_inconclusive(
        [s for s in required if s.verdict is not StageVerdict.PASS]
    )


def _worst_fail(failed: Sequence[StageResult]) -> ReasonCode:
    codes = {(s.code or ReasonCode.INSUFFICIENT_EVIDENCE) for s in failed}
    for code in (ReasonCode.OUTPUT_MISMATCH, ReasonCode.GUARDRAIL_FAILED):
        if code in codes:
            return code
    return ReasonCode.SLOWER_THAN_REQUIRED


def _why_inconclusive(stages: Sequence[StageResult]) -> ReasonCode:
    codes = {(s.code or ReasonCode.INSUFFICIENT_EVIDENCE) for s in stages}
    for code in (ReasonCode.INVALID_MEASUREMENT, ReasonCode.NO_DATA, ReasonCode.GUARDRAIL_UNDECIDED):
        if code in codes:
            return code
    return ReasonCode.INSUFFICIENT_EVIDENCE


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


def _unjudged(stage: StageResult) -> StageResult:
    """A stage of an A/A run: its numbers and guardrail findings stay, its verdict does not apply."""
    findings = [
        _guardrail_line(g)
        for g in stage.guardrails
        if g.outcome in {Outcome.SURELY_BREACHED, Outcome.BREACHED}
    ]
    reasons = ["A/A run (analysis.mode NoiseFloor): measured, not judged", *findings]
    return stage.model_copy(
        update={"verdict": StageVerdict.INCONCLUSIVE, "code": ReasonCode.NOISE_FLOOR, "reasons": reasons}
    )


#: The verdict reasons whose message names the guardrails: (the outcome named, the message's words).
_GUARDRAIL_OUTCOMES = {
    ReasonCode.GUARDRAIL_FAILED: (Outcome.SURELY_BREACHED, "guardrail failed"),
    ReasonCode.GUARDRAIL_UNDECIDED: (Outcome.UNDECIDED, "guardrail undecided (not shown to hold)"),
}


def analyse(
    spec: ExperimentSpec,
    records: Sequence[Request],
    windows: Sequence[StageWindow],
    *,
    validity: Validity | None = None,
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
    if not measured:
        return Analysis(stages, None, ReasonCode.NO_DATA, "no measured requests", summary, None)
    if validity is not None and not validity.valid:
        why = "; ".join(validity.reasons) or "the load generator marked the run invalid"
        return Analysis(
            stages, None, ReasonCode.INVALID_MEASUREMENT, f"invalid measurement: {why}", summary, None
        )
    if spec.analysis.mode is AnalysisMode.NOISE_FLOOR:
        nf = noise_floor(spec, measured)
        return Analysis(
            [_unjudged(s) for s in stages],
            Verdict.INCONCLUSIVE,
            ReasonCode.NOISE_FLOOR,
            noise_floor_message(nf),
            summary,
            None,
            nf,
        )
    verdict, reason = combine(spec.analysis.require_stages, stages)
    if reason is ReasonCode.OUTPUT_MISMATCH:
        bad = [s for s in stages if is_critical(s)]
        message = (
            "output mismatch at "
            + ", ".join(f"{s.name} ({(s.output_match or 0.0):.1%} < {output_limit(s):.1%})" for s in bad)
            + "; "
            + message
        )
    elif reason in _GUARDRAIL_OUTCOMES:
        outcome, words = _GUARDRAIL_OUTCOMES[reason]
        lines = [f"{g.name} at {s.name}" for s in stages for g in s.guardrails if g.outcome == outcome]
        message = f"{words}: " + ", ".join(lines) + "; " + message
    return Analysis(stages, verdict, reason, message, summary, recommend(spec, stages))


# ------------------------------------------------------------------------------------ sequential looks


def stage_look(
    analysis: AnalysisSpec,
    control: Sequence[Request],
    treatment: Sequence[Request],
    *,
    max_pairs: int,
    concurrency: int | None = None,
    rate: float | None = None,
) -> sequential.Look:
    """The sequential state of a running stage (see `stage_decided`)."""
    return _look(
        analysis,
        Pairs.of([*control, *treatment]).prefix(),
        treatment,
        max_pairs=max_pairs,
        concurrency=concurrency,
        rate=rate,
    )


def _look(
    analysis: AnalysisSpec,
    pairs: Pairs,
    treatment: Sequence[Request],
    *,
    max_pairs: int,
    concurrency: int | None,
    rate: float | None,
) -> sequential.Look:
    """`stage_look` on the complete prefix `pairs` already built."""
    metric = analysis.primary_metric.value
    b, c = paired_values(pairs.both_ok(), metric)
    d = log_ratios(b, c, higher_is_better=analysis.primary_metric is PrimaryMetric.THROUGHPUT)
    return sequential.look(
        d,
        threshold=math.log(analysis.min_speedup),
        confidence=analysis.confidence,
        horizon=max_pairs,
        first=sequential.first_look(concurrency),
        unit=sampling_unit(concurrency, rate, treatment),
    )


def stage_decided(
    analysis: AnalysisSpec,
    control: Sequence[Request],
    treatment: Sequence[Request],
    *,
    max_pairs: int,
    concurrency: int | None = None,
    rate: float | None = None,
    greedy: bool = True,
) -> bool:
    """May the load generator end this stage now? For the load generator's loop; pure and cheap.

    Call it at any time, as often as you like (after each completed pair, or every few): the
    design's looks are planned from `max_pairs` alone, so every call sees the same looks. Pass every
    finished record of the running stage for each arm (ok or failed, warm-up excluded) and the
    stage's request bound (`spec.stage_requests(stage)`) and its closed-loop concurrency (None: open
    loop, then its `rate`), which set the design's looks and its sampling unit (`sampling_unit`). Only the longest run of indices finished
    in both arms is used. True when, at a planned look, the primary metric's repeated confidence
    interval lies wholly above or below minSpeedup, or the stage reached `max_pairs`; always False
    with `analysis.sequential` off, in an A/A run (`NoiseFloor`: it measures the full stage), or
    before the first planned look (`sequential.first_look`: 20 pairs, in a closed loop at least four
    waves of its concurrency). A speed-up shown above minSpeedup stops the stage only once the
    guardrails that must be shown to hold (`guardrails.decided_guardrails`; output match with
    `greedy`, temperature 0) are decided; one that fails the stage whatever follows stops it at
    once. The other guardrails are judged at the end on whatever ran.
    """
    if not analysis.sequential or analysis.mode is AnalysisMode.NOISE_FLOOR:
        return False
    pairs = Pairs.of([*control, *treatment]).prefix()
    pending = decided_guardrails(analysis, pairs, greedy=greedy)
    if any(is_failing(g) for g in pending):
        return True
    look = _look(analysis, pairs, treatment, max_pairs=max_pairs, concurrency=concurrency, rate=rate)
    if not look.decided or look.why != "above" or look.n >= max_pairs:
        return look.decided
    return all(g.outcome in {Outcome.HOLDS, Outcome.NOT_EVALUATED} for g in pending)
