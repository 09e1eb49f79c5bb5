"""The crossover: the placement effect of arms on different hosts, measured by swapping them (issue 22). Pure.

Every pair of requests shares the arms' placement, so the paired interval cannot see a host that is
faster or slower than the other: with the arms apart, the speed-up is the speculation's times the
placement's. The crossover repeats the stages with the placements swapped (the control where the
treatment ran, and back) and separates the two.

Model. Write T_a(H) for arm a's latency on host H, and y = log(T_control / T_treatment) for a round's
speed-up (log scale). Round 1 has the control on X and the treatment on Y, round 2 the reverse:

    y1 = log T_c(X) - log T_t(Y)        y2 = log T_c(Y) - log T_t(X)

    s = (y1 + y2) / 2 = (log[T_c(X) / T_t(X)] + log[T_c(Y) / T_t(Y)]) / 2
    f = (y1 - y2) / 2 = (log[T_c(X) / T_c(Y)] + log[T_t(X) / T_t(Y)]) / 2

So exp(s), the geometric mean of the two rounds' speed-ups, is the geometric mean of the speed-ups
the arms would show side by side on X and on Y: the host factor cancels, also when the host weighs
on the treatment more than on the control (the H200's small drafts: control 4.63-4.66 ms on three
hosts, the same treatment 2.92-4.08 ms). exp(f) is the placement effect in round 1: how much faster
(> 1) or slower (< 1) Y made the treatment look against X, averaged over both arms. Under a plain
host factor h (every step on Y is h times as fast) round 1 measures S·h, round 2 S/h, and exp(f) = h.

Intervals. Each round's interval gives its standard error on the log scale, se = log(high / low) /
(2z) with z the normal quantile of the analysis confidence (round 1's repeated interval of the
sequential design is wider than a fixed-horizon one, so this errs on the wide side). The rounds are
independent, so s and f both have se = sqrt(se1^2 + se2^2) / 2 and the interval exp(. ± z·se), at
the analysis confidence like the rounds'.

Rule. A stage that passes in round 1 stays Pass only when the speed-up without the placement clears
minSpeedup with its interval: exp(s)'s lower bound >= minSpeedup. Since s = y1 - f, this is the
placement effect f staying below the margin of round 1's estimate over minSpeedup, log(exp(y1) /
minSpeedup), less the combined interval's half-width: a placement effect comparable to that margin
turns the stage Inconclusive with the reason `PlacementEffect` (so does a swapped round without an
interval). Round 1's own lower bound is not the margin to compare with: the sequential design stops
a stage as soon as that bound clears minSpeedup, so it clears it by a hair, whatever the truth
(`benchmarks/verdict/crossover.py`: that rule kept 29% / 23% of true 1.32x wins on a 10% / 20%
faster node, this one 99.6% / 93%; neither promoted a neutral treatment there). The crossover never
turns a Fail or an Inconclusive stage into a Pass, and never promotes: it can only withhold a
promotion. Round 2's guardrails are not judged (round 1's decide).

Without a crossover (issue 35 item 3). A faster host is never credited to speculation: when the
arms' hosts differ (`status.environment.hostDifferences`: another node, GPU product, driver, a
simulated host's speed; servers given by URL on different hosts) and no swapped round ran, every
passing stage turns Inconclusive (`PlacementUnseparated`), so a Promote does, and the message says how
to get a decision (`unseparated`). Any other verdict keeps its reason and says that the speed-up may
partly be the placement (`placement.qualify`).

Owns `status.crossover` and `status.stages[].placement`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from specdecode.experiment import placement, recommendation, spec, verdict
from specdecode.experiment.status import (
    CrossoverPlacement,
    CrossoverResult,
    Environment,
    ReasonCode,
    Speedup,
    StagePlacement,
    StageResult,
    StageVerdict,
    Verdict,
)
from specdecode.experiment.validity import Validity

#: The reason of a stage, and of the verdict, that the placement effect made Inconclusive.
PLACEMENT_EFFECT = ReasonCode.PLACEMENT_EFFECT
#: The reason of a stage, and of the verdict, whose pass no crossover separated from the arms' hosts.
PLACEMENT_UNSEPARATED = ReasonCode.PLACEMENT_UNSEPARATED
#: Why the crossover did not run (`status.crossover.reason`).
NOT_APART = "NotApart"
SAME_PLACEMENT = "SamePlacement"
SERVERS_GIVEN = "ServersGiven"
NOT_MEASURED = "NotMeasured"
SWAPPED_ROUND_FAILED = "SwappedRoundFailed"
#: The fewest requests of a stage's swapped round (a paired t interval needs a few pairs).
MIN_SWAPPED_REQUESTS = 10


def wanted(analysis: spec.AnalysisSpec, environment: Environment | None) -> bool:
    """Whether the spec asks for the crossover given where the arms ran (before asking whether it can)."""
    if analysis.crossover is spec.Crossover.ALWAYS:
        return True
    if analysis.crossover is spec.Crossover.IF_APART:
        return bool(environment is not None and environment.host_differences)
    return False


def skipped(analysis: spec.AnalysisSpec, reason: str, message: str) -> CrossoverResult:
    """The status block of a crossover that did not run."""
    return CrossoverResult(mode=analysis.crossover.value, ran=False, reason=reason, message=message)


def not_apart(analysis: spec.AnalysisSpec) -> CrossoverResult:
    """IfApart, and the arms' hosts do not differ."""
    return skipped(analysis, NOT_APART, "the arms ran on hosts that do not differ: no crossover needed")


