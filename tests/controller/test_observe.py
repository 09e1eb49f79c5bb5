from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from specdecode.controller import observe
from specdecode.experiment import fairness, keys, manifests, spec, status, validation
from tests.factories import experiment_document


def pod(name: str, arm: str | None = None, component: str = "engine", **status: Any) -> dict[str, Any]:
    labels = {"specdecode.io/experiment": "exp", "app.kubernetes.io/component": component}
    if arm:
        labels["specdecode.io/arm"] = arm
    return {"metadata": {"name": name, "labels": labels}, "spec": {"nodeName": "gpu-0"}, "status": status}


def deployment(name: str, ready: int = 0, generation: int | None = 1) -> dict[str, Any]:
    annotations = {} if generation is None else {"specdecode.io/generation": str(generation)}
    return {"metadata": {"name": name, "annotations": annotations}, "status": {"readyReplicas": ready}}


def test_unschedulable_pods_carry_the_scheduler_message_and_since_when() -> None:
    state = observe.pod_state(
        pod(
            "p",
            "control",
            phase="Pending",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                    "lastTransitionTime": "2026-11-30T12:00:00Z",
                }
            ],
        )
    )
    assert state.unschedulable == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    assert state.unschedulable_since == datetime(2026, 11, 30, 12, tzinfo=UTC)


