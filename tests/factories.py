"""Builders of test inputs shared across the suite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


SHORT_STAGE_GUARDRAILS: dict[str, Any] = {"maxErrorRate": 0.05, "minOutputMatch": 0.95}
"""errorRate and outputMatch limits that 59 clean pairs show at 95% (`guardrails.pairs_to_show`),
for the tests about other parts than those limits that run stages of 60 requests: the defaults
(0.01, 0.99) need 299, and until a stage shows them it cannot Pass."""


def experiment_document(**spec_overrides: Any) -> dict[str, Any]:
    """A small valid experiment document; keyword arguments replace top-level spec fields."""
    spec: dict[str, Any] = {
        "model": "Qwen/Qwen3-4B-Thinking-2507",
        "speculative": {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "numSpeculativeTokens": 5},
        "workload": {"stages": [{"name": "low", "rate": 1.0}, {"name": "c16", "concurrency": 16}]},
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "specdecode.io/v1alpha1",
        "kind": "SpecDecodeExperiment",
        "metadata": {"name": "exp", "namespace": "llm"},
        "spec": spec,
    }
