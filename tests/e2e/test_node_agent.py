"""Pods on the node agent's fake nodes really run: processes, probes, Services, status, cleanup."""

from __future__ import annotations

import json
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fake_gpu_nodes import (
    AGENT_CPU_NODE_NAMES,
    AGENT_LABEL,
    AGENT_SPARE_NODE,
    AGENT_TAINT,
    AGENT_TOLERATION,
    GPU_PRODUCT,
    GPU_TOLERATION,
    agent_cpu_node,
)
from k8s_cluster import Cluster, wait_for
from node_agent import NodeAgent, agent_leftovers, host_path_claim, netns_list
from prometheus_server import Prometheus

pytestmark = pytest.mark.e2e

SIM_ARGS = ["sim/llama-8b", "--host", "0.0.0.0", "--port", "8000", "--profile", "h200-8b-draft-tiny"]
PROBE = {"httpGet": {"path": "/health", "port": "http"}}
APP = "app.kubernetes.io/name"


def apply(cluster: Cluster, namespace: str, *objs: dict[str, Any]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(items))


def deployment(name: str, command: list[str], args: list[str], *, gpu: bool = True) -> dict[str, Any]:
    """A one-replica Deployment like an arm: GPU node selector and tolerations, probes on `http`."""
    container: dict[str, Any] = {
        "name": "engine",
        "image": "never-pulled",
        "command": command,
        "args": args,
        "ports": [{"name": "http", "containerPort": 8000}],
        "startupProbe": {**PROBE, "periodSeconds": 10, "failureThreshold": 30},
        "readinessProbe": {**PROBE, "periodSeconds": 5},
    }
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    labels = {APP: name, "app.kubernetes.io/managed-by": "specdecode-operator"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {APP: name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT, AGENT_LABEL: "true"},
                    "tolerations": [GPU_TOLERATION, AGENT_TOLERATION],
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 5,
                    "containers": [container],
                },
            },
        },
    }


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {APP: name}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
    }


def job(name: str, script: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "containers": [
                        {"name": "main", "image": "never-pulled", "command": ["python", "-c", script]}
                    ],
                    **spec,
                }
            },
        },
    }


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(cluster.get_json("pods", "-n", namespace, "-l", selector)["items"])


def one_pod(cluster: Cluster, namespace: str, selector: str) -> dict[str, Any]:
    found = wait_for(f"a pod {selector}", lambda: pods(cluster, namespace, selector), timeout=60)
    return dict(found[0])


def job_condition(cluster: Cluster, namespace: str, name: str) -> str | None:
    conds = cluster.get_json(f"job/{name}", "-n", namespace).get("status", {}).get("conditions", [])
    done = [c["type"] for c in conds if c["type"] in ("Complete", "Failed") and c["status"] == "True"]
    return done[0] if done else None


def sim_deployment(name: str, *extra: str) -> dict[str, Any]:
    return deployment(name, ["specdecode", "sim"], [*SIM_ARGS, "--served-model-name", name, *extra])


def test_a_simulator_deployment_on_a_fake_gpu_node_becomes_available_answers_and_is_scraped(
    cluster: Cluster, node_agent: NodeAgent, namespace: str, prometheus: Prometheus
) -> None:
    apply(cluster, namespace, sim_deployment("sim"))
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Available", "deployment/sim", "--timeout=90s", timeout=100
    )
    pod = one_pod(cluster, namespace, f"{APP}=sim")
    assert pod["spec"]["nodeName"].startswith("agent-gpu-")
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.65.") and pod["status"]["podIPs"] == [{"ip": ip}]
    (cs,) = pod["status"]["containerStatuses"]
    assert cs["ready"] and cs["started"] and "running" in cs["state"] and cs["restartCount"] == 0

    with urllib.request.urlopen(f"http://{ip}:8000/v1/models", timeout=5) as resp:
        models = json.load(resp)
    assert [m["id"] for m in models["data"]] == ["sim"]

    def up() -> list[Any]:
        res = prometheus.api(
            "/api/v1/query", query=f'up{{namespace="{namespace}",pod="{pod["metadata"]["name"]}"}}'
        )
        return [r for r in res["result"] if r["value"][1] == "1"]

    (sample,) = wait_for("Prometheus scraping the pod (up == 1)", up, timeout=60, interval=1.0)
    assert sample["metric"]["instance"] == f"{ip}:8000"


