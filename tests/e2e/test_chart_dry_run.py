"""The Helm chart against a real API server (the `cluster` fixture of tests/e2e/conftest.py).

- `helm template … | kubectl apply --dry-run=server` accepts every object, in both RBAC modes, and the
  operator's pod meets the "restricted" Pod Security Standard (the namespace warns on violations);
- the operator's ServiceAccount, bound by the chart's RBAC, may create every child the controller
  builds, including the load Job's Role and RoleBinding (the API server's escalation check), and
  may not do what it was not given.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_cluster import Cluster
from prometheus_server import install_prometheus_operator_crds
from tests.factories import experiment_document

from specdecode.experiment import manifests, validation

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "specdecode-operator"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def helm_template(cluster: Cluster, namespace: str, *args: str) -> str:
    res = subprocess.run(
        [str(cluster.bin_dir / "helm"), "template", "sdx", str(CHART), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def restricted(cluster: Cluster, namespace: str) -> None:
    """Pod Security admission warns about anything in `namespace` that is not "restricted"."""
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/warn=restricted")


def dry_run(cluster: Cluster, namespace: str, text: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=text)


def as_list(items: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def test_the_charts_crd_is_accepted_by_the_api_server(cluster: Cluster, namespace: str) -> None:
    res = dry_run(cluster, namespace, helm_template(cluster, namespace, "--include-crds"))
    assert "customresourcedefinition.apiextensions.k8s.io/specdecodeexperiments.specdecode.io" in res.stdout


def test_the_rendered_chart_dry_runs_on_the_api_server_and_is_restricted(
    cluster: Cluster, namespace: str
) -> None:
    restricted(cluster, namespace)
    res = dry_run(cluster, namespace, helm_template(cluster, namespace))
    assert "would violate PodSecurity" not in res.stderr, res.stderr
    applied = res.stdout.splitlines()
    for expected in (
        "serviceaccount/sdx-specdecode-operator",
        "clusterrole.rbac.authorization.k8s.io/sdx-specdecode-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/sdx-specdecode-operator",
        "deployment.apps/sdx-specdecode-operator",
    ):
        assert any(line.startswith(expected) and "(server dry run)" in line for line in applied), res.stdout


def test_the_pod_security_check_above_does_catch_a_violation(cluster: Cluster, namespace: str) -> None:
    restricted(cluster, namespace)
    text = helm_template(cluster, namespace, "--set=securityContext.allowPrivilegeEscalation=true")
    assert "would violate PodSecurity" in dry_run(cluster, namespace, text).stderr


def test_the_chart_serving_listed_namespaces_dry_runs_too(cluster: Cluster, namespace: str) -> None:
    restricted(cluster, namespace)
    text = helm_template(
        cluster, namespace, f"--set=watchNamespaces={{{namespace}}}", "--set=metrics.service.enabled=true"
    )
    res = dry_run(cluster, namespace, text)
    assert "would violate PodSecurity" not in res.stderr, res.stderr
    assert "role.rbac.authorization.k8s.io/sdx-specdecode-operator" in res.stdout
    assert "service/sdx-specdecode-operator-metrics" in res.stdout


@pytest.fixture
def operator_account(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The chart's ServiceAccount and RBAC really applied (serving only `namespace`); its username."""
    fullname = f"sdo-{namespace}"[:63].rstrip("-")
    text = helm_template(
        cluster, namespace, f"--set=watchNamespaces={{{namespace}}}", f"--set=fullnameOverride={fullname}"
    )
    objects = [doc for doc in yaml.safe_load_all(text) if doc and doc["kind"] in RBAC_KINDS]
    cluster.kubectl("apply", "-f", "-", input=as_list(objects))
    try:
        yield f"system:serviceaccount:{namespace}:{fullname}"
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            cluster.kubectl("delete", kind, fullname, "--ignore-not-found", check=False)


def children(namespace: str) -> list[dict[str, Any]]:
    """Everything the controller creates for a simulator experiment, load Job included."""
    document = experiment_document(engine={"simulator": {"profile": "h200-8b-draft-tiny"}})
    s, _ = validation.parse_experiment(document)
    settings = manifests.Settings()
    built = [*manifests.build_all("exp", document, s, settings), manifests.build_load_job("exp", s, settings)]
    for obj in built:
        obj["metadata"]["namespace"] = namespace
    return built


