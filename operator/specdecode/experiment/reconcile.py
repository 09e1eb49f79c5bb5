"""The operator's decision function: observed world + current status -> new status + actions.

`decide()` is pure (style.md §5): the kopf timer observes the children, calls it, applies the
actions, and patches status once. Everything the operator knows lives in `.status` and in the
children, so a restarted operator resumes where it was.

Phases (design.md §3)::

    Pending --(valid; stale children gone)--> Deploying --(both arms Ready)--> Running
    Running --(load Job succeeded)--> Analyzing --(results judged)--> Completed (verdict)
    Analyzing --(a round is owed: analysis.crossover, analysis.confirm)--> Deploying (the round) ...
    Analyzing --(a search probe is owed: workload.search)--> Running (the probe's load) ...
    any active phase --(invalid spec, pod failure, Job failure, deadline, no data)--> Failed (reason)
    any active phase --(annotation specdecode.io/abort = the generation)--> Failed (Aborted)

An abort (`kubectl specdecode abort`) deletes both arms and the load Job whatever `spec.cleanup`
says (the point is to release the GPUs now); a run aborted during the load keeps the stages it
finished, as any failure during the load does. The annotation names the generation it aborts, so
a later spec edit starts a fresh, unaborted measurement.

A spec change (new `metadata.generation`) restarts the experiment: children built for another
generation are deleted, status is reset, and the measurement starts again. A verdict is bound to
the generation it was computed for (`observedGeneration` on status and on every condition).

Infrastructure failures end in `Failed` with a reason, never in a verdict.

Rounds (`rounds.py`): after the stages, the break-even search's probes, the crossover's swapped
round and the confirmation round go through Deploying (not a probe: its arms stay as they are),
Running and Analyzing again (`status.rounds` names the one in progress). A round that fails does not
fail the experiment: it ends with the stages' verdict, the round's check marked as not done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from specdecode.experiment import (
    advice,
    degradations,
    fairness,
    keys,
    placement,
    releases,
    rounds,
    spec,
    status,
)
from specdecode.experiment.status import Condition, ExperimentStatus, Phase, Round, Verdict
from specdecode.experiment.validity import Validity

RETRYING = "retrying: "
"""How status.message starts while a fault (or a transient collection failure) is retried."""

# Container waiting reasons that will not fix themselves; the experiment fails at once.
FATAL_WAITING = {
    "ImagePullBackOff": "the image cannot be pulled; check spec.engine.image and the pull secret",
    "ErrImageNeverPull": "the image is not on the node and imagePullPolicy is Never",
    "InvalidImageName": "spec.engine.image is not a valid image reference",
    "CreateContainerConfigError": "the container's configuration is broken (a missing Secret or ConfigMap?)",
    "CreateContainerError": "the container could not be created",
    "CrashLoopBackOff": "the engine keeps crashing; read its log",
}


class Action(StrEnum):
    """What the shell must do this tick, in order, before persisting the status."""

    DELETE_STALE = "DeleteStale"
    """Delete children built for another generation (a spec change restarts the experiment)."""
    CREATE_ARMS = "CreateArms"
    """Create-if-absent both arms and their Services, NetworkPolicy and the load Job's RBAC."""
    CREATE_LOAD = "CreateLoad"
    """Create-if-absent the load Job."""
    RELEASE_ARMS = "ReleaseArms"
    """Delete the arms' PodDisruptionBudget: the experiment has ended, drains may evict them again."""
    CLEANUP_ARMS = "CleanupArms"
    """Delete both arms' Deployments (frees the GPUs) per the cleanup policy."""
    DELETE_LOAD = "DeleteLoad"
    """Delete the load Job of the last round (the stages' Job when no round was started) and its
    pod: an abort, or a round that failed (the load stops now)."""


@dataclass(frozen=True)
class PodState:
    """What matters about one pod for failure detection."""

    name: str
    phase: str = "Pending"
    node: str | None = None
    ready: bool = False
    unschedulable: str | None = None
    """The scheduler's message while PodScheduled is False with reason Unschedulable."""
    unschedulable_since: datetime | None = None
    waiting_reason: str | None = None
    waiting_message: str | None = None
    last_terminated_reason: str | None = None
    last_exit_code: int | None = None
    restarts: int = 0
    image_id: str | None = None
    round: str | None = None
    """The round the pod was rendered for (`keys.ROUND_ANNOTATION`; None: the stages)."""