CLAIM_READER = textwrap.dedent(
    """
    import pathlib, time
    whole, sub = pathlib.Path("/data"), pathlib.Path("/data-sub")
    (sub / "out").write_text((whole / "in").read_text() + ", seen")
    time.sleep(600)
    """
)


def test_a_pod_waits_for_its_claim_then_mounts_the_bound_volumes_own_host_directory(
    cluster: Cluster, node_agent: NodeAgent, namespace: str, tmp_path: Path
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "in").write_text("from the volume")
    container = {
        "name": "main",
        "image": "never-pulled",
        "command": ["python", "-c", CLAIM_READER],
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "data", "mountPath": "/data-sub", "subPath": "sub"},  # created on first use
        ],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reader"},
        "spec": {
            "nodeName": AGENT_CPU_NODE_NAMES[0],  # bound by hand: the scheduler waits for the claim
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "late"}}],
        },
    }
    apply(cluster, namespace, pod)

    def waiting() -> dict[str, Any] | None:
        statuses = cluster.get_json("pod/reader", "-n", namespace).get("status", {}).get("containerStatuses")
        state = (statuses or [{}])[0].get("state", {})
        return state.get("waiting") if "not found" in str(state) else None

    waited = wait_for("the pod waiting for its claim", waiting, timeout=30)
    assert waited == {"reason": "ContainerCreating", "message": 'persistentvolumeclaim "late" not found'}
    pv_name = f"{namespace}-late"
    try:
        apply(cluster, namespace, *host_path_claim(pv_name, "late", namespace, volume))
        out = volume / "sub" / "out"
        wait_for("the pod writing through its subPath", out.exists, timeout=60)
        assert out.read_text() == "from the volume, seen"
        cluster.kubectl("delete", "pod", "reader", "-n", namespace, "--timeout=30s", timeout=40)
        assert (volume / "in").exists() and out.exists(), "the agent must never remove a volume's data"
    finally:
        cluster.kubectl("delete", "pv", pv_name, "--wait=false", "--ignore-not-found", check=False)


ROLE_AND_ACCOUNT: list[dict[str, Any]] = [
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "writer"}},
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "writer"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "update", "patch"]}
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "writer"}],
    },
]

CLIENT = textwrap.dedent(
    """
    import json, os, pathlib, socket, urllib.request
    from kubernetes import client, config
    seen = {}
    with urllib.request.urlopen("http://sim:8000/v1/models", timeout=5) as r:
        seen["models"] = [m["id"] for m in json.load(r)["data"]]
    with urllib.request.urlopen(f"http://sim.{os.environ['POD_NAMESPACE']}.svc.cluster.local:8000/health") as r:
        seen["fqdn_status"] = r.status
    seen["sim_ip"] = socket.gethostbyname("sim")
    seen["hostname"] = socket.gethostname()
    seen["env"] = {k: os.environ[k] for k in ("POD_NAMESPACE", "POD_NAME", "POD_IP", "GREETING", "PASSWORD")}
    seen["experiment"] = pathlib.Path("/etc/specdecode/experiment.yaml").read_text()
    pathlib.Path("/results/out.txt").write_text("scratch")
    seen["scratch"] = pathlib.Path("/results/out.txt").read_text()
    config.load_incluster_config()
    body = {"metadata": {"name": "seen"}, "data": {"seen": json.dumps(seen)}}
    client.CoreV1Api().create_namespaced_config_map(os.environ["POD_NAMESPACE"], body)
    """
)


