"""The test infrastructure itself: CRD handling, scheduling onto fake GPU nodes, Prometheus discovery,
and the harness's own process hygiene. Every test here talks to a real API server."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from experiment_crd import CRD_NAME, EXAMPLE
from fake_gpu_nodes import GPU_PRODUCT, GPU_TOLERATION, GPUS_PER_NODE
from k8s_cluster import POD_CIDR, Cluster, ClusterStartError, ControlPlane, wait_for
from prometheus_server import Prometheus

pytestmark = pytest.mark.e2e

MANAGED_BY = {"app.kubernetes.io/managed-by": "specdecode-operator"}


def test_the_experiment_crd_installs_and_is_established(cluster: Cluster, crd: Path) -> None:
    obj = cluster.get_json(f"crd/{CRD_NAME}")
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NamesAccepted") == "True"
    names = obj["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "SpecDecodeExperiment",
        "specdecodeexperiments",
        ["sdx"],
    )
    (version,) = [v for v in obj["spec"]["versions"] if v["name"] == "v1alpha1"]
    assert version["served"] and version["storage"]
    assert "status" in version.get("subresources", {})
    resources = cluster.kubectl("api-resources", "--api-group=specdecode.io", "-o", "name").stdout.split()
    assert resources == [CRD_NAME]


def test_an_example_experiment_applies_and_its_status_subresource_round_trips(
    cluster: Cluster, crd: Path, namespace: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(experiment("e2e-ngram")))
    status = {"phase": "Running", "observedGeneration": 1, "reason": "LoadRunning", "message": "stage low"}
    cluster.kubectl(
        "patch", "-n", namespace, "sdx/e2e-ngram", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    got = cluster.get_json("-n", namespace, "sdx/e2e-ngram")
    assert got["status"] == status
    assert got["spec"]["cleanup"] == "Always"  # the schema default was applied

    # Writes to the main resource do not touch status (it really is a subresource) ...
    cluster.kubectl(
        "patch", "-n", namespace, "sdx/e2e-ngram", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Failed"}, "spec": {"model": "Qwen/Qwen3-8B"}}),
    )  # fmt: skip
    got = cluster.get_json("-n", namespace, "sdx/e2e-ngram")
    assert got["status"]["phase"] == "Running"
    assert got["spec"]["model"] == "Qwen/Qwen3-8B"
    assert got["metadata"]["generation"] == 2
    # ... and the printer columns read status.
    table = cluster.kubectl("get", "-n", namespace, "sdx").stdout
    assert "e2e-ngram" in table and "Running" in table


def experiment(name: str, **spec: Any) -> dict[str, Any]:
    """examples/ngram.yaml, renamed, without its namespace, with top-level spec fields replaced."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name}
    doc["spec"].update(spec)
    doc["spec"] = {k: v for k, v in doc["spec"].items() if v is not None}
    return doc


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "an enum value outside the enum": (
        {"cleanup": "Sometimes"},
        'spec.cleanup: Unsupported value: "Sometimes": supported values: "Always", "OnSuccess", "Never"',
    ),
    "a CEL rule violation": (
        {"speculative": {"method": "draft_model", "numSpeculativeTokens": 5}},
        "speculative.model is required for this method: name the draft model or head",
    ),
    "a CEL rule on list items": (
        {"workload": {"stages": [{"name": "both", "rate": 1.0, "concurrency": 4}]}},
        "a stage needs exactly one of rate (open loop) or concurrency (closed loop)",
    ),
    "both stages and a sweep": (
        {
            "workload": {
                "stages": [{"name": "c1", "concurrency": 1}],
                "sweep": {"concurrency": {"values": [1, 4]}},
            }
        },
        "set exactly one of stages or sweep",
    ),
    "a sweep over both loads": (
        {"workload": {"sweep": {"concurrency": {"values": [1]}, "rate": {"values": [1]}}}},
        "a sweep needs exactly one of concurrency or rate",
    ),
    "a search over both loads": (
        {
            "workload": {
                "stages": [{"name": "c1", "concurrency": 1}],
                "search": {"concurrency": {"from": 1, "to": 8}, "rate": {"from": 1, "to": 8}},
            }
        },
        "a search needs exactly one of concurrency or rate",
    ),
    "a trace with two sources": (
        {
            "workload": {
                "dataset": {"type": "trace", "builtin": "bursty", "path": "t.jsonl"},
                "stages": [{"name": "r2", "rate": 2}],
            }
        },
        "a trace dataset needs exactly one of configMap, path or builtin",
    ),
    "a geometric sweep without steps": (
        {"workload": {"sweep": {"rate": {"from": 1, "to": 8}}}},
        "a geometric sweep needs from, to and steps",
    ),
    "a missing required field": ({"model": None}, "spec.model: Required value"),
    "a value out of range": (
        {"speculative": {"method": "ngram", "numSpeculativeTokens": 0}},
        "spec.speculative.numSpeculativeTokens in body should be greater than 0",
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_experiment_is_refused_by_the_api_server_with_the_schema_message(
    cluster: Cluster, crd: Path, namespace: str, case: str
) -> None:
    spec, message = INVALID[case]
    res = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(experiment("bad", **spec)), check=False
    )
    assert res.returncode != 0, res.stdout
    assert "is invalid" in res.stderr
    assert message in res.stderr
    assert cluster.get_json("-n", namespace, "sdx")["items"] == []


