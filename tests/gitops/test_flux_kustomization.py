"""deploy/gitops/flux-kustomization.yaml: valid YAML, and its health checks name this CRD's group,
version, kind and the conditions the operator writes, bound to the generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "specdecodeexperiments.specdecode.io.yaml").read_text())


def documents() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((ROOT / "deploy" / "gitops" / "flux-kustomization.yaml").read_text()))


def test_two_flux_kustomizations_the_rollout_depending_on_the_gate() -> None:
    gate, rollout = documents()
    for doc in (gate, rollout):
        assert doc["apiVersion"] == "kustomize.toolkit.fluxcd.io/v1"
        assert doc["kind"] == "Kustomization"
        assert {"interval", "sourceRef", "path", "prune"} <= set(doc["spec"])
    assert rollout["spec"]["dependsOn"] == [{"name": gate["metadata"]["name"]}]


def test_health_checks_name_the_crds_kind_and_version() -> None:
    gate = documents()[0]["spec"]
    api_version = f"{CRD['spec']['group']}/{CRD['spec']['versions'][0]['name']}"
    kind = CRD["spec"]["names"]["kind"]
    assert [(c["apiVersion"], c["kind"]) for c in gate["healthChecks"]] == [(api_version, kind)]
    (exprs,) = gate["healthCheckExprs"]
    assert (exprs["apiVersion"], exprs["kind"]) == (api_version, kind)
    assert set(exprs) == {"apiVersion", "kind", "inProgress", "failed", "current"}


def test_expressions_use_the_completed_and_promoted_conditions_bound_to_the_generation() -> None:
    exprs = documents()[0]["spec"]["healthCheckExprs"][0]
    assert "metadata.generation" in exprs["inProgress"] and "'Completed'" in exprs["inProgress"]
    assert "'Promoted'" in exprs["current"] and "c.status == 'True'" in exprs["current"]
    assert "observedGeneration" in exprs["current"] and "metadata.generation" in exprs["current"]
    assert "'Failed'" in exprs["failed"] and "'Promoted'" in exprs["failed"]
    for expr in exprs.values():
        assert expr.count("(") == expr.count(")")