@dataclass(frozen=True)
class ArmState:
    """One arm's Deployment and pods."""

    exists: bool = False
    ready_replicas: int = 0
    pods: tuple[PodState, ...] = ()
    """The arm's live pods (built for this generation, not being deleted)."""
    leaving: tuple[str, ...] = ()
    """Names of the arm's pods being deleted: evicted, preempted, drained or deleted by someone."""
    refused: str | None = None
    """The controller's message while the API server refuses to create the arm's pod (Pod Security
    admission, a ResourceQuota, a LimitRange): the Deployment's ReplicaFailure condition."""
    refused_since: datetime | None = None

    @property
    def ready(self) -> bool:
        """At least one replica passes its readiness probe."""
        return self.exists and self.ready_replicas >= 1


@dataclass(frozen=True)
class JobState:
    """The load Job."""

    exists: bool = False
    uid: str | None = None
    """The Job's uid: the results it wrote are owned by it."""
    succeeded: bool = False
    failed: bool = False
    reason: str | None = None
    message: str | None = None
    pod: PodState | None = None


@dataclass(frozen=True)
class Judgement:
    """The verdict module's answer, ready to merge into status."""

    verdict: Verdict
    reason: str
    message: str
    stages: list[status.StageResult] = field(default_factory=list)
    recommendation: status.Recommendation | None = None
    noise_floor: status.NoiseFloor | None = None
    crossover: status.CrossoverResult | None = None
    search: status.SearchResult | None = None
    speedup_summary: str | None = None
    validity: Validity | None = None
    environment: status.Environment | None = None
    results_ref: status.ResultsRef | None = None
    next_round: Round | None = None
    """A round is owed before the verdict (`rounds.py`): the other fields are the judgement so far,
    kept in status while the round runs (without a verdict)."""


@dataclass(frozen=True)
class CollectFailure:
    """Results could not be collected or judged."""

    reason: str
    message: str
    transient: bool = False
    """Worth retrying until the analysis grace period is over (e.g. Prometheus unreachable)."""


@dataclass(frozen=True)
class Fault:
    """A tick that raised before its decision was carried out: an API call refused, an answer of
    an unexpected shape. It is retried every tick, but never past the phase's deadline."""

    reason: str
    """The status reason should it end the experiment (`ChildRejected`, `ReconcileError`, ...)."""
    message: str
    permanent: bool = False
    """Retrying cannot help (the API server refused an object as invalid): fail at once."""


@dataclass(frozen=True)
class Observed:
    """Everything the shell saw this tick."""

    arms: dict[spec.Arm, ArmState] = field(default_factory=dict)
    job: JobState = field(default_factory=JobState)
    """The load Job of the round in progress (the stages' Job outside of a round)."""
    stale_children: tuple[str, ...] = ()
    """Children labelled with another generation than the current one."""
    analysis: Judgement | CollectFailure | None = None
    """Only in Analyzing: the collected and judged results."""
    scraped: bool | None = None
    """Once both arms are Ready: whether Prometheus scrapes both (None: not checked)."""
    hosts: dict[spec.Arm, status.Host] = field(default_factory=dict)
    """Once both arms are Ready: where each arm's pod runs (empty: not read)."""
    degradations: list[status.Degradation] | None = None
    """Once both arms are Ready: what the treatment's log says vLLM weakened (None: not read)."""
    arm_pods: dict[spec.Arm, fairness.ArmPod] = field(default_factory=dict)
    """Once both arms are Ready: each arm's live pod as `fairness` compares them (empty: not read)."""