def test_a_job_reaches_a_service_by_name_reads_its_volumes_and_env_and_writes_with_its_token(
    cluster: Cluster, node_agent: NodeAgent, namespace: str
) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "spec"}}
    config_map["data"] = {"experiment.yaml": "kind: SpecDecodeExperiment\n", "greeting": "hello"}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "key"},
        "stringData": {"pw": "s3cret"},
    }
    apply(cluster, namespace, sim_deployment("sim"), service("sim"), config_map, secret, *ROLE_AND_ACCOUNT)
    env = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "spec", "key": "greeting"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "key", "key": "pw"}}},
    ]
    client = job("client", CLIENT, serviceAccountName="writer")
    c = client["spec"]["template"]["spec"]["containers"][0]
    c["env"] = env
    c["volumeMounts"] = [
        {"name": "experiment", "mountPath": "/etc/specdecode", "readOnly": True},
        {"name": "results", "mountPath": "/results"},
    ]
    client["spec"]["template"]["spec"]["volumes"] = [
        {
            "name": "experiment",
            "configMap": {"name": "spec", "items": [{"key": "experiment.yaml", "path": "experiment.yaml"}]},
        },
        {"name": "results", "emptyDir": {}},
    ]
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Available", "deployment/sim", "--timeout=90s", timeout=100
    )
    apply(cluster, namespace, client)
    result = wait_for("the Job done", lambda: job_condition(cluster, namespace, "client"), timeout=90)
    pod = one_pod(cluster, namespace, "job-name=client")
    slices = cluster.kubectl("get", "endpointslices", "-n", namespace, "-o", "yaml").stdout
    assert result == "Complete", f"{node_agent.pod_log(pod)}\n{node_agent.services}\n{slices}"
    assert pod["status"]["phase"] == "Succeeded"
    (cs,) = pod["status"]["containerStatuses"]
    assert cs["state"]["terminated"]["exitCode"] == 0 and cs["state"]["terminated"]["reason"] == "Completed"

    seen = json.loads(cluster.get_json("configmap/seen", "-n", namespace)["data"]["seen"])
    sim_pod = one_pod(cluster, namespace, f"{APP}=sim")
    assert seen["models"] == ["sim"] and seen["fqdn_status"] == 200
    assert seen["sim_ip"] == sim_pod["status"]["podIP"]
    assert seen["hostname"] == pod["metadata"]["name"]
    assert seen["env"] == {
        "POD_NAMESPACE": namespace,
        "POD_NAME": pod["metadata"]["name"],
        "POD_IP": pod["status"]["podIP"],
        "GREETING": "hello",
        "PASSWORD": "s3cret",
    }
    assert seen["experiment"] == "kind: SpecDecodeExperiment\n" and seen["scratch"] == "scratch"
    assert not Path("/results/out.txt").exists(), "the emptyDir is the pod's, not the host's"


def test_a_crashing_container_shows_crash_loop_back_off_and_a_failing_job_pod_fails_the_job(
    cluster: Cluster, node_agent: NodeAgent, namespace: str
) -> None:
    crasher = deployment("crasher", ["python", "-c", "import sys; print('bye'); sys.exit(3)"], [])
    apply(cluster, namespace, crasher, job("failing", "raise SystemExit(2)"))

    def crash_looping() -> dict[str, Any] | None:
        found = pods(cluster, namespace, f"{APP}=crasher")
        for cs in (found[0] if found else {}).get("status", {}).get("containerStatuses", []):
            if (cs["state"].get("waiting") or {}).get("reason") == "CrashLoopBackOff" and cs[
                "restartCount"
            ] >= 1:
                return dict(cs)
        return None

    cs = wait_for("CrashLoopBackOff after a restart", crash_looping, timeout=60)
    assert (
        cs["lastState"]["terminated"]["exitCode"] == 3 and cs["lastState"]["terminated"]["reason"] == "Error"
    )
    assert not cs["ready"]

    assert (
        wait_for("the Job done", lambda: job_condition(cluster, namespace, "failing"), timeout=60) == "Failed"
    )
    pod = one_pod(cluster, namespace, "job-name=failing")
    assert pod["status"]["phase"] == "Failed"
    (jcs,) = pod["status"]["containerStatuses"]
    assert jcs["state"]["terminated"]["exitCode"] == 2 and jcs["restartCount"] == 0


