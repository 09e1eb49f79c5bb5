"""The rounds after the stages (`rounds.py`), phase by phase: a round owed starts with the judgement
so far kept in status (`start_round`), deploys the arms it starts again (`round_deploying`), runs its
load (`round_running`) and is judged in Analyzing with the stages. A round that fails does not fail
the experiment: it ends (`round_failed`), the stages judged without it. Pure.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from specdecode.experiment import failures, rounds, spec
from specdecode.experiment.conditions import ts
from specdecode.experiment.status import ExperimentStatus, Phase, Round
from specdecode.experiment.transitions import elapsed, enter, with_arm_refs
from specdecode.experiment.world import (
    Action,
    ArmState,
    Decision,
    Event,
    Judgement,
    Observed,
    Subject,
    Timing,
)


def start_round(
    subject: Subject, current: ExperimentStatus, judged: Judgement, round_: Round, now: datetime
) -> Decision:
    """The judgement so far kept in status (no verdict: the round may still change it), and the
    round's arms deployed; a search probe's load started at once (its arms stay as they are)."""
    assert subject.spec is not None
    interim = current.model_copy(
        update={
            "stages": judged.stages,
            "recommendation": judged.recommendation,
            "crossover": judged.crossover,
            "search": judged.search,
            "speedup_summary": judged.speedup_summary,
            "validity": judged.validity,
            "rounds": [*current.rounds, round_.model_copy(update={"started_at": ts(now)})],
        }
    )
    message = rounds.describe(subject.spec, round_)
    if round_.probe is not None:
        return enter(interim, subject, Phase.RUNNING, now, "SearchProbe", message, [Action.CREATE_LOAD])
    return enter(interim, subject, Phase.DEPLOYING, now, f"{round_.name}Round", message, [Action.CREATE_ARMS])


def _round_ready(observed: Observed, round_: Round) -> bool:
    """The round's arms are Ready: those it starts again with a Ready pod rendered for it."""
    started = rounds.started(round_)
    pods = serving_pods(observed, round_)
    return all(pods[arm] if arm in started else observed.arms.get(arm, ArmState()).ready for arm in spec.Arm)


def serving_pods(observed: Observed, round_: Round) -> dict[spec.Arm, list[str]]:
    """The Ready pods that serve each arm in the round: for an arm it starts again, those rendered
    for it (the old pod may still be Ready, and scraped, while it terminates)."""
    started = rounds.started(round_)
    return {
        arm: [
            p.name
            for p in observed.arms.get(arm, ArmState()).pods
            if p.ready and (arm not in started or p.round == round_.name)
        ]
        for arm in spec.Arm
    }


def round_deploying(
    subject: Subject,
    s: spec.ExperimentSpec,
    current: ExperimentStatus,
    round_: Round,
    observed: Observed,
    now: datetime,
    timing: Timing,
) -> Decision:
    current = with_arm_refs(subject, current, observed)
    failure = failures.pod_failure(observed, now, timing) or failures.creation_refused(observed, now, timing)
    if failure is not None:
        return round_failed(subject, current, round_, f"{failure[0]}: {failure[1]}", observed, now)
    ready = _round_ready(observed, round_)
    if ready and observed.scraped is not False:
        return enter(
            current,
            subject,
            Phase.RUNNING,
            now,
            "LoadStarted",
            f"{round_.name.lower()} round: the arms are Ready; running its load",
            [Action.CREATE_LOAD],
        )
    if elapsed(current, now) > timedelta(seconds=s.deadlines.deploy_seconds):
        waiting = "Prometheus did not report the arms scraped" if ready else "the arms were not Ready"
        return round_failed(
            subject,
            current,
            round_,
            f"DeployDeadlineExceeded: {waiting} within spec.deadlines.deploy ({s.deadlines.deploy})",
            observed,
            now,
        )
    return Decision(current, [Action.CREATE_ARMS])


def round_running(
    subject: Subject,
    s: spec.ExperimentSpec,
    current: ExperimentStatus,
    round_: Round,
    observed: Observed,
    now: datetime,
    timing: Timing,
) -> Decision:
    failure = failures.pod_failure(observed, now, timing, restarts_fail=True)
    if failure is not None:
        return round_failed(subject, current, round_, f"{failure[0]}: {failure[1]}", observed, now)
    disrupted = failures.arm_disruption(observed, current)
    if disrupted is not None:
        return round_failed(subject, current, round_, f"ArmDisrupted: {disrupted}", observed, now)
    job = observed.job
    stuck = failures.load_pod_failure(observed)
    if job.failed or stuck is not None:
        detail = stuck or job.message or job.reason or "the load Job failed"
        return round_failed(subject, current, round_, f"LoadJobFailed: {detail}", observed, now)
    if job.succeeded:
        measured = _ended(current, round_, rounds.MEASURED, None)
        what = f"{round_.name} probe" if round_.probe is not None else f"{round_.name.lower()} round"
        return enter(measured, subject, Phase.ANALYZING, now, "LoadFinished", f"{what}: judging", [])
    if elapsed(current, now) > timedelta(seconds=s.deadlines.run_seconds):
        return round_failed(
            subject,
            current,
            round_,
            f"RunDeadlineExceeded: the load did not finish within spec.deadlines.run ({s.deadlines.run})",
            observed,
            now,
        )
    return Decision(current, [Action.CREATE_LOAD])


def _ended(current: ExperimentStatus, round_: Round, outcome: str, message: str | None) -> ExperimentStatus:
    ended = round_.model_copy(update={"outcome": outcome, "message": message})
    return current.model_copy(update={"rounds": [*current.rounds[:-1], ended]})


def round_failed(
    subject: Subject,
    current: ExperimentStatus,
    round_: Round,
    why: str,
    observed: Observed,
    now: datetime,
) -> Decision:
    """The round is over without a measurement; the stages are judged again, the round's check not
    done (a probe: the search stops with the probes measured before it)."""
    failed = _ended(current, round_, rounds.FAILED, why)
    if round_.probe is not None:
        message = f"the search's {round_.name} probe failed ({why}); the search stops there"
    else:
        message = f"the {round_.name.lower()} round failed ({why}); judging the stages without it"
    decision = enter(
        failed,
        subject,
        Phase.ANALYZING,
        now,
        "RoundFailed",
        message,
        [Action.DELETE_LOAD] if observed.job.exists else [],
    )
    decision.events[0] = Event("Warning", "RoundFailed", decision.status.message or "")
    return decision
