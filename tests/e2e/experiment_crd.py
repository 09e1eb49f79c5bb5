"""The SpecDecodeExperiment CRD and an example experiment, as the e2e tests install them."""

from __future__ import annotations

from typing import Any

from fake_gpu_nodes import GPU_PRODUCT, GPU_TOLERATION
from k8s_cluster import REPO_ROOT

CRD_FILE = REPO_ROOT / "crds" / "specdecodeexperiments.specdecode.io.yaml"
CRD_NAME = "specdecodeexperiments.specdecode.io"
EXAMPLE = REPO_ROOT / "examples" / "ngram.yaml"


def experiment(name: str = "exp", **spec: Any) -> dict[str, Any]:
    """A small simulator experiment whose arms land on kwok's GPU nodes (Prometheus unreachable:
    it stays Deploying); keyword arguments replace top-level spec fields."""
    body: dict[str, Any] = {
        "model": "sim/llama-8b",
        "engine": {
            "simulator": {"profile": "h200-8b-draft-tiny"},
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT},
            "tolerations": [GPU_TOLERATION],
        },
        "speculative": {"method": "draft_model", "model": "sim/draft", "numSpeculativeTokens": 4},
        "workload": {
            "stages": [{"name": "c1", "concurrency": 1}],
            "requestsPerStage": 20,
            "warmupRequests": 0,
        },
        "deadlines": {"deploy": "2m", "run": "5m"},
        "prometheus": {"url": "http://127.0.0.1:1"},
    }
    body.update(spec)
    return {
        "apiVersion": "specdecode.io/v1alpha1",
        "kind": "SpecDecodeExperiment",
        "metadata": {"name": name},
        "spec": body,
    }
