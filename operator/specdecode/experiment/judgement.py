"""The rounds after the stages folded into the stages' analysis: one fold for both lifecycles. Pure.

Once the stages are judged (Analyzing), the operator (`controller/collect.py`) and `run --local`
(`local/judging.py`) each read what the rounds measured — the operator from the load Jobs' results
and Prometheus, `run --local` from its files — into `Measured`, and call `fold`, which folds them
in, in the order of `rounds.py`: the search's probes (`search.progress`; the recommendation rests on
them too), the crossover's swapped round (`crossover.apply`; without one, arms on different hosts
withhold a Promote: `crossover.unseparated`), then the confirmation round
(`confirm.fold`); and says which round is owed next (`rounds.probe_round`, `rounds.crossover_round`,
`rounds.confirmation_round`), or that the verdict is final (`Folded.next_round` None).

Where the two differ — where the arms ran and whether they can swap, servers given by URL, arms
that ran one after the other — the caller says so in `Measured`; the rules are here once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from specdecode.experiment import confirm, crossover, recommendation, rounds, search, spec, verdict
from specdecode.experiment.records import Request, StageWindow
from specdecode.experiment.status import (
    CrossoverPlacement,
    CrossoverResult,
    Environment,
    ExperimentStatus,
    Recommendation,
    Round,
    SearchResult,
    StageResult,
)
from specdecode.experiment.validity import Validity
from specdecode.experiment.world import CollectFailure

ONE_AFTER_THE_OTHER = "OneAfterTheOther"
"""`status.search.reason` when the arms ran one after the other: no paired probe can be run."""


@dataclass(frozen=True)
class Measurement:
    """What one round measured: its records, its stage windows (with server metrics) and the load
    generator's validity block."""

    records: Sequence[Request]
    windows: Sequence[StageWindow]
    validity: Validity | None


@dataclass(frozen=True)
class Unmeasured:
    """A round that ended without a measurement: `message` says why (its `status.rounds[].message`,
    or why its results could not be read)."""

    message: str | None
    interrupted: bool = False
    """The run was interrupted during the round (`run --local`): `message` says how."""


@dataclass(frozen=True)
class Placement:
    """Where the arms ran, in the caller's words (node names; `run --local`: GPUs), for the crossover."""

    first: CrossoverPlacement
    """The stages' placement (an arm's None: unknown, so no round can swap them)."""
    swapped: CrossoverPlacement | None = None
    """The swapped round's placement (None: not known, listed only when the round measured)."""
    unswappable: tuple[str, str] | None = None
    """(reason, message) when there is nothing to swap (`crossover.SAME_PLACEMENT`, `SERVERS_GIVEN`)."""


@dataclass(frozen=True)
class Measured:
    """Everything the fold reads besides the stages' analysis: the rounds' measurements by round
    name (each ended round of `status.rounds`; a missing one counts as unmeasured), and what the
    caller knows about the arms."""

    rounds: Mapping[str, Measurement | Unmeasured]
    environment: Environment | None
    placement: Placement
    one_after_the_other: bool = False
    """The arms ran one after the other (GPUs for one arm only): no paired probe can be run."""
    arms_given: bool = False
    """The arms are servers given by URL: the treatment cannot be restarted for the confirmation."""
    notes: Sequence[str] = field(default_factory=tuple)
    """Clauses for the message after the analysis' own (before the confirmation's note)."""


@dataclass(frozen=True)
class Folded:
    """The stages' analysis with every round measured so far folded in, and the round owed next."""

    analysis: verdict.Analysis
    crossover: CrossoverResult | None
    search: SearchResult | None
    recommendation: Recommendation | None
    """The recommendation as it stands, with its confirmation when one was judged or not run."""
    message: str
    next_round: Round | None
    """A round is owed before the verdict (None: the verdict is final)."""
    confirmed: bool = False
    """The confirmation round was judged into `recommendation`."""


def fold(
    experiment: spec.ExperimentSpec, current: ExperimentStatus, analysis: verdict.Analysis, measured: Measured
) -> Folded | CollectFailure:
    """The stages' `analysis` with the rounds of `current` folded in (the module docstring); a
    `CollectFailure` only when the status lost a round's fields (an outdated CRD)."""
    found, owed = None, None
    if analysis.measured:
        searched = _search(experiment, current, measured)
        if isinstance(searched, CollectFailure):
            return searched
        found, owed = searched
    checked = None
    if owed is None:
        analysis, checked, owed = _crossover(experiment, current, analysis, measured)
    if owed is None:
        analysis = crossover.unseparated(
            experiment, analysis, measured.environment, checked, servers_given=measured.arms_given
        )
    if found is not None and found.probes and analysis.measured:  # the recommendation rests on them too
        analysis = replace(
            analysis, recommendation=recommendation.recommend(experiment, [*analysis.stages, *found.probes])
        )
    advised, note, confirmed = analysis.recommendation, None, False
    if owed is None and analysis.measured and experiment.analysis.confirm:
        advised, owed, note, confirmed = _confirmation(experiment, current, analysis, measured)
    message = "; ".join([analysis.message, *measured.notes, *([note] if note else [])])
    return Folded(analysis, checked, found, advised, message, owed, confirmed)


