"""Failure detection: which observed pod or arm ends the experiment (or the round), and why. Pure.

Each finder returns (reason, message) or a message, for `reconcile.decide` to end the phase with; the
messages name the arm, its pod and how to fix the cause.
"""

from __future__ import annotations

from datetime import datetime

from specdecode.experiment import spec
from specdecode.experiment.status import ExperimentStatus
from specdecode.experiment.world import ArmState, Observed, Timing

# Container waiting reasons that will not fix themselves; the experiment fails at once.
FATAL_WAITING = {
    "ImagePullBackOff": "the image cannot be pulled; check spec.engine.image and the pull secret",
    "ErrImageNeverPull": "the image is not on the node and imagePullPolicy is Never",
    "InvalidImageName": "spec.engine.image is not a valid image reference",
    "CreateContainerConfigError": "the container's configuration is broken (a missing Secret or ConfigMap?)",
    "CreateContainerError": "the container could not be created",
    "CrashLoopBackOff": "the engine keeps crashing; read its log",
}


# The same reasons for a load pod, which runs the operator's image and reads the experiment's Secrets.
LOAD_FATAL_WAITING = {
    "ImagePullBackOff": "the operator's image (the chart's `image`) cannot be pulled on the load pod's node",
    "ErrImageNeverPull": "the operator's image is not on the node and imagePullPolicy is Never",
    "InvalidImageName": "the operator's image (the chart's `image`) is not a valid image reference",
    "CreateContainerConfigError": (
        "a Secret the load pod reads is missing from the experiment's namespace: spec.engine.apiKeySecret "
        "or the chart's resultsStore.s3.credentialsSecret"
    ),
    "CreateContainerError": "the load pod's container could not be created",
}


def load_pod_failure(observed: Observed) -> str | None:
    """Why the load Job's pod cannot start (a reason that will not fix itself), or None: without it,
    the Job waits for its pod until spec.deadlines.run."""
    pod = observed.job.pod
    if pod is None or pod.waiting_reason not in LOAD_FATAL_WAITING:
        return None
    detail = f" ({pod.waiting_message})" if pod.waiting_message else ""
    return (
        f"load pod {pod.name} cannot start: {pod.waiting_reason}{detail}: "
        f"{LOAD_FATAL_WAITING[pod.waiting_reason]}"
    )


def pod_failure(
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


def creation_refused(observed: Observed, now: datetime, timing: Timing) -> tuple[str, str] | None:
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


def arm_disruption(observed: Observed, current: ExperimentStatus) -> str | None:
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