def test_crash_loops_report_the_last_exit() -> None:
    state = observe.pod_state(
        pod(
            "p",
            "treatment",
            phase="Running",
            containerStatuses=[
                {
                    "name": "engine",
                    "ready": False,
                    "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }
            ],
        )
    )
    assert (state.waiting_reason, state.last_terminated_reason, state.last_exit_code) == (
        "CrashLoopBackOff",
        "OOMKilled",
        137,
    )
    assert state.restarts == 3 and not state.ready


def test_observe_splits_arms_and_flags_stale_children() -> None:
    observed = observe.observe(
        "exp",
        2,
        deployments=[
            deployment("exp-control", ready=1, generation=2),
            deployment("exp-treatment", generation=1),
        ],
        pods=[pod("c", "control", phase="Running"), pod("t", "treatment"), pod("l", component="load")],
        jobs=[],
    )
    assert observed.arms[spec.Arm.CONTROL].ready
    assert not observed.arms[spec.Arm.TREATMENT].exists  # built for generation 1: stale, not counted
    assert observed.stale_children == ("exp-treatment",)


def test_job_conditions() -> None:
    failed = {
        "metadata": {"name": "exp-load"},
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the limit",
                }
            ]
        },
    }
    state = observe.job_state(
        failed,
        [
            pod(
                "l",
                component="load",
                phase="Failed",
                containerStatuses=[{"state": {"terminated": {"reason": "Error", "exitCode": 3}}}],
            )
        ],
    )
    assert state.failed and state.reason == "BackoffLimitExceeded"
    assert state.pod is not None and state.pod.last_exit_code == 3
    done = {
        "metadata": {"name": "exp-load"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    assert observe.job_state(done, []).succeeded
    assert not observe.job_state(None, []).exists


def test_arm_pods_being_deleted_are_named_and_an_old_generation_s_ignored() -> None:
    def arm_pod(name: str, generation: int, **metadata: Any) -> dict[str, Any]:
        p = pod(name, "control", phase="Running")
        p["metadata"].update(annotations={"specdecode.io/generation": str(generation)}, **metadata)
        return p

    observed = observe.observe(
        "exp",
        2,
        deployments=[deployment("exp-control", ready=1, generation=2)],
        pods=[
            arm_pod("old", 1, deletionTimestamp="2026-12-01T08:00:00Z"),  # the last generation's, terminating
            arm_pod("evicted", 2, deletionTimestamp="2026-12-01T08:00:00Z"),
            arm_pod("new", 2),
        ],
        jobs=[],
    )
    control = observed.arms[spec.Arm.CONTROL]
    assert control.leaving == ("evicted",)
    assert [p.name for p in control.pods] == ["new"]


def test_a_replica_failure_is_reported_with_the_controller_s_message() -> None:
    refused = deployment("exp-control", generation=1)
    message = 'pods "exp-control-5d8f-x" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true'
    refused["status"]["conditions"] = [
        {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
        {
            "type": "ReplicaFailure",
            "status": "True",
            "reason": "FailedCreate",
            "message": message,
            "lastTransitionTime": "2026-12-01T08:00:00Z",
        },
    ]
    state = observe.arm_state(refused, [])
    assert (state.refused, state.refused_since) == (message, datetime(2026, 12, 1, 8, tzinfo=UTC))
    assert observe.arm_state(deployment("exp-control"), []).refused is None


def node(labels: dict[str, str], cpu: str = "64") -> dict[str, Any]:
    return {"metadata": {"name": "gpu-0", "labels": labels}, "status": {"capacity": {"cpu": cpu}}}


def test_a_host_is_read_from_gpu_and_node_feature_discovery_labels() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/cuda.driver-version.full": "575.57.08",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "9",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/cpu-model.family": "6",
        "feature.node.kubernetes.io/cpu-model.id": "143",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
    }
    got = observe.host(pod("p", "control"), node(labels, cpu="191500m"), vllm_version="0.20.0")
    assert got.model_dump(exclude_defaults=True) == {
        "node": "gpu-0",
        "gpu_product": "NVIDIA-H200",
        "driver_version": "575.57.08",
        "cuda_version": "12.9",
        "cpu_model": "Intel family 6 model 143",
        "cpu_count": 191,
        "instance_type": "p5.48xlarge",
        "vllm_version": "0.20.0",
    }


def test_the_deprecated_gpu_feature_discovery_labels_still_give_driver_and_cuda() -> None:
    labels = {
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "107",
        "nvidia.com/cuda.driver.rev": "02",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
    }
    got = observe.host(pod("p", "control"), node(labels))
    assert (got.driver_version, got.cuda_version, got.cpu_count) == ("550.107.02", "12.4", 64)


def test_an_unreadable_node_leaves_only_the_node_name() -> None:
    assert observe.host(pod("p", "control"), None).model_dump(exclude_defaults=True) == {"node": "gpu-0"}


def test_each_arm_gets_the_host_of_its_live_bound_pod() -> None:
    going = pod("old", "treatment")
    going["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    going["spec"]["nodeName"] = "gpu-9"
    pending = pod("pending", "control")
    del pending["spec"]["nodeName"]
    treatment = pod("new", "treatment")
    treatment["spec"]["nodeName"] = "gpu-1"
    pods = [going, pending, pod("c", "control"), treatment, pod("load", component="load")]
    nodes = {"gpu-0": node({"nvidia.com/gpu.product": "A"}), "gpu-1": node({"nvidia.com/gpu.product": "B"})}
    hosts = observe.arm_hosts(pods, nodes)
    assert {arm: (h.node, h.gpu_product) for arm, h in hosts.items()} == {
        spec.Arm.CONTROL: ("gpu-0", "A"),
        spec.Arm.TREATMENT: ("gpu-1", "B"),
    }


def live_pod(arm: spec.Arm, doc: dict[str, Any], image_id: str) -> dict[str, Any]:
    """The pod the API server would store for an arm's Deployment, with the kubelet's imageID."""
    parsed, _ = validation.parse_experiment(doc)
    assert parsed is not None
    template = manifests.build_deployment("exp", parsed, arm, manifests.Settings())["spec"]["template"]
    return {
        "metadata": {"name": f"exp-{arm.value}-x", "labels": template["metadata"]["labels"]},
        "spec": {**template["spec"], "nodeName": "gpu-0"},
        "status": {"containerStatuses": [{"name": "engine", "imageID": image_id, "ready": True}]},
    }


def test_the_arms_pods_as_built_do_not_differ_and_an_edited_one_is_named() -> None:
    doc = experiment_document(
        engine={
            "image": "vllm/vllm-openai:v0.20.0",
            "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
            "resources": {"limits": {"nvidia.com/gpu": 1}},
        }
    )
    digest = "docker.io/vllm/vllm-openai@sha256:aaa"
    pods = [live_pod(arm, doc, digest) for arm in spec.Arm]
    host = status.Host(node="gpu-0", gpu_product="NVIDIA-H200")
    hosts = dict.fromkeys(spec.Arm, host)
    same = observe.arm_pods(pods, hosts)
    assert same[spec.Arm.CONTROL].env["HF_TOKEN"].startswith("valueFrom ")
    assert same[spec.Arm.CONTROL].resources["limits.nvidia.com/gpu"] == "1"
    assert fairness.differences(same[spec.Arm.CONTROL], same[spec.Arm.TREATMENT]) == []

    edited = copy.deepcopy(pods)
    (engine,) = edited[1]["spec"]["containers"]
    engine["env"].append({"name": "EXTRA", "value": "1"})
    edited[1]["status"]["containerStatuses"][0]["imageID"] = "docker.io/vllm/vllm-openai@sha256:bbb"
    hosts[spec.Arm.TREATMENT] = status.Host(node="gpu-1", gpu_product="NVIDIA-H100-80GB-HBM3")
    differ = observe.arm_pods(edited, hosts)
    found = fairness.differences(differ[spec.Arm.CONTROL], differ[spec.Arm.TREATMENT])
    assert [d.field for d in found] == ["imageID", "gpuProduct", "env.EXTRA"]


def test_the_same_value_from_in_another_key_order_is_no_difference() -> None:
    """An env var read from the same secret is the same however the API server orders its keys
    (mutation benchmark survivor: `sort_keys=False`)."""
    doc = experiment_document(
        engine={"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]}
    )
    pods = [live_pod(arm, doc, "docker.io/vllm/vllm-openai@sha256:aaa") for arm in spec.Arm]
    (engine,) = pods[1]["spec"]["containers"]
    engine["env"] = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"key": "token", "name": "hf"}}}]
    hosts = dict.fromkeys(spec.Arm, status.Host(node="gpu-0", gpu_product="NVIDIA-H200"))
    arms = observe.arm_pods(pods, hosts)
    assert arms[spec.Arm.CONTROL].env == arms[spec.Arm.TREATMENT].env
    assert fairness.differences(arms[spec.Arm.CONTROL], arms[spec.Arm.TREATMENT]) == []