def _search(
    experiment: spec.ExperimentSpec, current: ExperimentStatus, measured: Measured
) -> tuple[SearchResult | None, Round | None] | CollectFailure:
    """`workload.search`: `status.search` from the probes measured so far (each judged as a stage)
    and the next probe's round if one is owed. A probe that could not be measured stops the search
    (`ProbeFailed`)."""
    wanted = experiment.workload.search
    if wanted is None:
        return None, None
    if measured.one_after_the_other:
        return unpaired(wanted), None
    judged: list[tuple[float, StageResult]] = []
    for round_ in rounds.probes(current):
        stage = rounds.probe_stage(experiment, round_)
        probe = _outcome(measured, round_)
        if not isinstance(probe, Measurement) or stage is None or round_.load is None:
            why = probe.message if isinstance(probe, Unmeasured) else round_.message
            return search.failed(wanted, judged, round_.name, why or "failed"), None
        index = round_.probe or len(judged) + 1
        result = search.judge_probe(
            experiment, stage, probe.records, probe.windows, validity=probe.validity, index=index
        )
        judged.append((round_.load, result))
    step, found = search.progress(wanted, judged)
    if step.next_load is None:
        return found, None
    owed = rounds.probe_round(wanted, len(judged) + 1, step.next_load)
    if rounds.find(current, owed.name) is not None:
        # The round kept its name but lost `probe` and `load`: the API server pruned the fields its
        # CRD does not know. Owing it again would run the same probe forever.
        return CollectFailure(
            "CrdOutdated",
            f"status.rounds[] lost the probe fields of {owed.name}: the installed CRD is older than the "
            "operator; apply crds/specdecodeexperiments.specdecode.io.yaml of the operator's release",
        )
    return found, owed


def unpaired(wanted: spec.Search) -> SearchResult:
    """`status.search` when the arms ran one after the other: no paired probe can be run."""
    alone = "the arms ran one after the other (GPUs for one arm only): no paired probe can be run"
    return SearchResult(axis=wanted.axis, reason=ONE_AFTER_THE_OTHER, message=alone)


def _crossover(
    experiment: spec.ExperimentSpec, current: ExperimentStatus, analysis: verdict.Analysis, measured: Measured
) -> tuple[verdict.Analysis, CrossoverResult | None, Round | None]:
    """`analysis.crossover`: the stages' analysis with the swapped round folded in and
    `status.crossover`, or the swapped round if it is owed (the third item)."""
    a = experiment.analysis
    if a.crossover is spec.Crossover.OFF:
        return analysis, None, None
    if analysis.verdict is None:
        return analysis, crossover.skipped(a, crossover.NOT_MEASURED, "no verdict to check"), None
    if not crossover.wanted(a, measured.environment):
        return analysis, crossover.not_apart(a), None
    where = measured.placement
    if where.unswappable is not None:
        return analysis, crossover.skipped(a, *where.unswappable), None
    first = where.first
    round_ = rounds.find(current, rounds.CROSSOVER)
    if round_ is None:
        if first.control is None or first.treatment is None:
            failure = "the arms' nodes are unknown"
            return (*crossover.apply(experiment, analysis, [], [first], failure=failure), None)
        swapped = CrossoverPlacement(control=first.treatment, treatment=first.control)
        return analysis, None, Round(name=rounds.CROSSOVER, nodes=swapped)
    swapped_round = _outcome(measured, round_)
    placements = [first] if where.swapped is None else [first, where.swapped]
    if isinstance(swapped_round, Unmeasured):
        # Round 1 stands as measured; the check it asked for did not happen, so no pass stands.
        failure = swapped_round.message or "failed"
        return (*crossover.apply(experiment, analysis, [], placements, failure=failure), None)
    invalid = crossover.invalid(swapped_round.validity)
    if invalid is not None:
        return (*crossover.apply(experiment, analysis, [], placements, failure=invalid), None)
    judged = verdict.analyse(
        rounds.load_spec(experiment, round_),
        swapped_round.records,
        swapped_round.windows,
        validity=swapped_round.validity,
    )
    return (*crossover.apply(experiment, analysis, judged.stages, placements), None)


def _confirmation(
    experiment: spec.ExperimentSpec, current: ExperimentStatus, analysis: verdict.Analysis, measured: Measured
) -> tuple[Recommendation | None, Round | None, str | None, bool]:
    """`analysis.confirm`: the recommendation with its confirmation, the round if it is owed, a note
    for the message, and whether the round was judged."""
    rec = analysis.recommendation
    round_ = rounds.find(current, rounds.CONFIRMATION)
    if round_ is None:
        schedule = rec.num_speculative_tokens_per_batch_size if rec is not None else None
        if measured.arms_given:
            return confirm.not_run(rec, confirm.Reason.ARMS_NOT_STARTED_HERE), None, None, False
        if schedule is None:
            return confirm.not_run(rec, confirm.Reason.NO_SCHEDULE), None, None, False
        crossed = rounds.find(current, rounds.CROSSOVER) is not None
        owed = rounds.confirmation_round(schedule, measured.environment, crossed=crossed)
        return rec, owed, None, False
    second = _outcome(measured, round_)
    if isinstance(second, Unmeasured) or round_.schedule is None:
        gone = second if isinstance(second, Unmeasured) else Unmeasured(round_.message)
        how = f"was {gone.message}" if gone.interrupted else f"failed: {gone.message}"
        failed = confirm.not_run(rec, confirm.Reason.ROUND_FAILED)
        return failed, None, f"the confirmation round {how}", False
    planned = confirm.plan(experiment, analysis.stages, round_.schedule)
    judged = confirm.judge(
        rounds.arm_spec(experiment, round_), planned, second.records, second.windows, validity=second.validity
    )
    return confirm.fold(rec or Recommendation(), judged), None, None, True


def _outcome(measured: Measured, round_: Round) -> Measurement | Unmeasured:
    """What the caller read of an ended round; a round that failed (or that the caller did not read)
    is unmeasured for the reason `status.rounds[]` gives, unless the caller says why itself."""
    given = measured.rounds.get(round_.name)
    if isinstance(given, Unmeasured) or (given is not None and round_.outcome != rounds.FAILED):
        return given
    return Unmeasured(round_.message)
