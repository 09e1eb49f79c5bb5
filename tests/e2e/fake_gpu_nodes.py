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
