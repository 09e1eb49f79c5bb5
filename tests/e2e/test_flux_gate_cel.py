"""The Flux gate's CEL (deploy/gitops/flux-kustomization.yaml), evaluated for real (#23).

Flux's kustomize-controller evaluates `inProgress`, `failed` and `current` on the experiment and the
first that is true decides. Here the real kube-apiserver evaluates the very same expressions, read
from the file: a ValidatingAdmissionPolicy (Warn) holds one validation `!(<expression>)` per
expression, so a status update warns with the names of the expressions that are true for it. The
status updates are server-side dry runs of experiments in this test's namespace; nothing is stored.

The only rewrite: Flux binds the object's top-level fields (`status`, `metadata`) as variables, an
admission policy has them under `object`.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_cluster import REPO_ROOT, Cluster, wait_for
from tests.factories import experiment_document

GATE = REPO_ROOT / "deploy" / "gitops" / "flux-kustomization.yaml"
ORDER = ("inProgress", "failed", "current")  # Flux's order: the first true one decides
WARNING = re.compile(
    r"^Warning: Validation failed for ValidatingAdmissionPolicy '[^']+' with binding '[^']+': (.*)$"
)


def flux_expressions() -> dict[str, str]:
    gate = next(yaml.safe_load_all(GATE.read_text()))
    (exprs,) = gate["spec"]["healthCheckExprs"]
    return {name: exprs[name] for name in ORDER}


def as_admission_cel(expression: str) -> str:
    """Flux's variables `status` and `metadata` are the admission object's fields."""
    return re.sub(r"(?<![\w.?])(status|metadata)\b", r"object.\1", expression)


@pytest.fixture
def gate_policy(cluster: Cluster, crd: Path, namespace: str) -> Iterator[str]:
    """The policy and its binding (Warn, this namespace only); yields the policy's name."""
    name = f"flux-gate-cel-{secrets.token_hex(3)}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["specdecode.io"],
                        "apiVersions": ["v1alpha1"],
                        "operations": ["UPDATE"],
                        "resources": ["specdecodeexperiments/status"],
                    }
                ]
            },
            "validations": [
                {"expression": f"!({as_admission_cel(expr)})", "message": key}
                for key, expr in flux_expressions().items()
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Warn"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    items = {"apiVersion": "v1", "kind": "List", "items": [policy, binding]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(items))
    try:
        yield name
    finally:
        cluster.kubectl(
            "delete", "-f", "-", "--ignore-not-found", "--wait=false", input=json.dumps(items), check=False
        )


def condition(kind: str, status: str, generation: int) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": "Test",
        "message": "",
        "observedGeneration": generation,
        "lastTransitionTime": "2026-12-01T08:00:00Z",
    }


def experiment_status(phase: str, verdict: str | None, generation: int) -> dict[str, Any]:
    """What the operator writes for that phase and verdict, computed for `generation`."""
    done = phase in ("Completed", "Failed")
    return {
        "observedGeneration": generation,
        "phase": phase,
        "verdict": verdict,
        "conditions": [
            condition("Ready", "True" if done else "False", generation),
            condition("Completed", "True" if phase == "Completed" else "False", generation),
            condition("Promoted", "True" if verdict == "Promote" else "False", generation),
        ],
    }


def true_expressions(cluster: Cluster, namespace: str, name: str, status: dict[str, Any]) -> set[str]:
    """Names of the gate's expressions that are true for the experiment with `status` (dry run)."""
    res = cluster.kubectl(
        "patch",
        "specdecodeexperiment",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "--dry-run=server",
        "-p",
        json.dumps({"status": status}),
    )
    found = set()
    for line in res.stderr.splitlines():
        match = WARNING.match(line.strip())
        assert match, f"an unexpected warning (an expression that does not evaluate?): {res.stderr}"
        assert match.group(1) in ORDER, res.stderr
        found.add(match.group(1))
    return found


def flux_decision(true: set[str]) -> str | None:
    return next((key for key in ORDER if key in true), None)


def create(cluster: Cluster, namespace: str, name: str, *, generation: int) -> None:
    """An experiment (no operator runs here: its status is whatever the test patches), its spec
    edited until metadata.generation is `generation`."""
    doc = experiment_document()
    doc["metadata"] = {"name": name, "namespace": namespace}
    cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
    for requests in range(2, generation + 1):
        edit = copy.deepcopy(doc["spec"]["workload"])
        edit["requestsPerStage"] = 100 * requests
        cluster.kubectl(
            "patch",
            "specdecodeexperiment",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"workload": edit}}),
        )
    got = cluster.get_json("specdecodeexperiment", name, "-n", namespace)["metadata"]["generation"]
    assert got == generation


CASES = [
    # (metadata.generation, phase, verdict, status computed for generation, gate decision)
    (1, "Completed", "Promote", 1, "current"),
    (1, "Completed", "Reject", 1, "failed"),
    (1, "Completed", "Inconclusive", 1, "failed"),
    (1, "Failed", None, 1, "failed"),
    (1, "Analyzing", None, 1, "inProgress"),
    (1, "Pending", None, 1, "inProgress"),
    (2, "Completed", "Promote", 1, "inProgress"),  # a Promote of the spec before an edit
    (2, "Completed", "Reject", 1, "inProgress"),
    (2, "Completed", "Promote", 2, "current"),
]


def test_the_flux_gate_promotes_only_a_promote_of_the_current_spec(
    cluster: Cluster, namespace: str, gate_policy: str
) -> None:
    create(cluster, namespace, "gen1", generation=1)
    create(cluster, namespace, "gen2", generation=2)
    # The policy acts once the API server has compiled it: a Promote of this spec is `current`.
    promote = experiment_status("Completed", "Promote", 1)
    wait_for(
        "the gate's policy evaluated", lambda: true_expressions(cluster, namespace, "gen1", promote) or None
    )
    decisions = []
    for generation, phase, verdict, observed, expected in CASES:
        true = true_expressions(
            cluster, namespace, f"gen{generation}", experiment_status(phase, verdict, observed)
        )
        decisions.append(
            ((generation, phase, verdict, observed), sorted(true), flux_decision(true), expected)
        )
    wrong = [d for d in decisions if d[2] != d[3]]
    assert not wrong, "gate decisions (case, true expressions, decision, expected):\n" + "\n".join(
        map(str, wrong)
    )
    # Exactly one expression true for a decided experiment: the order of evaluation never matters there.
    for case, true, _, expected in decisions:
        if case[0] == case[3] and case[1] in ("Completed", "Failed"):
            assert true == [expected], (case, true)
