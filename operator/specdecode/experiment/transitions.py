"""How a decision moves an experiment's status: into a phase (`enter`), into Failed with the
cleanup its policy asks (`fail`, `cleaned_up`; a cleanup that failed is retried, `retry_cleanup`), and what each phase reads of the status (the
time spent in it, `elapsed`; the arms' Deployments and pods, `with_arm_refs`). Pure; shared by the
stages' phases (`reconcile.py`) and the rounds' (`round_phases.py`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from specdecode.experiment import spec, status
from specdecode.experiment.conditions import ts, with_conditions
from specdecode.experiment.status import ArmsCleanup, ExperimentStatus, Phase
from specdecode.experiment.world import Action, ArmState, Decision, Event, Observed, Subject


def cleaned_up(
    subject: Subject, ended: ExperimentStatus, observed: Observed
) -> tuple[ExperimentStatus, list[Action]]:
    """An ended status with what becomes of the arms that exist (`status.cleanup`), and the actions
    that do it, per `spec.cleanup`: deleted (`Always`; `OnSuccess` once Completed); after a failure
    kept at 0 replicas (`OnSuccess`, `Never`): no path into Failed holds a GPU; kept running after
    a verdict (`Never`). Every ending releases the arms' disruption budget."""
    if subject.spec is None or not any(a.exists for a in observed.arms.values()):
        return ended, []
    policy = subject.spec.cleanup
    if policy is spec.Cleanup.ALWAYS or (
        policy is spec.Cleanup.ON_SUCCESS and ended.phase is Phase.COMPLETED
    ):
        return ended.model_copy(update={"cleanup": ArmsCleanup.DELETED}), [
            Action.RELEASE_ARMS,
            Action.CLEANUP_ARMS,
        ]
    if ended.phase is Phase.FAILED:
        kept = (
            f"{ended.message}; the arms' Deployments are kept at 0 replicas (spec.cleanup: "
            f"{policy.value}): their GPUs are free"
        )
        scaled = ended.model_copy(update={"cleanup": ArmsCleanup.SCALED_TO_ZERO, "message": kept})
        return scaled, [Action.RELEASE_ARMS, Action.SCALE_DOWN_ARMS]
    # arms kept on purpose need no protection from drains
    return ended.model_copy(update={"cleanup": ArmsCleanup.KEPT}), [Action.RELEASE_ARMS]


CLEANUP_FAILED = "; cleaning up the arms failed ("
"""How an ended experiment's message goes on while its cleanup is retried (`cleanup_failed`)."""


def cleanup_failed(
    subject: Subject,
    current: ExperimentStatus,
    ended: Decision,
    why: str,
    now: datetime,
    *,
    by_hand: str | None = None,
) -> Decision:
    """The ending `ended`, whose cleanup raised (`why`): it stands, with status.cleanup Retrying, so
    that the operator ticks it again (after a restart too) until the cleanup is done
    (`retry_cleanup`). A shell that ends with it (`run --local`) says instead what to do `by_hand`."""
    note = f"{CLEANUP_FAILED}{why}): {by_hand or 'retried every tick'}"
    retrying = ended.status.model_copy(
        update={"message": f"{ended.status.message}{note}", "cleanup": ArmsCleanup.RETRYING}
    )
    retrying = with_conditions(retrying, subject.generation, now, previous=current)
    return Decision(retrying, [], [*ended.events, Event("Warning", "CleanupFailed", note[2:])])


def abort_cleanup(observed: Observed) -> list[Action]:
    """What an abort deletes whatever `spec.cleanup` says: both arms and the load Job, where they exist."""
    actions = [Action.CLEANUP_ARMS] if any(a.exists for a in observed.arms.values()) else []
    return actions + ([Action.DELETE_LOAD] if observed.job.exists else [])


def retry_cleanup(subject: Subject, current: ExperimentStatus, observed: Observed, now: datetime) -> Decision:
    """An ended experiment whose cleanup failed (status.cleanup Retrying): that cleanup again, on
    the arms (and, aborted, the load Job) that still exist; none left: done. The message is the
    ending's, as it was before the cleanup failed."""
    said = current.model_copy(update={"message": (current.message or "").split(CLEANUP_FAILED)[0]})
    cleanup: ArmsCleanup | None = ArmsCleanup.DELETED
    if subject.aborted:
        actions = abort_cleanup(observed)
    else:
        # the ending's message already says what cleaned_up would add (a scaled-down note)
        redone, actions = cleaned_up(subject, said, observed)
        cleanup = redone.cleanup if actions else ArmsCleanup.DELETED  # none left to clean up
    done = with_conditions(
        said.model_copy(update={"cleanup": cleanup}), subject.generation, now, previous=current
    )
    return Decision(done, actions, [Event("Normal", "CleanedUp", f"the arms are {_what(done)}")])


def _what(st: ExperimentStatus) -> str:
    return {
        ArmsCleanup.SCALED_TO_ZERO: "kept at 0 replicas",
        ArmsCleanup.KEPT: "kept running",
    }.get(st.cleanup or ArmsCleanup.DELETED, "deleted")


def enter(
    current: ExperimentStatus,
    subject: Subject,
    phase: Phase,
    now: datetime,
    reason: str,
    message: str,
    actions: list[Action],
) -> Decision:
    """`current` moved into `phase` (its conditions too), with an Event saying why."""
    moved = current.model_copy(
        update={"phase": phase, "reason": reason, "message": message, "phase_started_at": ts(now)}
    )
    moved = with_conditions(moved, subject.generation, now, previous=current)
    return Decision(moved, actions, [Event("Normal", reason, f"{phase.value}: {message}")])


def fail(
    current: ExperimentStatus,
    subject: Subject,
    now: datetime,
    reason: str,
    message: str,
    observed: Observed | None = None,
) -> Decision:
    """Failed with `reason` (never a verdict), the arms `observed` cleaned up per `spec.cleanup`."""
    failed = current.model_copy(
        update={
            "phase": Phase.FAILED,
            "verdict": None,
            "reason": reason,
            "message": message,
            "completed_at": ts(now),
            "phase_started_at": ts(now),
        }
    )
    failed, actions = cleaned_up(subject, failed, observed or Observed())
    failed = with_conditions(failed, subject.generation, now, previous=current)
    return Decision(failed, actions, [Event("Warning", reason, failed.message or message)])


def with_arm_refs(subject: Subject, current: ExperimentStatus, observed: Observed) -> ExperimentStatus:
    """`status.arms`: both arms' Deployments and the pods they serve from."""
    arms = status.Arms(
        control=_arm_ref(subject.name, spec.Arm.CONTROL, observed),
        treatment=_arm_ref(subject.name, spec.Arm.TREATMENT, observed),
    )
    return current.model_copy(update={"arms": arms})


def _arm_ref(name: str, arm: spec.Arm, observed: Observed) -> status.ArmRef:
    state = observed.arms.get(arm, ArmState())
    # The Ready one (one replica, recreated: there is at most one other, starting or terminating).
    pod = next((p.name for p in state.pods if p.ready), state.pods[0].name if state.pods else None)
    return status.ArmRef(deployment=f"{name}-{arm.value}", ready_replicas=state.ready_replicas, pod=pod)


def elapsed(current: ExperimentStatus, now: datetime) -> timedelta:
    """How long the experiment has been in its phase."""
    if not current.phase_started_at:
        return timedelta(0)
    return now - datetime.fromisoformat(current.phase_started_at)