@dataclass(frozen=True)
class Timing:
    """Operator settings that shape decisions."""

    unschedulable_grace: timedelta = timedelta(seconds=60)
    """How long a pod may stay Unschedulable (a cluster autoscaler may add a GPU node)."""
    analysis_grace: timedelta = timedelta(minutes=5)
    """How long transient collection failures (Prometheus down) are retried before Failed."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post (phase transitions and the verdict only)."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """The new status, and what to do before persisting it."""

    status: ExperimentStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


@dataclass(frozen=True)
class Subject:
    """The experiment being reconciled."""

    name: str
    generation: int
    spec: spec.ExperimentSpec | None
    """None when the spec is invalid (then `problems` says why)."""
    problems: Sequence[str] = ()
    aborted: bool = False
    """`keys.ABORT_ANNOTATION` names this generation: end it now (Failed, reason Aborted)."""


def needs_reconcile(current: ExperimentStatus, generation: int) -> bool:
    """Whether the timer has work: an active phase, or a spec change since the status was written."""
    return current.observed_generation != generation or current.phase.is_active


def decide(
    subject: Subject,
    current: ExperimentStatus,
    observed: Observed,
    now: datetime,
    timing: Timing | None = None,
) -> Decision:
    """The next status of an experiment, and the actions that lead there."""
    timing = timing or Timing()
    if current.phase.is_active and (current.message or "").startswith(RETRYING):
        # This tick did not raise: the fault is over, the phase's own message is back.
        entered = next((c.message for c in current.conditions if c.type == "Reconciling"), None)
        current = current.model_copy(update={"message": entered or None})
    if current.observed_generation != subject.generation:
        return _restart(subject, observed, now)
    if current.phase.is_terminal:
        return _terminal(subject, current, observed)
    if subject.aborted:
        return _abort(subject, current, observed, now)
    if subject.spec is None:
        return _fail(
            current, subject, now, "InvalidSpec", "; ".join(subject.problems) or "the spec is invalid"
        )
    if current.phase is Phase.PENDING:
        if observed.stale_children:
            return Decision(current, [Action.DELETE_STALE])
        return _enter(
            current, subject, Phase.DEPLOYING, now, "Deploying", "creating both arms", [Action.CREATE_ARMS]
        )
    round_ = rounds.current(current)
    if round_ is not None and current.phase is Phase.DEPLOYING:
        return _round_deploying(subject, subject.spec, current, round_, observed, now, timing)
    if round_ is not None and current.phase is Phase.RUNNING:
        return _round_running(subject, subject.spec, current, round_, observed, now, timing)
    if current.phase is Phase.DEPLOYING:
        return _deploying(subject, subject.spec, current, observed, now, timing)
    if current.phase is Phase.RUNNING:
        return _running(subject, subject.spec, current, observed, now, timing)
    return _analyzing(subject, current, observed, now, timing)


def decide_after_fault(
    subject: Subject,
    current: ExperimentStatus,
    fault: Fault,
    now: datetime,
    timing: Timing | None = None,
    *,
    attempted: Decision | None = None,
    observed: Observed | None = None,
) -> Decision:
    """The status after a tick that raised (`attempted`: its decision, when it got that far;
    `observed`: what it saw, when it got that far: else the arms are taken to exist, so that a
    failure still frees their GPUs per the cleanup policy).

    A fault that repeats every tick must not skip the deadlines `decide()` would apply: the
    experiment keeps its phase (the message says what is retried) until the phase's deadline
    (deploy for Pending and Deploying, run for Running, the analysis grace for Analyzing), then
    ends in Failed with the fault's reason, never in a verdict. A permanent fault fails at once.
    In a round after the stages (`rounds.py`) the round ends instead (its outcome Failed, the
    stages judged without it), as any other failure of a round does. A restart, an invalid spec or a decided ending is kept (its actions are what failed: the
    next tick retries a restart's; an ending's cleanup is reported in the message).
    """
    timing = timing or Timing()
    if current.observed_generation != subject.generation or subject.spec is None:
        # Deciding needs nothing observed: restart (Pending deletes the stale children) or InvalidSpec.
        decided = attempted or decide(subject, current, Observed(), now, timing)
        return Decision(decided.status, [], decided.events)
    if current.phase.is_terminal:
        return Decision(current)
    if attempted is not None and attempted.status.phase.is_terminal:
        names = " and ".join(f"{subject.name}-{arm.value}" for arm in spec.Arm)
        note = f"; deleting the arms failed ({fault.message}): delete Deployments {names} by hand"
        ended = attempted.status.model_copy(update={"message": f"{attempted.status.message}{note}"})
        return Decision(ended, [], [*attempted.events, Event("Warning", "CleanupFailed", note[2:])])
    limit, deadline = _phase_deadline(subject.spec, current.phase, timing)
    if fault.permanent or _elapsed(current, now) > limit:
        why = "" if fault.permanent else f" (retried every tick until {deadline} passed)"
        round_ = rounds.current(current)
        if round_ is not None:  # the round ends, not the experiment: the stages' verdict stands
            why = f"{fault.reason}: {fault.message}{why}"
            return _round_failed(subject, current, round_, why, observed or Observed(), now)
        assumed = Observed(arms={arm: ArmState(exists=True) for arm in spec.Arm})
        return _fail(current, subject, now, fault.reason, f"{fault.message}{why}", observed or assumed)
    return Decision(current.model_copy(update={"message": f"{RETRYING}{fault.message}"}))


def _phase_deadline(s: spec.ExperimentSpec, phase: Phase, timing: Timing) -> tuple[timedelta, str]:
    """How long a phase may last, and its name for messages."""
    if phase is Phase.RUNNING:
        return timedelta(seconds=s.deadlines.run_seconds), f"spec.deadlines.run ({s.deadlines.run})"
    if phase is Phase.ANALYZING:
        return timing.analysis_grace, f"the analysis grace ({timing.analysis_grace.total_seconds():.0f} s)"
    return timedelta(seconds=s.deadlines.deploy_seconds), f"spec.deadlines.deploy ({s.deadlines.deploy})"


# ----------------------------------------------------------------------------------------- phases


def _restart(subject: Subject, observed: Observed, now: datetime) -> Decision:
    fresh = ExperimentStatus(
        observed_generation=subject.generation, phase=Phase.PENDING, phase_started_at=_ts(now)
    )
    if subject.spec is None:
        return _fail(fresh, subject, now, "InvalidSpec", "; ".join(subject.problems) or "the spec is invalid")
    fresh = fresh.model_copy(update={"reason": "Accepted", "message": "waiting to deploy"})
    fresh = with_conditions(fresh, subject.generation, now)
    actions = [Action.DELETE_STALE] if observed.stale_children else []
    weak = [Event("Warning", "WeakDesign", str(found)) for found in advice.advice(subject.spec)]
    return Decision(
        fresh, actions, [Event("Normal", "Accepted", f"generation {subject.generation}: starting"), *weak]
    )


def _deploying(
    subject: Subject,
    s: spec.ExperimentSpec,
    current: ExperimentStatus,
    observed: Observed,
    now: datetime,
    timing: Timing,
) -> Decision:
    current = _with_arm_refs(subject, current, observed)
    colocated = s.placement.colocate is spec.Colocate.REQUIRED
    failure = _pod_failure(observed, now, timing, colocated=colocated) or _creation_refused(
        observed, now, timing
    )
    if failure is not None:
        return _fail(current, subject, now, *failure, observed)
    ready = all(observed.arms.get(arm, ArmState()).ready for arm in spec.Arm)
    if ready and observed.hosts:
        # Where the arms run is known from here on, whatever happens next (it may explain a failure).
        current = current.model_copy(update={"environment": _environment(s, observed)})
    differ_pods = _arm_differences(observed) if ready else []
    if differ_pods and s.analysis.fairness is spec.Fairness.FAIL:
        # Before the load: nothing would be measured but the difference.
        current = current.model_copy(update={"arm_differences": differ_pods})
        return _fail(current, subject, now, "ArmsDiffer", fairness.message(differ_pods), observed)
    if ready and observed.scraped is False:
        # Starting the load before Prometheus discovers the arms would lose the first stage's counters.
        if _elapsed(current, now) > timedelta(seconds=s.deadlines.deploy_seconds):
            return _fail(
                current,
                subject,
                now,
                "PrometheusNoData",
                f"both arms are Ready but Prometheus did not report them scraped within spec.deadlines.deploy "
                f"({s.deadlines.deploy}): it is unreachable, or does not scrape pods labelled "
                f"{keys.LABEL_EXPERIMENT}={subject.name}; check spec.prometheus.url and its scrape config",
                observed,
            )
        note = "both arms Ready; waiting for Prometheus to scrape them"
        return Decision(current.model_copy(update={"message": note}), [Action.CREATE_ARMS])
    if ready:
        environment = _environment(s, observed)
        differ = environment.host_differences
        found = observed.degradations or []
        entered = _enter(
            current.model_copy(
                update={
                    "environment": environment,
                    "started_at": _ts(now),
                    "degradations": found,
                    "arm_differences": differ_pods,
                }
            ),
            subject,
            Phase.RUNNING,
            now,
            "LoadStarted",
            f"both arms Ready; running {len(s.workload.stages)} stages"
            + (f" (the arms' hosts differ in {', '.join(differ)})" if differ else ""),
            [Action.CREATE_LOAD],
        )
        warning = placement.warning(environment)
        if warning is not None:
            entered.events.append(Event("Warning", "PlacementDiffers", warning))
        if found:
            entered.events.append(Event("Warning", "SpeculationDegraded", degradations.summary(found)))
        if differ_pods:
            entered.events.append(Event("Warning", "ArmsDiffer", fairness.message(differ_pods)))
        return entered
    if _elapsed(current, now) > timedelta(seconds=s.deadlines.deploy_seconds):
        waiting = [arm.value for arm in spec.Arm if not observed.arms.get(arm, ArmState()).ready]
        return _fail(
            current,
            subject,
            now,
            "DeployDeadlineExceeded",
            f"{' and '.join(waiting)} not Ready within spec.deadlines.deploy ({s.deadlines.deploy}); "
            "check the pods' events and logs, or raise the deadline for large models",
            observed,
        )
    return Decision(current, [Action.CREATE_ARMS])


def _running(
    subject: Subject,
    s: spec.ExperimentSpec,
    current: ExperimentStatus,
    observed: Observed,
    now: datetime,
    timing: Timing,
) -> Decision:
    failure = _pod_failure(observed, now, timing, restarts_fail=True)
    if failure is not None:
        return _fail(current, subject, now, *failure, observed)
    disrupted = _arm_disruption(observed, current)
    if disrupted is not None:
        return _fail(current, subject, now, "ArmDisrupted", disrupted, observed)
    job = observed.job
    if job.failed:
        detail = job.message or job.reason or "the load Job failed"
        if job.pod is not None and job.pod.last_terminated_reason:
            detail += f" (load pod: {job.pod.last_terminated_reason}, exit {job.pod.last_exit_code})"
        return _fail(current, subject, now, "LoadJobFailed", f"{detail}; read the load Job's log", observed)
    if job.succeeded:
        return _enter(
            current, subject, Phase.ANALYZING, now, "LoadFinished", "collecting and judging results", []
        )
    if _elapsed(current, now) > timedelta(seconds=s.deadlines.run_seconds):
        return _fail(
            current,
            subject,
            now,
            "RunDeadlineExceeded",
            f"the load did not finish within spec.deadlines.run ({s.deadlines.run}); "
            "lower requestsPerStage or raise the deadline",
            observed,
        )
    return Decision(current, [Action.CREATE_LOAD])


def _analyzing(
    subject: Subject, current: ExperimentStatus, observed: Observed, now: datetime, timing: Timing
) -> Decision:
    outcome = observed.analysis
    if outcome is None:
        return Decision(current)
    if isinstance(outcome, CollectFailure):
        if outcome.transient and _elapsed(current, now) <= timing.analysis_grace:
            waiting = current.model_copy(
                update={"reason": outcome.reason, "message": f"{RETRYING}{outcome.message}"}
            )
            return Decision(waiting)
        return _fail(current, subject, now, outcome.reason, outcome.message, observed)
    environment = outcome.environment or current.environment
    if outcome.next_round is not None:
        return _start_round(subject, current, outcome, outcome.next_round, now)
    done = current.model_copy(
        update={
            "phase": Phase.COMPLETED,
            "verdict": outcome.verdict,
            "reason": outcome.reason,
            "message": fairness.qualify(
                placement.qualify(outcome.message, environment), current.arm_differences
            ),
            "stages": outcome.stages,
            "recommendation": outcome.recommendation,
            "noise_floor": outcome.noise_floor,
            "speedup_summary": outcome.speedup_summary,
            "validity": outcome.validity,
            "environment": environment,
            "results_ref": outcome.results_ref,
            "crossover": outcome.crossover,
            "search": outcome.search,
            "completed_at": _ts(now),
            "phase_started_at": _ts(now),
        }
    )
    done = with_conditions(done, subject.generation, now, previous=current)
    kind = "Normal" if outcome.verdict is Verdict.PROMOTE else "Warning"
    event = Event(kind, outcome.verdict.value, f"{outcome.verdict.value} ({outcome.reason}): {done.message}")
    return Decision(done, _cleanup_actions(subject, done, observed), [event])


# ------------------------------------------------------------------------------------- rounds


def _start_round(
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
            "rounds": [*current.rounds, round_.model_copy(update={"started_at": _ts(now)})],
        }
    )
    message = rounds.describe(subject.spec, round_)
    if round_.probe is not None:
        return _enter(interim, subject, Phase.RUNNING, now, "SearchProbe", message, [Action.CREATE_LOAD])
    return _enter(
        interim, subject, Phase.DEPLOYING, now, f"{round_.name}Round", message, [Action.CREATE_ARMS]
    )


def _round_ready(observed: Observed, round_: Round) -> bool:
    """The round's arms are Ready: those it starts again with a Ready pod rendered for it."""
    started = rounds.started(round_)
    for arm in spec.Arm:
        state = observed.arms.get(arm, ArmState())
        if arm not in started:
            if not state.ready:
                return False
        elif not any(p.ready and p.round == round_.name for p in state.pods):
            return False
    return True


