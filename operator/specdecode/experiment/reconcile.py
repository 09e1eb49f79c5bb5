"""The operator's decision function: observed world + current status -> new status + actions.

`decide()` is pure (style.md §5): the kopf timer observes the children, calls it, applies the
actions, and patches status once. Everything the operator knows lives in `.status` and in the
children, so a restarted operator resumes where it was.

Phases (design.md §3)::

    Pending --(valid; stale children gone; the Secrets its pods read there)--> Deploying --(both arms Ready)--> Running
    Running --(load Job succeeded)--> Analyzing --(results judged)--> Completed (verdict)
    Analyzing --(a round is owed: analysis.crossover, analysis.confirm)--> Deploying (the round) ...
    Analyzing --(a search probe is owed: workload.search)--> Running (the probe's load) ...
    any active phase --(invalid spec, pod failure, Job failure, deadline, no data)--> Failed (reason)
    any active phase --(annotation specdecode.io/abort = the generation)--> Failed (Aborted)

An abort (`kubectl specdecode abort`) deletes both arms and the load Job whatever `spec.cleanup`
says (the point is to release the GPUs now); a run aborted during the load keeps the stages it
finished, as any failure during the load does (`Action.KEEP_FINISHED_STAGES`, `finished.py`). A
verdict comes with its report, stored before the status is written (`Action.STORE_REPORT`). The annotation names the generation it aborts, so
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

from dataclasses import replace
from datetime import datetime, timedelta

from specdecode.experiment import (
    advice,
    degradations,
    failures,
    fairness,
    keys,
    placement,
    releases,
    rounds,
    secretrefs,
    spec,
    status,
)
from specdecode.experiment.conditions import conditions_for as conditions_for
from specdecode.experiment.conditions import ts, with_conditions
from specdecode.experiment.finished import keep_finished as keep_finished
from specdecode.experiment.finished import with_finished_stages as with_finished_stages
from specdecode.experiment.round_phases import round_deploying, round_failed, round_running, start_round
from specdecode.experiment.status import ExperimentStatus, Phase, Verdict
from specdecode.experiment.transitions import (
    abort_cleanup,
    cleaned_up,
    cleanup_failed,
    elapsed,
    enter,
    fail,
    retry_cleanup,
    with_arm_refs,
)

# The tick's vocabulary, for the shells that spell it `reconcile.X`.
from specdecode.experiment.world import Action as Action
from specdecode.experiment.world import ArmState as ArmState
from specdecode.experiment.world import CollectFailure as CollectFailure
from specdecode.experiment.world import Decision as Decision
from specdecode.experiment.world import Event as Event
from specdecode.experiment.world import Fault as Fault
from specdecode.experiment.world import Finished as Finished
from specdecode.experiment.world import JobState as JobState
from specdecode.experiment.world import Judgement as Judgement
from specdecode.experiment.world import Observed as Observed
from specdecode.experiment.world import PodState as PodState
from specdecode.experiment.world import Report as Report
from specdecode.experiment.world import Subject as Subject
from specdecode.experiment.world import Timing as Timing

RETRYING = "retrying: "
"""How status.message starts while a fault (or a transient collection failure) is retried."""


def needs_reconcile(current: ExperimentStatus, generation: int) -> bool:
    """Whether the timer has work: an active phase, a spec change since the status was written, or
    an ending whose cleanup failed (status.cleanup Retrying: GPUs may still be held)."""
    retrying = current.cleanup is status.ArmsCleanup.RETRYING  # an ended experiment's cleanup failed
    return current.observed_generation != generation or current.phase.is_active or retrying


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
        return _terminal(subject, current, observed, now)
    if subject.aborted:
        return _abort(subject, current, observed, now)
    if subject.spec is None:
        return fail(
            current, subject, now, "InvalidSpec", "; ".join(subject.problems) or "the spec is invalid"
        )
    if current.phase is Phase.PENDING:
        if observed.stale_children:
            return Decision(current, [Action.DELETE_STALE])
        missing = secretrefs.problem(observed.secrets)
        if missing is not None:  # before any GPU is used, not as a pod in CreateContainerConfigError
            return fail(current, subject, now, secretrefs.REASON, missing, observed)
        return enter(
            current, subject, Phase.DEPLOYING, now, "Deploying", "creating both arms", [Action.CREATE_ARMS]
        )
    round_ = rounds.current(current)
    if round_ is not None and current.phase is Phase.DEPLOYING:
        return round_deploying(subject, subject.spec, current, round_, observed, now, timing)
    if round_ is not None and current.phase is Phase.RUNNING:
        return round_running(subject, subject.spec, current, round_, observed, now, timing)
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
    by_hand: str | None = None,
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
    next tick retries a restart's; an ending's cleanup is reported in the message). What an ending
    keeps that could not be kept (`fault.action`: the finished stages, the report) is left out of
    it (`_without_what_it_keeps`).
    """
    timing = timing or Timing()
    if current.observed_generation != subject.generation or subject.spec is None:
        # Deciding needs nothing observed: restart (Pending deletes the stale children) or InvalidSpec.
        decided = attempted or decide(subject, current, Observed(), now, timing)
        return Decision(decided.status, [], decided.events)
    if current.phase.is_terminal:
        return Decision(current)
    if fault.action in (Action.KEEP_FINISHED_STAGES, Action.STORE_REPORT):
        unkept = _without_what_it_keeps(subject, current, fault, now, timing, observed or Observed())
        if unkept is not None:
            return unkept
        attempted = None  # a verdict is written with its report or not at all: retried as any fault
    if attempted is not None and attempted.status.phase.is_terminal:
        return cleanup_failed(subject, current, attempted, fault.message, now, by_hand=by_hand)
    limit, deadline = _phase_deadline(subject.spec, current.phase, timing)
    if fault.permanent or elapsed(current, now) > limit:
        why = "" if fault.permanent else f" (retried every tick until {deadline} passed)"
        round_ = rounds.current(current)
        if round_ is not None:  # the round ends, not the experiment: the stages' verdict stands
            why = f"{fault.reason}: {fault.message}{why}"
            return round_failed(subject, current, round_, why, observed or Observed(), now)
        return fail(
            current, subject, now, fault.reason, f"{fault.message}{why}", _assumed(observed, attempted)
        )
    return Decision(current.model_copy(update={"message": f"{RETRYING}{fault.message}"}))


