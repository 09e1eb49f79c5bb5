"""How a decision moves an experiment's status: into a phase (`enter`), into Failed with the
cleanup its policy asks (`fail`, `cleanup_actions`), and what each phase reads of the status (the
time spent in it, `elapsed`; the arms' Deployments and pods, `with_arm_refs`). Pure; shared by the
stages' phases (`reconcile.py`) and the rounds' (`round_phases.py`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from specdecode.experiment import spec, status
from specdecode.experiment.conditions import ts, with_conditions
from specdecode.experiment.status import ExperimentStatus, Phase
from specdecode.experiment.world import Action, ArmState, Decision, Event, Observed, Subject


def cleanup_actions(subject: Subject, current: ExperimentStatus, observed: Observed) -> list[Action]:
    """What an ended experiment does with the arms that exist, per `spec.cleanup`."""
    if subject.spec is None or not any(a.exists for a in observed.arms.values()):
        return []
    policy = subject.spec.cleanup
    if policy is spec.Cleanup.ALWAYS or (
        policy is spec.Cleanup.ON_SUCCESS and current.phase is Phase.COMPLETED
    ):
        return [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    return [Action.RELEASE_ARMS]  # arms kept on purpose need no protection from drains


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
    failed = with_conditions(failed, subject.generation, now, previous=current)
    actions = cleanup_actions(subject, failed, observed or Observed())
    return Decision(failed, actions, [Event("Warning", reason, message)])


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