def _round_deploying(
    subject: Subject,
    s: spec.ExperimentSpec,
    current: ExperimentStatus,
    round_: Round,
    observed: Observed,
    now: datetime,
    timing: Timing,
) -> Decision:
    current = _with_arm_refs(subject, current, observed)
    failure = _pod_failure(observed, now, timing) or _creation_refused(observed, now, timing)
    if failure is not None:
        return _round_failed(subject, current, round_, f"{failure[0]}: {failure[1]}", observed, now)
    ready = _round_ready(observed, round_)
    if ready and observed.scraped is not False:
        return _enter(
            current,
            subject,
            Phase.RUNNING,
            now,
            "LoadStarted",
            f"{round_.name.lower()} round: the arms are Ready; running its load",
            [Action.CREATE_LOAD],
        )
    if _elapsed(current, now) > timedelta(seconds=s.deadlines.deploy_seconds):
        waiting = "Prometheus did not report the arms scraped" if ready else "the arms were not Ready"
        return _round_failed(
            subject,
            current,
            round_,
            f"DeployDeadlineExceeded: {waiting} within spec.deadlines.deploy ({s.deadlines.deploy})",
            observed,
            now,
        )
    return Decision(current, [Action.CREATE_ARMS])


def _round_running(
    subject: Subject,
    s: spec.ExperimentSpec,
    current: ExperimentStatus,
    round_: Round,
    observed: Observed,
    now: datetime,
    timing: Timing,
) -> Decision:
    failure = _pod_failure(observed, now, timing, restarts_fail=True)
    if failure is not None:
        return _round_failed(subject, current, round_, f"{failure[0]}: {failure[1]}", observed, now)
    disrupted = _arm_disruption(observed, current)
    if disrupted is not None:
        return _round_failed(subject, current, round_, f"ArmDisrupted: {disrupted}", observed, now)
    job = observed.job
    if job.failed:
        detail = job.message or job.reason or "the load Job failed"
        return _round_failed(subject, current, round_, f"LoadJobFailed: {detail}", observed, now)
    if job.succeeded:
        measured = _ended(current, round_, rounds.MEASURED, None)
        what = f"{round_.name} probe" if round_.probe is not None else f"{round_.name.lower()} round"
        return _enter(measured, subject, Phase.ANALYZING, now, "LoadFinished", f"{what}: judging", [])
    if _elapsed(current, now) > timedelta(seconds=s.deadlines.run_seconds):
        return _round_failed(
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


def _round_failed(
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
    decision = _enter(
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


def _abort(subject: Subject, current: ExperimentStatus, observed: Observed, now: datetime) -> Decision:
    """Failed with reason Aborted; both arms and the load Job are deleted whatever `spec.cleanup` says."""
    was = current.phase.value
    failed = _fail(
        current,
        subject,
        now,
        "Aborted",
        f"aborted by the annotation {keys.ABORT_ANNOTATION} while {was}; the arms and the load Job are deleted",
    )
    actions = [Action.DELETE_STALE] if observed.stale_children else []
    if any(a.exists for a in observed.arms.values()):
        actions.append(Action.CLEANUP_ARMS)
    if observed.job.exists:
        actions.append(Action.DELETE_LOAD)
    return Decision(failed.status, actions, failed.events)


def _terminal(subject: Subject, current: ExperimentStatus, observed: Observed) -> Decision:
    return Decision(current, _cleanup_actions(subject, current, observed))


def _cleanup_actions(subject: Subject, current: ExperimentStatus, observed: Observed) -> list[Action]:
    if subject.spec is None or not any(a.exists for a in observed.arms.values()):
        return []
    policy = subject.spec.cleanup
    if policy is spec.Cleanup.ALWAYS or (
        policy is spec.Cleanup.ON_SUCCESS and current.phase is Phase.COMPLETED
    ):
        return [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    return [Action.RELEASE_ARMS]  # arms kept on purpose need no protection from drains


# ----------------------------------------------------------------------------------- failures


def _pod_failure(
    observed: Observed, now: datetime, timing: Timing, *, restarts_fail: bool = False, colocated: bool = False
) -> tuple[str, str] | None:
    """(reason, message) of the first arm pod that cannot or did not run, or None."""
    for arm in spec.Arm:
        for pod in observed.arms.get(arm, ArmState()).pods:
            where = f"{arm.value} arm (pod {pod.name})"
            if pod.last_terminated_reason == "OOMKilled":
                return (
                    "OOMKilled",
                    f"{where} ran out of memory; raise spec.engine.resources or lower --max-model-len",
                )
            if pod.waiting_reason in FATAL_WAITING:
                detail = f": {pod.waiting_message}" if pod.waiting_message else ""
                exit_info = (
                    f" (last exit {pod.last_exit_code}, {pod.last_terminated_reason})"
                    if pod.last_exit_code is not None
                    else ""
                )
                message = f"{where}: {FATAL_WAITING[pod.waiting_reason]}{exit_info}{detail}"
                return pod.waiting_reason, message
            stuck = (
                pod.unschedulable_since is not None
                and now - pod.unschedulable_since >= timing.unschedulable_grace
            )
            if pod.unschedulable and stuck:
                return (
                    "Unschedulable",
                    f"{where} cannot be scheduled: {pod.unschedulable}; check spec.engine.resources, "
                    "nodeSelector and tolerations against your GPU nodes"
                    + (
                        " (spec.placement.colocate is Required: one node must have GPUs for both arms; "
                        "Preferred lets them land apart)"
                        if colocated
                        else ""
                    ),
                )
            if restarts_fail and pod.restarts > 0 and pod.last_terminated_reason:
                return (
                    "EngineRestarted",
                    f"{where} restarted during the load ({pod.last_terminated_reason}, exit {pod.last_exit_code}); "
                    "the measurement is void",
                )
            if pod.phase == "Failed":
                return "PodFailed", f"{where} failed ({pod.last_terminated_reason or 'unknown reason'})"
    return None


def _creation_refused(observed: Observed, now: datetime, timing: Timing) -> tuple[str, str] | None:
    """(reason, message) when the API server refuses an arm's pod: at once for Pod Security (the
    namespace's policy will not change by itself), after the unschedulable grace for the rest (a
    ResourceQuota may free up when another experiment ends). Without it, the arms would wait the
    whole deploy deadline and fail with a hint about pods that do not exist."""
    for arm in spec.Arm:
        state = observed.arms.get(arm, ArmState())
        if state.refused is None or state.pods:
            continue
        if "PodSecurity" in state.refused:
            return (
                "PodCreationForbidden",
                f"the namespace's Pod Security admission refuses the {arm.value} arm's pod: {state.refused}; "
                "vLLM images run as root, which `restricted` forbids: run real engines in a namespace that "
                "enforces `baseline` (simulator arms meet `restricted`)",
            )
        waited = state.refused_since is None or now - state.refused_since >= timing.unschedulable_grace
        if waited:
            return (
                "PodCreationForbidden",
                f"the API server refuses the {arm.value} arm's pod: {state.refused}; check the namespace's "
                "ResourceQuota and LimitRange against spec.engine.resources",
            )
    return None


def _arm_disruption(observed: Observed, current: ExperimentStatus) -> str | None:
    """Why an arm is not the one the load started measuring (`status.arms.*.pod`), or None.

    The load would go on against a missing or replacement arm: connection errors on one side, a
    cold or relocated engine. That ends as a Reject or Inconclusive measured on a half-dead arm,
    so it is a failure (infrastructure, never a verdict).
    """
    void = "; the measurement is void: run the experiment again (cordon or drain GPU nodes between runs)"
    for arm in spec.Arm:
        state = observed.arms.get(arm, ArmState())
        measured = getattr(current.arms, arm.value).pod if current.arms is not None else None
        live = [p.name for p in state.pods]
        if not state.exists:
            return f"the {arm.value} arm's Deployment was deleted during the load{void}"
        if state.leaving:
            return (
                f"{arm.value} arm pod {state.leaving[0]} is being deleted during the load "
                f"(evicted, preempted, drained or deleted){void}"
            )
        if measured is not None and measured not in live:
            now = f"pod {live[0]} replaced it" if live else "no pod replaced it yet"
            return f"{arm.value} arm pod {measured}, measured since the load began, is gone ({now}){void}"
        if not live:
            return f"the {arm.value} arm has no pod during the load{void}"
    return None


# -------------------------------------------------------------------------------------- helpers


def _enter(
    current: ExperimentStatus,
    subject: Subject,
    phase: Phase,
    now: datetime,
    reason: str,
    message: str,
    actions: list[Action],
) -> Decision:
    moved = current.model_copy(
        update={"phase": phase, "reason": reason, "message": message, "phase_started_at": _ts(now)}
    )
    moved = with_conditions(moved, subject.generation, now, previous=current)
    return Decision(moved, actions, [Event("Normal", reason, f"{phase.value}: {message}")])


def _fail(
    current: ExperimentStatus,
    subject: Subject,
    now: datetime,
    reason: str,
    message: str,
    observed: Observed | None = None,
) -> Decision:
    failed = current.model_copy(
        update={
            "phase": Phase.FAILED,
            "verdict": None,
            "reason": reason,
            "message": message,
            "completed_at": _ts(now),
            "phase_started_at": _ts(now),
        }
    )
    failed = with_conditions(failed, subject.generation, now, previous=current)
    actions = _cleanup_actions(subject, failed, observed or Observed())
    return Decision(failed, actions, [Event("Warning", reason, message)])


def _with_arm_refs(subject: Subject, current: ExperimentStatus, observed: Observed) -> ExperimentStatus:
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


def _arm_differences(observed: Observed) -> list[status.ArmDifference]:
    """How the arms' live pods differ beyond speculation (none while either pod was not read)."""
    control, treatment = (observed.arm_pods.get(arm) for arm in (spec.Arm.CONTROL, spec.Arm.TREATMENT))
    if control is None or treatment is None:
        return []
    return fairness.differences(control, treatment)


def _environment(s: spec.ExperimentSpec, observed: Observed) -> status.Environment:
    pods = [pod for arm in spec.Arm for pod in observed.arms.get(arm, ArmState()).pods]
    environment = placement.environment(
        s,
        releases.resolve(s.engine),
        image_digest=next((p.image_id for p in pods if p.image_id), None),
        nodes=sorted({p.node for p in pods if p.node}),
    )
    if not observed.hosts:
        return environment
    hosts = status.ArmHosts(
        control=observed.hosts.get(spec.Arm.CONTROL), treatment=observed.hosts.get(spec.Arm.TREATMENT)
    )
    return placement.with_hosts(environment, hosts)


def conditions_for(st: ExperimentStatus) -> dict[str, tuple[str, str, str]]:
    """type -> (status, reason, message) of the kstatus conditions plus Completed and Promoted (and
    SpeculationDegraded while the treatment logged a degradation, ArmsDiffer while the arms' pods
    differed beyond speculation)."""
    reason = st.reason or st.phase.value
    message = st.message or ""
    active = st.phase.is_active
    failed = st.phase is Phase.FAILED
    completed = st.phase is Phase.COMPLETED
    promoted = completed and st.verdict is Verdict.PROMOTE
    verdict_reason = st.verdict.value if st.verdict is not None else reason
    # Only while vLLM said so (a warning, abnormal-true): absent, not False, on every other experiment.
    degraded = (
        {"SpeculationDegraded": ("True", st.degradations[0].kind, degradations.summary(st.degradations))}
        if st.degradations
        else {}
    )
    # Likewise only while the arms' pods differed beyond speculation (analysis.fairness).
    differ = (
        {"ArmsDiffer": ("True", "ArmsDiffer", fairness.summary(st.arm_differences))}
        if st.arm_differences
        else {}
    )
    return (
        {
            "Ready": ("True" if completed else "False", verdict_reason if completed else reason, message),
            "Reconciling": (
                "True" if active else "False",
                reason if active else "Finished",
                message if active else "",
            ),
            "Stalled": (
                "True" if failed else "False",
                reason if failed else "NotStalled",
                message if failed else "",
            ),
            "Completed": ("True" if completed else "False", verdict_reason, message),
            "Promoted": ("True" if promoted else "False", verdict_reason, message),
        }
        | degraded
        | differ
    )


def with_conditions(
    st: ExperimentStatus, generation: int, now: datetime, *, previous: ExperimentStatus | None = None
) -> ExperimentStatus:
    """The status with its conditions (`conditions_for`) as the resource carries them: a condition's
    transition time moves only when its status changes from `previous`. Also writes `run --local`'s
    result.json, so a pipeline gates on the same conditions locally."""
    before = {c.type: c for c in (previous.conditions if previous else [])}
    conditions = []
    for kind, (value, reason, message) in conditions_for(st).items():
        old = before.get(kind)
        changed = old is None or old.status != value
        conditions.append(
            Condition(
                type=kind,
                status=value,
                reason=reason,
                message=message,
                observed_generation=generation,
                last_transition_time=_ts(now) if changed or old is None else old.last_transition_time,
            )
        )
    return st.model_copy(update={"conditions": conditions, "observed_generation": generation})


def _elapsed(current: ExperimentStatus, now: datetime) -> timedelta:
    if not current.phase_started_at:
        return timedelta(0)
    return now - datetime.fromisoformat(current.phase_started_at)


def _ts(now: datetime) -> str:
    return now.isoformat(timespec="seconds").replace("+00:00", "Z")