def test_the_example_used_above_is_itself_valid(cluster: Cluster, crd: Path, namespace: str) -> None:
    res = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(experiment("ok"))
    )
    assert "(server dry run)" in res.stdout


def test_a_sweep_without_stages_is_accepted_by_the_api_server(
    cluster: Cluster, crd: Path, namespace: str
) -> None:
    sweep = {"sweep": {"concurrency": {"from": 1, "to": 64, "steps": 7}}}
    res = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(experiment("swept", workload=sweep)),
    )
    assert "(server dry run)" in res.stdout


def test_a_trace_dataset_from_a_config_map_is_accepted_by_the_api_server(
    cluster: Cluster, crd: Path, namespace: str
) -> None:
    workload = {
        "dataset": {"type": "trace", "configMap": {"name": "traces", "key": "prod.jsonl"}},
        "stages": [{"name": "r2", "rate": 2}],
    }
    res = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(experiment("traced", workload=workload)),
    )
    assert "(server dry run)" in res.stdout


def gpu_deployment(name: str, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT},
                    "tolerations": [GPU_TOLERATION],
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:never-pulled",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def pods_of(cluster: Cluster, namespace: str, app: str) -> list[dict[str, Any]]:
    return list(cluster.get_json("pods", "-n", namespace, "-l", f"app={app}")["items"])


def test_a_one_gpu_deployment_is_scheduled_onto_a_fake_gpu_node_and_runs(
    cluster: Cluster, gpu_nodes: list[str], namespace: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(gpu_deployment("one-gpu", 1)))
    cluster.kubectl("rollout", "status", "-n", namespace, "deployment/one-gpu", "--timeout=90s", timeout=100)
    (pod,) = pods_of(cluster, namespace, "one-gpu")
    assert pod["spec"]["nodeName"] in gpu_nodes
    assert pod["status"]["phase"] == "Running"
    if cluster.builtin:
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(POD_CIDR)


def test_a_deployment_asking_for_more_gpus_than_any_node_has_stays_pending_unschedulable(
    cluster: Cluster, gpu_nodes: list[str], namespace: str
) -> None:
    gpus = GPUS_PER_NODE + 1
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(gpu_deployment("too-many", gpus)))

    def unschedulable() -> dict[str, Any] | None:
        for pod in pods_of(cluster, namespace, "too-many"):
            for c in pod["status"].get("conditions", []):
                if c["type"] == "PodScheduled" and c["status"] == "False":
                    return dict(c)
        return None

    cond = wait_for("PodScheduled=False", unschedulable)
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    (pod,) = pods_of(cluster, namespace, "too-many")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def scrape_pod(name: str, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            # kwok's fake GPU nodes: the node agent's nodes carry one more taint, and would run the pod
            "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT},
            "tolerations": [GPU_TOLERATION],
            "containers": [{"name": "c", "image": "never-pulled", "ports": [{"containerPort": 9999}]}],
        },
    }


