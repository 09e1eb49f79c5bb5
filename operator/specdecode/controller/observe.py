"""From Kubernetes objects (plain dicts) to what the decision function reasons about. Pure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from specdecode.experiment import failures, fairness, keys, manifests, reconcile, spec, status

LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
# Node labels of NVIDIA GPU Feature Discovery (current names first, then the deprecated ones) and
# of Node Feature Discovery: https://github.com/NVIDIA/k8s-device-plugin/tree/main/docs/gpu-feature-discovery
DRIVER_LABELS = ("nvidia.com/cuda.driver-version", ("major", "minor", "revision"))
DRIVER_LABELS_OLD = ("nvidia.com/cuda.driver", ("major", "minor", "rev"))
CUDA_LABELS = ("nvidia.com/cuda.runtime-version", ("major", "minor"))
CUDA_LABELS_OLD = ("nvidia.com/cuda.runtime", ("major", "minor"))
NFD_CPU_MODEL = "feature.node.kubernetes.io/cpu-model"
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


def pod_state(pod: Mapping[str, Any]) -> reconcile.PodState:
    """The failure-relevant facts of a pod."""
    status = pod.get("status") or {}
    statuses: list[dict[str, Any]] = list(status.get("containerStatuses") or [])
    unschedulable, since = None, None
    for condition in status.get("conditions") or []:
        if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            unschedulable = condition.get("message") or "no node fits"
            since = _time(condition.get("lastTransitionTime"))
    waiting_reason = waiting_message = terminated_reason = None
    exit_code = None
    restarts = 0
    image_id = None
    ready = bool(statuses) and all(s.get("ready") for s in statuses)
    for container in statuses:
        restarts += int(container.get("restartCount") or 0)
        image_id = image_id or container.get("imageID") or None
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting_reason is None:
            waiting_reason, waiting_message = waiting.get("reason"), waiting.get("message")
        for key in ("terminated",):
            terminated = (container.get("state") or {}).get(key) or (container.get("lastState") or {}).get(
                key
            )
            if terminated and terminated_reason is None:
                terminated_reason = terminated.get("reason") or "Error"
                exit_code = terminated.get("exitCode")
    return reconcile.PodState(
        name=str((pod.get("metadata") or {}).get("name", "")),
        phase=str(status.get("phase") or "Pending"),
        node=(pod.get("spec") or {}).get("nodeName"),
        ready=ready,
        unschedulable=unschedulable,
        unschedulable_since=since,
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        last_terminated_reason=terminated_reason,
        last_exit_code=exit_code,
        restarts=restarts,
        image_id=image_id,
        round=((pod.get("metadata") or {}).get("annotations") or {}).get(keys.ROUND_ANNOTATION),
    )


def host(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, *, vllm_version: str | None = None
) -> status.Host:
    """Where one arm's pod runs, from its Node's labels and capacity (GPU UUIDs are not published)."""
    node = node or {}
    labels: Mapping[str, str] = (node.get("metadata") or {}).get("labels") or {}
    vendor, family, model = (labels.get(f"{NFD_CPU_MODEL}.{key}") for key in ("vendor_id", "family", "id"))
    cpu_model = None
    if vendor or family or model:
        cpu_model = " ".join(
            part for part in (vendor, family and f"family {family}", model and f"model {model}") if part
        )
    return status.Host(
        node=(pod.get("spec") or {}).get("nodeName") or None,
        gpu_product=labels.get(LABEL_GPU_PRODUCT) or None,
        driver_version=_version(labels, DRIVER_LABELS) or _version(labels, DRIVER_LABELS_OLD),
        cuda_version=_version(labels, CUDA_LABELS) or _version(labels, CUDA_LABELS_OLD),
        cpu_model=cpu_model,
        cpu_count=_cpus(((node.get("status") or {}).get("capacity") or {}).get("cpu")),
        instance_type=next((labels[k] for k in INSTANCE_TYPE_LABELS if labels.get(k)), None),
        vllm_version=vllm_version,
    )


def arm_state(deployment: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> reconcile.ArmState:
    """One arm from its Deployment and pods (pods being deleted are only named)."""
    if deployment is None:
        return reconcile.ArmState()
    leaving = [p for p in pods if (p.get("metadata") or {}).get("deletionTimestamp")]
    live = [p for p in pods if p not in leaving]
    ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
    refused = since = None
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status")) == ("ReplicaFailure", "True"):
            refused = str(condition.get("message") or condition.get("reason") or "FailedCreate")
            since = _time(condition.get("lastTransitionTime"))
    return reconcile.ArmState(
        exists=True,
        ready_replicas=ready,
        pods=tuple(pod_state(p) for p in live),
        leaving=tuple(str((p.get("metadata") or {}).get("name", "")) for p in leaving),
        refused=refused,
        refused_since=since,
    )


def job_state(job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> reconcile.JobState:
    """The load Job: done, failed (with the condition's reason and message) or running."""
    if job is None:
        return reconcile.JobState()
    succeeded = failed = False
    reason = message = None
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            succeeded = True
        elif condition.get("type") == "Failed":
            failed, reason, message = True, condition.get("reason"), condition.get("message")
    states = [pod_state(p) for p in pods]
    # an Indexed Job's pod that failed, rather than one of the others (`spec.workload.loadPods`)
    failing = [p for p in states if p.last_exit_code not in (None, 0)]
    failing += [p for p in states if p.waiting_reason in failures.LOAD_FATAL_WAITING]  # one that cannot start
    pod = failing[0] if failing else states[-1] if states else None
    uid = (job.get("metadata") or {}).get("uid")
    return reconcile.JobState(
        exists=True, uid=uid, succeeded=succeeded, failed=failed, reason=reason, message=message, pod=pod
    )


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` names the object of `uid` among its owners."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(o, Mapping) and o.get("uid") == uid for o in owners)


def generation_of(obj: Mapping[str, Any]) -> int | None:
    """The experiment generation a child was built for."""
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.GENERATION_ANNOTATION)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def observe(
    name: str,
    generation: int,
    *,
    deployments: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    config_maps: Sequence[Mapping[str, Any]] = (),
    round_name: str | None = None,
) -> reconcile.Observed:
    """Everything the decision function needs, from lists of the experiment's children.

    `round_name`: the round in progress (`rounds.current`), whose load Job is the one observed.

    `config_maps`: the experiment's ConfigMaps (metadata is enough). The spec the load Job reads and
    the results it wrote are stale once built for another generation, like the Deployments and the
    Job; the report is not (it is replaced by the next generation's).
    """
    names = manifests.Names(name)
    current = [o for o in [*deployments, *jobs] if generation_of(o) in (None, generation)]
    measured = [
        o
        for o in config_maps
        if (n := str(o["metadata"]["name"])) == names.spec_config_map
        or n.startswith((f"{names.spec_config_map}-", f"{names.results_prefix}-"))
    ]
    stale = tuple(
        [
            str(o["metadata"]["name"])
            for o in [*deployments, *jobs]
            if generation_of(o) not in (None, generation)
        ]
        # What the load reads or wrote must name its generation: unnamed is stale too.
        + [str(o["metadata"]["name"]) for o in measured if generation_of(o) != generation]
    )
    by_name = {str(o["metadata"]["name"]): o for o in current}
    arms = {}
    for arm in spec.Arm:
        arm_pods = [p for p in _of_arm(pods, arm) if generation_of(p) in (None, generation)]
        # (not the old generation's pods, still terminating)
        arms[arm] = arm_state(by_name.get(names.arm(arm)), arm_pods)
    job_name = names.load_job_of(round_name)
    load_pods = [
        p
        for p in pods
        if (p.get("metadata") or {}).get("labels", {}).get(keys.LABEL_COMPONENT) == "load"
        and _job_name(p, default=job_name) == job_name
    ]
    job = job_state(by_name.get(job_name), load_pods)
    # The load stores its results after every stage, one bundle per load pod: `<prefix>[-podK]-0`.
    prefix = names.results_prefix_of(round_name)
    firsts = [str(o["metadata"]["name"]) for o in measured if generation_of(o) == generation]
    stored = any(n == f"{prefix}-0" or (n.startswith(f"{prefix}-pod") and n.endswith("-0")) for n in firsts)
    return reconcile.Observed(arms=arms, job=replace(job, stored=stored), stale_children=stale)


def placed_pods(pods: Sequence[Mapping[str, Any]]) -> dict[spec.Arm, Mapping[str, Any]]:
    """Each arm's live pod that is bound to a node (the newest, should there be several)."""
    placed = {}
    for arm in spec.Arm:
        bound = [
            p
            for p in _of_arm(pods, arm)
            if (p.get("spec") or {}).get("nodeName")
            and not (p.get("metadata") or {}).get("deletionTimestamp")
        ]
        if bound:
            placed[arm] = bound[-1]
    return placed


def arm_hosts(
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any] | None],
    *,
    vllm_version: str | None = None,
) -> dict[spec.Arm, status.Host]:
    """Where each placed arm runs, from its pod and its Node (`nodes` by name; None: not readable)."""
    return {
        arm: host(pod, nodes.get(str(pod["spec"]["nodeName"])), vllm_version=vllm_version)
        for arm, pod in placed_pods(pods).items()
    }


def arm_pod(pod: Mapping[str, Any], host: status.Host | None = None) -> fairness.ArmPod:
    """What `fairness.differences` compares of one arm's pod: its engine container (named `engine`,
    else the first) as the API server stored it, its `imageID`, and its node's GPU product (`host`)."""
    containers: list[Mapping[str, Any]] = list((pod.get("spec") or {}).get("containers") or [])
    engine = next((c for c in containers if c.get("name") == "engine"), containers[0] if containers else {})
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    image_id = next((s.get("imageID") for s in statuses if s.get("name") == engine.get("name")), None)
    resources = {
        f"{kind}.{key}": str(value)
        for kind in ("requests", "limits")
        for key, value in ((engine.get("resources") or {}).get(kind) or {}).items()
    }
    env = {
        str(e.get("name")): str(e["value"])
        if "value" in e
        else (f"valueFrom {json.dumps(e['valueFrom'], sort_keys=True)}" if "valueFrom" in e else "")
        for e in engine.get("env") or []
    }
    return fairness.ArmPod(
        pod=str((pod.get("metadata") or {}).get("name", "")),
        image_id=image_id or None,
        gpu_product=host.gpu_product if host is not None else None,
        resources=resources,
        argv=tuple(str(a) for a in [*(engine.get("command") or []), *(engine.get("args") or [])]),
        env=env,
    )


def arm_pods(
    pods: Sequence[Mapping[str, Any]], hosts: Mapping[spec.Arm, status.Host]
) -> dict[spec.Arm, fairness.ArmPod]:
    """Each placed arm's pod as `fairness` compares it (`hosts`: from `arm_hosts`)."""
    return {arm: arm_pod(pod, hosts.get(arm)) for arm, pod in placed_pods(pods).items()}


def _job_name(pod: Mapping[str, Any], *, default: str) -> str:
    """The Job a pod belongs to (its `batch.kubernetes.io/job-name` label, or the older `job-name`)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(keys.JOB_NAME_LABEL) or labels.get("job-name") or default)


def _of_arm(pods: Sequence[Mapping[str, Any]], arm: spec.Arm) -> list[Mapping[str, Any]]:
    return [p for p in pods if (p.get("metadata") or {}).get("labels", {}).get(keys.LABEL_ARM) == arm.value]


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _version(labels: Mapping[str, str], names: tuple[str, tuple[str, ...]]) -> str | None:
    """`<prefix>.full`, else its parts joined with dots (as far as they go)."""
    prefix, parts = names
    full = labels.get(f"{prefix}.full")
    if full:
        return full
    values = []
    for part in parts:
        value = labels.get(f"{prefix}.{part}")
        if not value:
            break
        values.append(value)
    return ".".join(values) or None


def _cpus(quantity: Any) -> int | None:
    """A CPU quantity (`64`, `63500m`) in whole CPUs."""
    text = str(quantity or "")
    try:
        return int(text[:-1]) // 1000 if text.endswith("m") else int(text)
    except ValueError:
        return None