def _assumed(observed: Observed | None, attempted: Decision | None) -> Observed:
    """What a failure after a fault cleans up: the arms as observed, taken to exist when nothing
    was observed or when the tick was creating them (the fault may have come after them: a later
    child refused, so no GPU is left held)."""
    creating = attempted is not None and Action.CREATE_ARMS in attempted.actions
    if observed is not None and not creating:
        return observed
    seen = observed or Observed()
    arms = {arm: replace(seen.arms.get(arm, ArmState()), exists=True) for arm in spec.Arm}
    return replace(seen, arms=arms)


def _without_what_it_keeps(
    subject: Subject,
    current: ExperimentStatus,
    fault: Fault,
    now: datetime,
    timing: Timing,
    observed: Observed,
) -> Decision | None:
    """The decision once what it would have kept could not be: a failure during the load stands
    without the stages it finished; a verdict whose report has nowhere to go (a permanent fault:
    its name is taken) stands without it, saying so. None: retried as any fault (the verdict is
    written with its report, or not at all)."""
    decided = decide(subject, current, observed, now, timing)
    if Action.KEEP_FINISHED_STAGES in decided.actions:
        return keep_finished(decided, Finished(), total=0)
    judged = observed.analysis
    if fault.permanent and isinstance(judged, Judgement) and judged.report is not None:
        unreported = replace(
            judged, message=f"{judged.message}; {fault.message}", results_ref=None, report=None
        )
        return decide(subject, current, replace(observed, analysis=unreported), now, timing)
    return None


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
        observed_generation=subject.generation, phase=Phase.PENDING, phase_started_at=ts(now)
    )
    if subject.spec is None:
        return fail(fresh, subject, now, "InvalidSpec", "; ".join(subject.problems) or "the spec is invalid")
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
    current = with_arm_refs(subject, current, observed)
    colocated = s.placement.colocate is spec.Colocate.REQUIRED
    failure = failures.pod_failure(observed, now, timing, colocated=colocated) or failures.creation_refused(
        observed, now, timing
    )
    if failure is not None:
        return fail(current, subject, now, *failure, observed)
    ready = all(observed.arms.get(arm, ArmState()).ready for arm in spec.Arm)
    if ready and (observed.hosts or observed.environment is not None):
        # Where the arms run is known from here on, whatever happens next (it may explain a failure).
        current = current.model_copy(update={"environment": _environment(s, observed)})
    differ_pods = _arm_differences(observed) if ready else []
    if differ_pods and s.analysis.fairness is spec.Fairness.FAIL:
        # Before the load: nothing would be measured but the difference.
        current = current.model_copy(update={"arm_differences": differ_pods})
        return fail(current, subject, now, "ArmsDiffer", fairness.message(differ_pods), observed)
    if ready and observed.scraped is False:
        # Starting the load before Prometheus discovers the arms would lose the first stage's counters.
        if elapsed(current, now) > timedelta(seconds=s.deadlines.deploy_seconds):
            return fail(
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
        entered = enter(
            current.model_copy(
                update={
                    "environment": environment,
                    "started_at": ts(now),
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
    if elapsed(current, now) > timedelta(seconds=s.deadlines.deploy_seconds):
        waiting = [arm.value for arm in spec.Arm if not observed.arms.get(arm, ArmState()).ready]
        return fail(
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
    failure = failures.pod_failure(observed, now, timing, restarts_fail=True)
    if failure is not None:
        return _during_load(observed, fail(current, subject, now, *failure, observed))
    disrupted = failures.arm_disruption(observed, current)
    if disrupted is not None:
        return _during_load(observed, fail(current, subject, now, "ArmDisrupted", disrupted, observed))
    job = observed.job
    stuck = failures.load_pod_failure(observed)
    if stuck is not None:
        return _during_load(observed, fail(current, subject, now, "LoadJobFailed", stuck, observed))
    if job.failed:
        detail = job.message or job.reason or "the load Job failed"
        if job.pod is not None and job.pod.last_terminated_reason:
            pod = job.pod
            detail += f" (load pod {pod.name}: {pod.last_terminated_reason}, exit {pod.last_exit_code})"
        return _during_load(
            observed,
            fail(current, subject, now, "LoadJobFailed", f"{detail}; read the load Job's log", observed),
        )
    if job.succeeded:
        return enter(
            current, subject, Phase.ANALYZING, now, "LoadFinished", "collecting and judging results", []
        )
    if elapsed(current, now) > timedelta(seconds=s.deadlines.run_seconds):
        return _during_load(
            observed,
            fail(
                current,
                subject,
                now,
                "RunDeadlineExceeded",
                f"the load did not finish within spec.deadlines.run ({s.deadlines.run}); "
                "lower requestsPerStage or raise the deadline",
                observed,
            ),
        )
    return Decision(current, [Action.CREATE_LOAD])


def _analyzing(
    subject: Subject, current: ExperimentStatus, observed: Observed, now: datetime, timing: Timing
) -> Decision:
    outcome = observed.analysis
    if outcome is None:
        return Decision(current)
    if isinstance(outcome, CollectFailure):
        if outcome.transient and elapsed(current, now) <= timing.analysis_grace:
            waiting = current.model_copy(
                update={"reason": outcome.reason, "message": f"{RETRYING}{outcome.message}"}
            )
            return Decision(waiting)
        if outcome.stages:
            kept = {"stages": outcome.stages, "speedup_summary": outcome.speedup_summary}
            current = current.model_copy(update={**kept, "validity": outcome.validity})
        return fail(current, subject, now, outcome.reason, outcome.message, observed)
    environment = outcome.environment or current.environment
    if outcome.next_round is not None:
        return start_round(subject, current, outcome, outcome.next_round, now)
    done = current.model_copy(
        update={
            "phase": Phase.COMPLETED,
            "verdict": outcome.verdict,
            "reason": outcome.reason,
            "message": fairness.qualify(outcome.message, current.arm_differences),
            "stages": outcome.stages,
            "recommendation": outcome.recommendation,
            "noise_floor": outcome.noise_floor,
            "speedup_summary": outcome.speedup_summary,
            "validity": outcome.validity,
            "environment": environment,
            "results_ref": outcome.results_ref,
            "crossover": outcome.crossover,
            "search": outcome.search,
            "degradations": current.degradations if outcome.degradations is None else outcome.degradations,
            "completed_at": ts(now),
            "phase_started_at": ts(now),
        }
    )
    done, cleanup = cleaned_up(subject, done, observed)
    done = with_conditions(done, subject.generation, now, previous=current)
    kind = "Normal" if outcome.verdict is Verdict.PROMOTE else "Warning"
    event = Event(kind, outcome.verdict.value, f"{outcome.verdict.value} ({outcome.reason}): {done.message}")
    store = [Action.STORE_REPORT] if outcome.report is not None else []
    return Decision(done, [*store, *cleanup], [event], outcome.report)


def _abort(subject: Subject, current: ExperimentStatus, observed: Observed, now: datetime) -> Decision:
    """Failed with reason Aborted; both arms and the load Job are deleted whatever `spec.cleanup` says."""
    was = current.phase.value
    failed = fail(
        current,
        subject,
        now,
        "Aborted",
        f"aborted by the annotation {keys.ABORT_ANNOTATION} while {was}; the arms and the load Job are deleted",
    )
    deleted = abort_cleanup(observed)
    ended_status = failed.status
    if Action.CLEANUP_ARMS in deleted:
        ended_status = ended_status.model_copy(update={"cleanup": status.ArmsCleanup.DELETED})
    stale = [Action.DELETE_STALE] if observed.stale_children else []
    ended = Decision(ended_status, [*stale, *deleted], failed.events)
    if current.phase is not Phase.RUNNING or rounds.current(current) is not None or subject.spec is None:
        return ended
    return _during_load(observed, ended)  # a run aborted during the load keeps what it finished


def _during_load(observed: Observed, failed: Decision) -> Decision:
    """A failure of the stages' load: the stages its Job stored are read first (`finished.py`)."""
    if not observed.job.stored:
        return failed
    return replace(failed, actions=[Action.KEEP_FINISHED_STAGES, *failed.actions])


def _terminal(subject: Subject, current: ExperimentStatus, observed: Observed, now: datetime) -> Decision:
    """Nothing more to do, unless the ending's cleanup failed: then it is retried."""
    if current.cleanup is status.ArmsCleanup.RETRYING:
        return retry_cleanup(subject, current, observed, now)
    return Decision(current)


# -------------------------------------------------------------------------------------- helpers


def _arm_differences(observed: Observed) -> list[status.ArmDifference]:
    """How the arms' live pods differ beyond speculation (none while either pod was not read)."""
    control, treatment = (observed.arm_pods.get(arm) for arm in (spec.Arm.CONTROL, spec.Arm.TREATMENT))
    if control is None or treatment is None:
        return []
    return fairness.differences(control, treatment)


def _environment(s: spec.ExperimentSpec, observed: Observed) -> status.Environment:
    if observed.environment is not None:
        return observed.environment
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
