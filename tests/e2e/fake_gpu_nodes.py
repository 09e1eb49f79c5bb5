"""Fake GPU nodes for kwok: what the operator's GPU Deployments are scheduled onto in e2e tests."""

from __future__ import annotations

from typing import Any

GPU_PRODUCT = "NVIDIA-H200"
GPUS_PER_NODE = 8
GPU_NODE_NAMES = ("kwok-gpu-0", "kwok-gpu-1")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gpu_node(name: str) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": str(GPUS_PER_NODE),
            },
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        # Node status is kept on create (as when a kubelet registers): this is what the scheduler sees.
        "status": {"capacity": resources, "allocatable": resources},
    }


def node_schedulable(node: dict[str, Any]) -> bool:
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", [])
    )
    taints = {t["key"] for t in node.get("spec", {}).get("taints", [])}
    return ready and not any(t.startswith("node.kubernetes.io/") for t in taints)


# Nodes whose pods really run: kwok keeps them alive, the node agent (node_agent.py) runs their pods.
AGENT_LABEL = "specdecode.io/node-agent"
AGENT_TAINT = {"key": AGENT_LABEL, "value": "true", "effect": "NoSchedule"}
AGENT_TOLERATION = {"key": AGENT_LABEL, "operator": "Exists", "effect": "NoSchedule"}
AGENT_GPU_NODE_NAMES = ("agent-gpu-0", "agent-gpu-1")
AGENT_CPU_NODE_NAMES = ("agent-cpu-0",)
AGENT_SPARE_NODE = "agent-spare-0"  # for a test that starts an agent of its own
AGENT_NODE_NAMES = (*AGENT_GPU_NODE_NAMES, *AGENT_CPU_NODE_NAMES, AGENT_SPARE_NODE)


def agent_gpu_node(name: str) -> dict[str, Any]:
    """A GPU node like ``gpu_node`` whose pods run: labelled and tainted for the node agent.

    The extra taint keeps pods of tests that expect kwok's fake pods (images never pulled) off it.
    """
    node = gpu_node(name)
    node["metadata"]["labels"][AGENT_LABEL] = "true"
    node["spec"]["taints"].append(dict(AGENT_TAINT))
    return node


def cpu_node(name: str) -> dict[str, Any]:
    """An untainted CPU node, where the load Job lands (it has no tolerations and no node selector)."""
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def agent_cpu_node(name: str) -> dict[str, Any]:
    """An untainted CPU node whose pods run (the load Job has no tolerations and no node selector)."""
    node = cpu_node(name)
    node["metadata"]["labels"][AGENT_LABEL] = "true"
    return node