def test_a_deleted_pod_stops_its_processes_and_its_network_namespace_goes_away(
    cluster: Cluster, node_agent: NodeAgent, namespace: str
) -> None:
    apply(cluster, namespace, sim_deployment("sim"))
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Available", "deployment/sim", "--timeout=90s", timeout=100
    )
    pod = one_pod(cluster, namespace, f"{APP}=sim")
    rt = node_agent.pods[pod["metadata"]["uid"]]
    procs = [c.proc for c in rt.containers if c.proc is not None]
    assert procs and rt.netns in netns_list()
    cluster.kubectl("delete", "-n", namespace, "deployment/sim", "--wait=false")
    wait_for("the pod gone", lambda: not pods(cluster, namespace, f"{APP}=sim"), timeout=60)
    assert all(p.poll() is not None for p in procs)
    assert rt.netns not in netns_list()


def test_an_agent_stopped_with_pods_running_leaves_no_process_namespace_or_link(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """As when a test fails with pods still running: the agent's teardown (or atexit) cleans up."""
    spare = agent_cpu_node(AGENT_SPARE_NODE)
    spare["spec"]["taints"] = [AGENT_TAINT]  # only the pod below (bound by name) lands here
    apply(cluster, "default", spare)
    try:
        with NodeAgent(cluster, [AGENT_SPARE_NODE], tmp_path) as agent:
            sleeper = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "sleeper"},
                "spec": {
                    "nodeName": AGENT_SPARE_NODE,
                    "containers": [{"name": "s", "image": "never-pulled", "command": ["sleep", "600"]}],
                    "volumes": [{"name": "v", "emptyDir": {}}],
                },
            }
            apply(cluster, namespace, sleeper)

            def running() -> bool:
                st = cluster.get_json("pod/sleeper", "-n", namespace).get("status", {})
                return bool(st.get("phase") == "Running")

            wait_for("the pod running", running, timeout=30)
            assert agent_leftovers(agent.id)["netns"]
        left = {k: v for k, v in agent.leftovers().items() if v}
        assert not left
        assert not any(v for v in agent_leftovers(agent.id).values())
    finally:
        cluster.kubectl("delete", "node", AGENT_SPARE_NODE, "--wait=false", check=False)


def test_a_pod_is_running_but_not_ready_until_its_startup_and_readiness_probes_pass(
    cluster: Cluster, node_agent: NodeAgent, namespace: str
) -> None:
    apply(cluster, namespace, sim_deployment("slow", "--startup-delay", "4"))  # /health 503 for 4 s

    def running_not_ready() -> dict[str, Any] | None:
        found = pods(cluster, namespace, f"{APP}=slow")
        st = found[0].get("status", {}) if found else {}
        conds = {c["type"]: c["status"] for c in st.get("conditions", [])}
        running = st.get("phase") == "Running" and conds.get("Ready") == "False"
        return st if running and st.get("containerStatuses") else None

    st = wait_for("the pod Running, not Ready", running_not_ready, timeout=30, interval=0.2)
    (cs,) = st["containerStatuses"]
    assert "running" in cs["state"] and not cs["ready"] and not cs["started"]
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Available", "deployment/slow", "--timeout=60s", timeout=70
    )
    (cs,) = one_pod(cluster, namespace, f"{APP}=slow")["status"]["containerStatuses"]
    assert cs["ready"] and cs["started"] and cs["restartCount"] == 0