def test_prometheus_discovers_a_managed_pod_through_the_api_server_with_the_project_labels(
    cluster: Cluster, gpu_nodes: list[str], namespace: str, prometheus: Prometheus
) -> None:
    managed = {**MANAGED_BY, "specdecode.io/experiment": "e2e-exp", "specdecode.io/arm": "treatment"}
    pods = [
        scrape_pod("managed", managed, {"prometheus.io/port": "8123"}),
        scrape_pod("unmanaged", {"specdecode.io/arm": "control"}, {}),
    ]
    cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}),
    )
    cluster.kubectl(
        "wait", "-n", namespace, "--for=jsonpath={.status.phase}=Running", "pod/managed", "--timeout=60s"
    )
    pod_ip = cluster.get_json("-n", namespace, "pod/managed")["status"]["podIP"]

    def ours() -> list[dict[str, Any]]:
        return [t for t in prometheus.active_targets() if t["labels"].get("namespace") == namespace]

    (target,) = wait_for("the managed pod as an active target", ours, timeout=60, interval=1.0)
    assert target["labels"] == {
        "instance": f"{pod_ip}:8123",
        "job": "specdecode-pods",
        "namespace": namespace,
        "pod": "managed",
        "specdecode_io_experiment": "e2e-exp",
        "specdecode_io_arm": "treatment",
    }
    assert target["scrapeUrl"] == f"http://{pod_ip}:8123/metrics"
    dropped = prometheus.api("/api/v1/targets", state="dropped")["droppedTargets"]
    assert any(
        t["discoveredLabels"].get("__meta_kubernetes_pod_name") == "unmanaged"
        and t["discoveredLabels"].get("__meta_kubernetes_namespace") == namespace
        for t in dropped
    )


def test_a_control_plane_that_fails_to_start_reports_its_log_and_leaves_no_process(
    k8s_bin_dir: Path, tmp_path: Path
) -> None:
    cp = ControlPlane(k8s_bin_dir, workdir=tmp_path, feature_gates=["NoSuchFeatureGate=true"])
    with pytest.raises(ClusterStartError, match="kube-apiserver exited") as err:
        cp.start()
    assert "NoSuchFeatureGate" in str(err.value)
    assert [c.name for c in cp.components] == ["etcd", "kube-apiserver"]
    assert all(c.proc.returncode is not None for c in cp.components)
    assert not [pid for pid in cp.pids if pid_alive(pid)]


def test_a_stopped_control_plane_leaves_no_process_behind(control_plane_factory: Any) -> None:
    cp: ControlPlane = control_plane_factory()
    assert cp.cluster is not None
    assert cp.cluster.kubectl("get", "--raw=/readyz").stdout == "ok"
    pids = cp.pids
    assert len(pids) == 5 and all(pid_alive(p) for p in pids)
    cp.stop()
    assert not [p for p in pids if pid_alive(p)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_watch_list_stream_works_as_kopf_initial_streaming_needs(cluster: Cluster, namespace: str) -> None:
    # sendInitialEvents needs etcd >= 3.5.13 (RequestWatchProgress); older etcd answers with an ERROR event.
    query = "watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=2"
    out = cluster.kubectl("get", f"--raw=/api/v1/namespaces?{query}", timeout=30).stdout
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    types = [e["type"] for e in events]
    assert "ERROR" not in types, events
    names = [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"]
    assert namespace in names
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks
    assert bookmarks[0]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