def swapped_spec(s: spec.ExperimentSpec) -> spec.ExperimentSpec:
    """The spec of the swapped round: every stage with `crossoverFraction` of its requests (at least
    MIN_SWAPPED_REQUESTS), fixed horizon (no sequential stopping: the paired t interval)."""
    fraction = s.analysis.crossover_fraction
    stages = [
        stage.model_copy(
            update={"requests": max(MIN_SWAPPED_REQUESTS, math.ceil(fraction * s.stage_requests(stage)))}
        )
        for stage in s.workload.stages
    ]
    workload = s.workload.model_copy(update={"stages": stages})
    analysis = s.analysis.model_copy(update={"sequential": False, "crossover": spec.Crossover.OFF})
    return s.model_copy(update={"workload": workload, "analysis": analysis})


def invalid(validity: Validity | None) -> str | None:
    """The `failure` of a swapped round whose load generator marked its measurement invalid (its
    summary's `validity`), else None."""
    if validity is None or validity.valid:
        return None
    why = "; ".join(validity.reasons) or "marked invalid"
    return f"its measurement is invalid: {why}"


def _log_interval(speedup: Speedup | None) -> tuple[float, float] | None:
    """(log estimate, log half-width) of a speed-up with an interval, else None."""
    if speedup is None or speedup.estimate is None or speedup.ci_low is None or speedup.ci_high is None:
        return None
    if min(speedup.estimate, speedup.ci_low, speedup.ci_high) <= 0:
        return None
    return math.log(speedup.estimate), math.log(speedup.ci_high / speedup.ci_low) / 2


def fold(first: Speedup | None, swapped: Speedup | None) -> StagePlacement:
    """The placement effect and the speed-up without it, from the two rounds (the module docstring);
    the intervals are at the confidence of the rounds' own."""
    one, two = _log_interval(first), _log_interval(swapped)
    if one is None or two is None:
        return StagePlacement(swapped=swapped)
    (y1, h1), (y2, h2) = one, two
    half = math.hypot(h1, h2) / 2  # each round's half-width is z * se: this is z * sqrt(se1^2 + se2^2) / 2
    s, f = (y1 + y2) / 2, (y1 - y2) / 2
    return StagePlacement(
        effect=math.exp(f),
        ci_low=math.exp(f - half),
        ci_high=math.exp(f + half),
        speedup=math.exp(s),
        speedup_ci_low=math.exp(s - half),
        speedup_ci_high=math.exp(s + half),
        swapped=swapped,
    )


def judge(stage: StageResult, placed: StagePlacement, *, min_speedup: float) -> StageResult:
    """The stage with its placement; a Pass becomes Inconclusive when the speed-up without the
    placement does not clear minSpeedup with its interval (or could not be estimated)."""
    judged = stage.model_copy(update={"placement": placed})
    if stage.verdict is not StageVerdict.PASS:
        return judged
    if placed.effect is None or placed.speedup_ci_low is None:
        why = "placement effect unknown: the swapped round has no speed-up interval, so the pass may be the placement"
    elif placed.speedup_ci_low >= min_speedup:
        return judged
    else:
        why = (
            f"placement effect {placed.effect:.3f}x [{placed.ci_low:.3f}, {placed.ci_high:.3f}] is comparable to "
            f"the margin over minSpeedup {min_speedup:g}: without it the speed-up is {placed.speedup:.3f}x "
            f"[{placed.speedup_ci_low:.3f}, {placed.speedup_ci_high:.3f}]"
        )
    return judged.model_copy(
        update={
            "verdict": StageVerdict.INCONCLUSIVE,
            "code": ReasonCode.PLACEMENT_EFFECT,
            "reasons": [f"{PLACEMENT_EFFECT}: {why}", *stage.reasons],
            "placement": placed.model_copy(update={"demoted": True}),
        }
    )


