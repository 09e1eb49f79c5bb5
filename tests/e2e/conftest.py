"""Fixtures for the e2e tests: a real control plane (or, opted in, $SPECDECODE_E2E_KUBECONFIG's
cluster; $KUBECONFIG is ignored), fake GPU nodes, the experiment CRD, per-test namespaces and a real
Prometheus. See README.md here."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the harness modules beside this file

from cluster_choice import RefusedClusterError, external_kubeconfig
from experiment_crd import CRD_FILE, CRD_NAME
from fake_gpu_nodes import (
    AGENT_CPU_NODE_NAMES,
    AGENT_GPU_NODE_NAMES,
    AGENT_NODE_NAMES,
    GPU_NODE_NAMES,
    GPU_PRODUCT,
    agent_cpu_node,
    agent_gpu_node,
    gpu_node,
    node_schedulable,
)
from k8s_cluster import (
    FEATURE_GATES,
    Cluster,
    ControlPlane,
    MissingBinariesError,
    external_cluster,
    find_bin_dir,
    wait_for,
)
from node_agent import NodeAgent
from prometheus_server import Prometheus, PrometheusMissingError, find_prometheus


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    try:
        return find_bin_dir()
    except MissingBinariesError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def control_plane_factory(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Starts extra control planes (each in a fresh temp dir) and stops them all at session end."""
    started: list[ControlPlane] = []

    def start(**kwargs: Any) -> ControlPlane:
        cp = ControlPlane(k8s_bin_dir, workdir=tmp_path_factory.mktemp("k8s"), **kwargs)
        started.append(cp)
        cp.start()
        return cp

    yield start
    for cp in reversed(started):
        cp.stop()


@pytest.fixture(scope="session")
def cluster(k8s_bin_dir: Path, control_plane_factory: Any) -> Cluster:
    """The cluster under test: a fresh control plane, or $SPECDECODE_E2E_KUBECONFIG's (cluster_choice.py)."""
    try:
        external = external_kubeconfig(os.environ)
    except RefusedClusterError as e:
        pytest.fail(str(e), pytrace=False)
    if external is not None:
        return external_cluster(external, k8s_bin_dir)
    cp: ControlPlane = control_plane_factory(feature_gates=FEATURE_GATES, agent_nodes=AGENT_NODE_NAMES)
    assert cp.cluster is not None
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in cp.timings.items())
    print(f"\ncontrol plane up in {cp.workdir}: {timings}", file=sys.stderr)
    return cp.cluster


@pytest.fixture(scope="session")
def gpu_nodes(cluster: Cluster) -> list[str]:
    """Names of Ready GPU nodes. Built-in cluster: two fake kwok nodes with 8 H200 each."""
    if cluster.builtin:
        items = {"apiVersion": "v1", "kind": "List", "items": [gpu_node(n) for n in GPU_NODE_NAMES]}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(items))
    else:
        found = cluster.get_json("nodes", "-l", f"nvidia.com/gpu.product={GPU_PRODUCT}")["items"]
        if not found:
            pytest.skip(
                f"the cluster from SPECDECODE_E2E_KUBECONFIG has no node labelled nvidia.com/gpu.product={GPU_PRODUCT}"
            )
    selector = f"nvidia.com/gpu.product={GPU_PRODUCT}"

    def ready_names() -> list[str]:
        nodes = cluster.get_json("nodes", "-l", selector)["items"]
        names = sorted(n["metadata"]["name"] for n in nodes if node_schedulable(n))
        return names if names and len(names) == len(nodes) else []

    return list(wait_for("GPU nodes Ready and untainted by the node controller", ready_names))


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> Path:
    """Installs the experiment CRD (crds/, generated from the typed models)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))

    def established() -> bool:
        # Polled rather than `kubectl wait`, which errors while a new CRD has no conditions at all.
        conditions = cluster.get_json(f"crd/{CRD_NAME}").get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(f"{CRD_NAME} Established", established)
    return CRD_FILE


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting for finalization)."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower()).strip("-")
    name = f"e2e-{base[:40].rstrip('-')}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="session")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus that discovers pods through the cluster's API server."""
    if not (cluster.api_url and cluster.token and cluster.ca_file):
        pytest.skip("Prometheus discovery needs a token and CA file in the kubeconfig")
    prom = Prometheus(cluster, workdir=tmp_path_factory.mktemp("prometheus"))
    try:
        prom.binary = find_prometheus(cluster.bin_dir)
    except PrometheusMissingError as e:
        pytest.fail(str(e), pytrace=False)
    prom.start()
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture(scope="session")
def agent_nodes(cluster: Cluster) -> list[str]:
    """Names of the Ready nodes whose pods the node agent runs: two GPU nodes and one CPU node."""
    if not cluster.builtin:
        pytest.skip("the node agent runs pods only on the built-in control plane's fake nodes")
    nodes = [agent_gpu_node(n) for n in AGENT_GPU_NODE_NAMES] + [
        agent_cpu_node(n) for n in AGENT_CPU_NODE_NAMES
    ]
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
    )
    names = sorted(n["metadata"]["name"] for n in nodes)

    def ready() -> bool:
        found = {n["metadata"]["name"]: n for n in cluster.get_json("nodes")["items"]}
        return all(name in found and node_schedulable(found[name]) for name in names)

    wait_for("the node agent's nodes Ready", ready)
    return names


def node_agent_prerequisites() -> str | None:
    """Why a node agent can't run here (it needs root for network and mount namespaces), or None."""
    if os.geteuid() != 0:
        return "the node agent needs root (network and mount namespaces, veths, bind mounts)"
    missing = [t for t in ("ip", "unshare", "mount", "hostname") if shutil.which(t) is None]
    return f"the node agent needs {', '.join(missing)} on PATH (iproute2, util-linux)" if missing else None


@pytest.fixture(scope="session")
def node_agent(
    cluster: Cluster, agent_nodes: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeAgent]:
    """The kubelet stand-in for ``agent_nodes``: their pods run as processes (node_agent.py).

    Teardown stops every pod and removes every namespace, veth and mount point the agent made, and
    fails the session if anything is left.
    """
    why = node_agent_prerequisites()
    if why:
        pytest.fail(why, pytrace=False)
    agent = NodeAgent(cluster, agent_nodes, tmp_path_factory.mktemp("node-agent"))
    agent.start()
    print(f"\nnode agent: pods on {', '.join(agent_nodes)} run, logs in {agent.workdir}", file=sys.stderr)
    try:
        yield agent
    finally:
        agent.stop()
        left = {k: v for k, v in agent.leftovers().items() if v}
        assert not left, f"the node agent left {left}"
