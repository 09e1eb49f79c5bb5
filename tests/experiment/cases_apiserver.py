"""Engine fields the CRD schema admits and the API server refuses (or accepts) once they are built
into an arm's Deployment: shared by the rule tests (`test_apiserver_rules`) and the e2e test that
asks a real API server the same (`tests/e2e/test_operator.py`)."""

from __future__ import annotations

from typing import Any

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "label value with a space": (
        {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA H200"}},
        "spec.engine.nodeSelector['nvidia.com/gpu.product']: label value 'NVIDIA H200'",
    ),
    "label value of 64 characters": ({"nodeSelector": {"pool": "a" * 64}}, "at most 63 characters"),
    "label key with a space": ({"nodeSelector": {"gpu pool": "a"}}, "key: 'gpu pool' must be 1-63"),
    "label key prefix upper-case": ({"nodeSelector": {"Example.com/pool": "a"}}, "must be a DNS subdomain"),
    "env name with '='": ({"env": [{"name": "A=B", "value": "1"}]}, "spec.engine.env[0].name: 'A=B'"),
    "env name with a tab": ({"env": [{"name": "A\tB", "value": "1"}]}, "spec.engine.env[0].name"),
    "env value and valueFrom": (
        {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        "give value or valueFrom, not both",
    ),
    "quantity with a space": (
        {"resources": {"limits": {"nvidia.com/gpu": 1, "memory": "2 GB"}}},
        "limits['memory']: '2 GB' is not a quantity",
    ),
    "negative quantity": (
        {"resources": {"limits": {"nvidia.com/gpu": 1, "cpu": -1}}},
        "-1 is not a quantity",
    ),
    "fractional GPU": ({"resources": {"limits": {"nvidia.com/gpu": "0.5"}}}, "takes whole numbers"),
    "request over its limit": (
        {"resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "1"}, "requests": {"cpu": "1500m"}}},
        "requests['cpu']: '1500m' is more than its limit '1'",
    ),
    "GPU request other than its limit": (
        {"resources": {"limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": 1}}},
        "an extended resource's request must equal its limit",
    ),
    "resource name with a space": (
        {"resources": {"limits": {"nvidia.com/gpu": 1, "my gpu": 1}}},
        "limits['my gpu']: resource name",
    ),
    "toleration key with a space": (
        {"tolerations": [{"key": "a b", "operator": "Exists"}]},
        "spec.engine.tolerations[0].key",
    ),
    "toleration Exists with a value": (
        {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]},
        "must be empty with operator Exists",
    ),
    "toleration seconds without NoExecute": (
        {
            "tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}
            ]
        },
        "only allowed with effect NoExecute",
    ),
}

ACCEPTED: dict[str, dict[str, Any]] = {
    "qualified label key and value": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200", "pool": ""}},
    "relaxed env name": {"env": [{"name": "my.var-1", "value": "1"}, {"name": "HF_HOME", "value": "/x"}]},
    "quantities of every form": {
        "resources": {
            "limits": {"nvidia.com/gpu": 1, "cpu": "2500m", "memory": "16Gi", "ephemeral-storage": "1e9"},
            "requests": {"cpu": "0.5", "memory": "1G", "nvidia.com/gpu": "1"},
        }
    },
    "tolerations": {
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"operator": "Exists"},
            {
                "key": "spot",
                "operator": "Equal",
                "value": "true",
                "effect": "NoExecute",
                "tolerationSeconds": 30,
            },
        ]
    },
}