def apply(
    s: spec.ExperimentSpec,
    analysis: verdict.Analysis,
    swapped: Sequence[StageResult],
    rounds: Sequence[CrossoverPlacement],
    *,
    failure: str | None = None,
) -> tuple[verdict.Analysis, CrossoverResult]:
    """Round 1's analysis with each stage's placement folded in and the verdict combined again,
    and the `status.crossover` block. A verdict can only lose its Promote here.

    `failure`: why the swapped round could not be measured (an arm that did not start or crashed, a
    measurement the load generator marked invalid): no stage has a placement estimate, so no pass
    stands, and the block says `ran: false`, `SwappedRoundFailed`."""
    a = s.analysis
    if analysis.verdict is None:
        return analysis, skipped(a, NOT_MEASURED, "no verdict to check")
    by_name = {stage.name: stage for stage in swapped}
    stages = [
        judge(
            stage,
            fold(stage.speedup, by_name[stage.name].speedup if stage.name in by_name else None),
            min_speedup=a.min_speedup,
        )
        for stage in analysis.stages
    ]
    demoted = [stage.name for stage in stages if stage.placement is not None and stage.placement.demoted]
    effects = {
        stage.name: round(stage.placement.effect, 4)
        for stage in stages
        if stage.placement is not None and stage.placement.effect is not None
    }
    result = CrossoverResult(
        mode=a.crossover.value, ran=True, rounds=list(rounds), effects=effects, demoted=demoted
    )
    result.message = _summary(stages)
    if failure is not None:
        result.ran, result.reason = False, SWAPPED_ROUND_FAILED
        result.message = f"crossover: the swapped round could not be measured ({failure}), so no pass stands"
    if not demoted:
        return replace(analysis, stages=stages, message=f"{analysis.message}; {result.message}"), result
    outcome, reason = verdict.combine(a.require_stages, stages)
    if outcome is Verdict.PROMOTE and analysis.verdict is not Verdict.PROMOTE:  # the invariant, checked
        raise AssertionError("the crossover turned a verdict into Promote")
    # Demoting only turns passes Inconclusive: a Promote that is lost is lost to the placement.
    reason_text = PLACEMENT_EFFECT if outcome is not analysis.verdict else analysis.reason
    del reason
    message = f"{analysis.message}; {result.message}"
    return (
        replace(
            analysis,
            stages=stages,
            verdict=outcome,
            reason=reason_text,
            message=message,
            recommendation=recommendation.recommend(s, stages),
        ),
        result,
    )


def unseparated(
    s: spec.ExperimentSpec,
    analysis: verdict.Analysis,
    environment: Environment | None,
    checked: CrossoverResult | None,
    *,
    servers_given: bool,
) -> verdict.Analysis:
    """The verdict once the rounds are folded, when the arms' hosts differ and no swapped round ran
    (`checked` None or not run; the module docstring): a pass is not promoted. `servers_given`: the
    arms are servers given by URL, which no crossover can move."""
    facts = placement.described(environment) if environment is not None else None
    if facts is None or analysis.verdict is None or (checked is not None and checked.ran):
        return analysis
    if analysis.verdict is not Verdict.PROMOTE:
        return replace(analysis, message=placement.qualify(analysis.message, environment))
    if servers_given:
        how = (
            "give both servers on one host, or let run --local start the arms (without --control-url and "
            "--treatment-url) with spec.analysis.crossover: IfApart"
        )
    elif checked is not None:
        how = f"co-locate the arms (spec.placement.colocate: Required); the crossover did not run ({checked.message})"
    else:
        how = "run the crossover (spec.analysis.crossover: IfApart) or co-locate the arms (spec.placement.colocate: Required)"
    why = (
        f"the arms ran on different hosts ({facts}) and no crossover separated the placement from the "
        "speed-up: a faster host is measured as a speed-up"
    )
    stages = [
        stage.model_copy(
            update={
                "verdict": StageVerdict.INCONCLUSIVE,
                "code": PLACEMENT_UNSEPARATED,
                "reasons": [f"{PLACEMENT_UNSEPARATED}: {why}", *stage.reasons],
            }
        )
        if stage.verdict is StageVerdict.PASS
        else stage
        for stage in analysis.stages
    ]
    outcome, _ = verdict.combine(s.analysis.require_stages, stages)
    if outcome is Verdict.PROMOTE:  # every pass was turned: the invariant, checked
        raise AssertionError("a pass the placement may have made was promoted")
    return replace(
        analysis,
        stages=stages,
        verdict=outcome,
        reason=PLACEMENT_UNSEPARATED,
        message=f"not promoted: {why}; to decide, {how}; {analysis.message}",
        recommendation=recommendation.recommend(s, stages),
    )


def _summary(stages: Sequence[StageResult]) -> str:
    """One line: the placement effect per stage, and which stages it turned Inconclusive."""
    parts = []
    for stage in stages:
        p = stage.placement
        if p is None or p.effect is None:
            parts.append(f"{stage.name} not estimated")
            continue
        part = (
            f"{p.effect:.2f}x [{p.ci_low:.2f}, {p.ci_high:.2f}] at {stage.name} "
            f"(speed-up without it {p.speedup:.2f}x [{p.speedup_ci_low:.2f}, {p.speedup_ci_high:.2f}])"
        )
        parts.append(part + (f": {PLACEMENT_EFFECT}, Inconclusive" if p.demoted else ""))
    return "crossover (placements swapped): placement effect " + "; ".join(parts)