def test_the_operator_may_create_every_child_including_the_load_jobs_role(
    cluster: Cluster, namespace: str, operator_account: str
) -> None:
    # Really created, not a dry run: the RoleBinding's escalation check reads the Role it binds.
    items = children(namespace)
    res = cluster.kubectl("--as", operator_account, "create", "-f", "-", input=as_list(items))
    created = res.stdout.splitlines()
    assert len(created) == len(items), res.stdout + res.stderr
    assert any(line.startswith("role.rbac.authorization.k8s.io/exp-load") for line in created)
    assert any(line.startswith("rolebinding.rbac.authorization.k8s.io/exp-load") for line in created)


def test_the_operator_cannot_grant_what_it_does_not_hold(
    cluster: Cluster, namespace: str, operator_account: str
) -> None:
    # The same check that the load Job's Role passes above, failing for a permission not held.
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "too-much", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
    }
    res = cluster.kubectl(
        "--as", operator_account, "create", "--dry-run=server", "-f", "-", input=json.dumps(role), check=False
    )
    assert res.returncode != 0
    assert "forbidden" in res.stderr, res.stderr


def can(cluster: Cluster, user: str, verb: str, resource: str, namespace: str) -> bool:
    """A SubjectAccessReview: exact group, resource and subresource, no discovery involved."""
    name, _, subresource = resource.partition("/")
    plural, _, group = name.partition(".")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "group": group,
                "resource": plural,
                "subresource": subresource,
            },
        },
    }
    res = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review))
    return bool(json.loads(res.stdout)["status"].get("allowed", False))


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("watch", "specdecodeexperiments.specdecode.io", True),
        ("patch", "specdecodeexperiments.specdecode.io/status", True),
        ("update", "specdecodeexperiments.specdecode.io/finalizers", True),
        ("create", "events", True),
        ("delete", "deployments.apps", True),
        ("update", "configmaps", True),
        ("list", "pods", True),
        ("watch", "jobs.batch", True),  # a load Job's end wakes its experiment's tick
        ("watch", "pods", False),
        ("get", "pods/log", True),
        ("patch", "deployments.apps", False),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", True),
        ("watch", "namespaces", True),
        ("delete", "specdecodeexperiments.specdecode.io", False),
        ("update", "specdecodeexperiments.specdecode.io", False),
        ("delete", "pods", False),
        ("create", "pods/exec", False),
        ("get", "secrets", True),  # rbac.readSecrets: a missing Secret fails before any GPU is used
        ("list", "secrets", False),
        ("watch", "secrets", False),
        ("update", "deployments.apps", True),  # a round after the stages re-renders the arms
        ("create", "clusterroles.rbac.authorization.k8s.io", False),
        ("escalate", "roles.rbac.authorization.k8s.io", False),
        ("bind", "roles.rbac.authorization.k8s.io", False),
    ],
)
def test_the_operator_account_can_do_exactly_its_rules(
    cluster: Cluster, namespace: str, operator_account: str, verb: str, resource: str, allowed: bool
) -> None:
    assert can(cluster, operator_account, verb, resource, namespace) is allowed


def test_the_operator_has_nothing_in_namespaces_it_does_not_serve(
    cluster: Cluster, namespace: str, operator_account: str
) -> None:
    assert not can(cluster, operator_account, "create", "deployments.apps", "default")
    assert not can(cluster, operator_account, "watch", "specdecodeexperiments.specdecode.io", "default")


@pytest.fixture
def pod_monitor_crd(cluster: Cluster) -> None:
    """The Prometheus Operator's own PodMonitor CRD in the cluster."""
    install_prometheus_operator_crds(cluster, "podmonitors")


def with_pod_monitors(cluster: Cluster, namespace: str, *args: str) -> str:
    return helm_template(cluster, namespace, "--set=monitoring.podMonitor.enabled=true", *args)


def test_the_charts_pod_monitors_are_valid_podmonitors(
    cluster: Cluster, namespace: str, pod_monitor_crd: None
) -> None:
    res = dry_run(
        cluster,
        namespace,
        with_pod_monitors(cluster, namespace, "--set=monitoring.podMonitor.labels.release=kps"),
    )
    assert (
        "podmonitor.monitoring.coreos.com/sdx-specdecode-operator-arms created (server dry run)" in res.stdout
    )
    assert "podmonitor.monitoring.coreos.com/sdx-specdecode-operator created (server dry run)" in res.stdout


def test_the_pod_monitor_check_above_does_catch_an_invalid_one(
    cluster: Cluster, namespace: str, pod_monitor_crd: None
) -> None:
    # The CRD's schema, not our template, rejects a malformed duration.
    text = with_pod_monitors(cluster, namespace, "--set=monitoring.podMonitor.interval=5sec")
    res = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=text, check=False)
    assert res.returncode != 0
    assert "spec.podMetricsEndpoints[0].interval" in res.stderr, res.stderr