@pytest.mark.parametrize("label", [keys.JOB_NAME_LABEL, "job-name"])
def test_a_round_s_load_pod_is_not_the_stages_load_pod(label: str) -> None:
    """The stages' Job sees only its own pods: a crossover round's failed load pod (labelled with its
    Job's name, by either label Kubernetes has used) is not the stages' (mutation benchmark survivor:
    the pod's labels read as empty, so every load pod matched)."""
    mine = pod("l", component="load", phase="Running")
    mine["metadata"]["labels"][label] = "exp-load"
    other = pod(
        "x",
        component="load",
        phase="Failed",
        containerStatuses=[{"state": {"terminated": {"reason": "Error", "exitCode": 3}}}],
    )
    other["metadata"]["labels"][label] = "exp-load-crossover"
    job = {"metadata": {"name": "exp-load"}, "status": {}}
    observed = observe.observe("exp", 1, deployments=[], pods=[mine, other], jobs=[job])
    assert observed.job.pod is not None and observed.job.pod.name == "l"


def test_the_load_pod_that_failed_is_the_one_an_indexed_job_reports() -> None:
    """Of the pods of a Job of `loadPods` > 1, the one that exited non-zero, whichever came last."""
    failed = {
        "metadata": {"name": "exp-load"},
        "status": {"conditions": [{"type": "Failed", "status": "True"}]},
    }

    def load_pod(name: str, code: int | None) -> dict[str, Any]:
        state = {"running": {}} if code is None else {"terminated": {"reason": "Error", "exitCode": code}}
        return pod(name, component="load", containerStatuses=[{"state": state}])

    pods = [load_pod("exp-load-0-a", 0), load_pod("exp-load-1-b", 3), load_pod("exp-load-2-c", None)]
    state = observe.job_state(failed, pods)
    assert state.pod is not None and (state.pod.name, state.pod.last_exit_code) == ("exp-load-1-b", 3)
    assert observe.job_state(failed, pods[:1] + pods[2:]).pod.name == "exp-load-2-c"  # type: ignore[union-attr]


def test_the_load_pod_that_cannot_start_is_the_one_an_indexed_job_reports() -> None:
    """A pod waiting on a missing Secret is reported over the running ones (the Job runs on meanwhile)."""
    running = {"metadata": {"name": "exp-load"}, "status": {}}
    waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "keys" not found'}}
    pods = [
        pod("exp-load-0-a", component="load", containerStatuses=[{"state": waiting}]),
        pod("exp-load-1-b", component="load", containerStatuses=[{"state": {"running": {}}}]),
    ]
    state = observe.job_state(running, pods)
    assert state.pod is not None
    assert (state.pod.name, state.pod.waiting_reason) == ("exp-load-0-a", "CreateContainerConfigError")
