"""The Helm chart: lint, render, and the properties style.md §18 and issue 7 ask of it.

The RBAC table below is the reviewed, least-privilege list: a change to the chart's rules must
change it too (and say why in templates/_helpers.tpl).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import keys, manifests, validation
from tests.chart.conftest import CHART, ROOT, Render, run_helm
from tests.factories import experiment_document

# (apiGroup, resource) -> verbs, in every served namespace.
NAMESPACED_RULES: dict[tuple[str, str], set[str]] = {
    # Framework (kopf)
    ("specdecode.io", "specdecodeexperiments"): {"get", "list", "watch", "patch"},
    ("specdecode.io", "specdecodeexperiments/status"): {"get", "patch"},
    ("specdecode.io", "specdecodeexperiments/finalizers"): {"update"},
    ("", "events"): {"create"},
    # Application (the controller)
    ("apps", "deployments"): {
        "create",
        "get",
        "list",
        "update",
        "delete",
    },  # update: a round re-renders the arms
    ("batch", "jobs"): {"create", "get", "list", "watch", "delete"},  # watch: a load Job's end wakes its tick
    ("", "services"): {"create", "get", "list", "delete"},
    ("", "serviceaccounts"): {"create", "get", "list", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"create", "get", "list", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"create", "get", "list", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create", "get", "list", "delete"},
    ("policy", "poddisruptionbudgets"): {"create", "get", "delete"},
    ("", "configmaps"): {"create", "get", "list", "update", "delete"},
    ("", "pods"): {"get", "list"},
    ("", "pods/log"): {"get"},
    ("", "secrets"): {"get"},  # rbac.readSecrets: a missing Secret fails before any GPU is used
}
# Cluster-scoped: kopf's scanning, and the Nodes the arms run on (provenance, issue 22).
CLUSTER_RULES: dict[tuple[str, str], set[str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "nodes"): {"get"},
}
NAMESPACES_RULE: dict[tuple[str, str], set[str]] = {("", "namespaces"): {"list", "watch"}}

PLURALS = {
    "Deployment": ("apps", "deployments"),
    "Service": ("", "services"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
    "ConfigMap": ("", "configmaps"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "Job": ("batch", "jobs"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
}
# Children found by name only, never listed by label (no stale copies of another generation to find).
NEVER_LISTED = {"PodDisruptionBudget"}


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return result


def env(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(docs)["env"] if "value" in e}


def leader_election_rbac(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Role and RoleBinding of the leader-election Lease (removed from `docs`)."""
    found = [d for d in docs if d["metadata"]["name"].endswith("-leader-election")]
    for d in found:
        docs.remove(d)
    role = next(d for d in found if d["kind"] == "Role")
    binding = next(d for d in found if d["kind"] == "RoleBinding")
    assert len(found) == 2, found
    return role, binding


def rule_table(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    table: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames, nonResourceURLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource)
                assert key not in table, f"{key} granted twice"
                table[key] = set(rule["verbs"])
    return table


# ------------------------------------------------------------------------------- lint and files


def test_helm_lint_passes_strict(helm: Path) -> None:
    res = run_helm(helm, "lint", "--strict", str(CHART))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 chart(s) failed" in res.stdout


def test_helm_lint_passes_when_serving_listed_namespaces(helm: Path) -> None:
    res = run_helm(helm, "lint", "--strict", str(CHART), "--set", "watchNamespaces={llm,batch}")
    assert res.returncode == 0, res.stdout + res.stderr


def test_chart_crd_is_identical_to_the_generated_crd() -> None:
    name = "specdecodeexperiments.specdecode.io.yaml"
    chart_copy = (CHART / "crds" / name).read_bytes()
    assert chart_copy == (ROOT / "crds" / name).read_bytes(), (
        "run `make crd` (it copies the CRD into the chart)"
    )
    assert [p.name for p in (CHART / "crds").iterdir()] == [name]


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    assert match is not None
    assert chart["appVersion"] == match.group(1)


# Blocks passed through verbatim as Kubernetes fields: their parent's comment documents them.
VERBATIM_BLOCKS = {"podSecurityContext", "securityContext", "resources", "prometheusPodLabels"}


def test_every_values_key_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    uncommented = []
    parents: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        parents = [(i, k) for i, k in parents if i < indent]
        inside_verbatim = any(k in VERBATIM_BLOCKS for _, k in parents)
        parents.append((indent, key))
        if inside_verbatim:
            continue
        previous = lines[number - 1].strip() if number else ""
        if not previous.startswith("#"):
            uncommented.append(f"line {number + 1}: {key}")
    assert not uncommented, "values.yaml keys without a comment above them:\n" + "\n".join(uncommented)


# ------------------------------------------------------------------------------ the Deployment


def test_deployment_runs_one_replica_recreated(render: Render) -> None:
    deployment = only(render(), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_replicas_elect_a_leader_through_a_lease_in_the_release_namespace(render: Render) -> None:
    docs = render("--set", "replicaCount=2")
    assert only(docs, "Deployment")["spec"]["replicas"] == 2
    from specdecode.controller.settings import OperatorSettings

    variables = env(docs)
    identity = next(e for e in container(docs)["env"] if e["name"] == "SPECDECODE_LEADER_ELECTION_IDENTITY")
    assert identity["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    election = OperatorSettings.from_env(
        {**variables, "SPECDECODE_LEADER_ELECTION_IDENTITY": "pod-0"}
    ).election
    assert election is not None
    assert (election.name, election.namespace, election.identity) == (
        "sdx-specdecode-operator-leader",
        "ops",
        "pod-0",
    )
    role, binding = leader_election_rbac(docs)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["sdx-specdecode-operator-leader"],
            "verbs": ["get", "update"],
        },
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sdx-specdecode-operator", "namespace": "ops"}
    ]


def test_operator_runs_standalone_on_all_namespaces_by_default(render: Render) -> None:
    c = container(render())
    assert c["command"] == ["specdecode", "operator"]
    assert c["args"] == [
        "--standalone",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--metrics-port=9090",
        "--log-format=json",
    ]
    assert not [a for a in c["args"] if a.startswith("--namespace")]  # none: all namespaces


def test_liveness_probe_is_on_kopfs_endpoint(render: Render) -> None:
    c = container(render("--set", "liveness.port=8181"))
    assert "--liveness=http://0.0.0.0:8181/healthz" in c["args"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert {"name": "liveness", "containerPort": 8181, "protocol": "TCP"} in c["ports"]
    assert "readinessProbe" not in c  # kopf docs/probing.rst: readiness makes no sense for an operator


def test_pod_is_restricted_and_non_root(render: Render) -> None:
    docs = render()
    pod = only(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(docs)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container(docs)["volumeMounts"]


def test_scheduling_values_reach_the_pod(render: Render) -> None:
    pod = only(
        render(
            "--set", "nodeSelector.pool=cpu",
            "--set", "tolerations[0].key=dedicated,tolerations[0].operator=Exists",
            "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
            "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        ),
        "Deployment",
    )["spec"]["template"]["spec"]  # fmt: skip
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert "nodeAffinity" in pod["affinity"]


def test_metrics_port_is_a_value_and_can_be_turned_off(render: Render) -> None:
    docs = render("--set", "metrics.port=9102")
    assert "--metrics-port=9102" in container(docs)["args"]
    assert {"name": "metrics", "containerPort": 9102, "protocol": "TCP"} in container(docs)["ports"]
    annotations = only(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9102"
    off = render("--set", "metrics.enabled=false")
    assert not [a for a in container(off)["args"] if a.startswith("--metrics-port")]
    assert [p["name"] for p in container(off)["ports"]] == ["liveness"]
    assert not [d for d in render() if d["kind"] == "Service"]
    service = only(render("--set", "metrics.service.enabled=true"), "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_settings_default_to_the_charts_own_image(render: Render) -> None:
    settings = env(render())
    assert settings["SPECDECODE_OPERATOR_IMAGE"] == container(render())["image"]
    assert settings["SPECDECODE_OPERATOR_IMAGE"] == manifests.Settings().operator_image
    assert settings["SPECDECODE_IMAGE_PULL_POLICY"] == "IfNotPresent"
    assert settings["SPECDECODE_PROMETHEUS_URL"] == "http://prometheus-operated.monitoring:9090"
    assert settings["SPECDECODE_PROMETHEUS_POD_LABELS"] == "app.kubernetes.io/name=prometheus"
    two = env(render("--set", "operator.prometheusPodLabels.team=obs"))["SPECDECODE_PROMETHEUS_POD_LABELS"]
    assert (
        two == "app.kubernetes.io/name=prometheus,team=obs"
    )  # "k=v,k=v", as controller/settings.py reads it


def test_a_digest_pins_the_operator_and_its_workloads(render: Render) -> None:
    digest = "sha256:" + "a" * 64
    docs = render("--set", f"image.digest={digest}")
    assert container(docs)["image"] == f"ghcr.io/specdecode/specdecode-operator@{digest}"
    assert env(docs)["SPECDECODE_OPERATOR_IMAGE"] == container(docs)["image"]
    mirrored = env(
        render(
            "--set", "operator.workloadImage=mirror/sd:1", "--set", "operator.workloadImagePullPolicy=Always"
        )
    )
    assert mirrored["SPECDECODE_OPERATOR_IMAGE"] == "mirror/sd:1"
    assert mirrored["SPECDECODE_IMAGE_PULL_POLICY"] == "Always"


def test_operator_pod_carries_the_labels_the_network_policy_admits(render: Render) -> None:
    assert manifests.Settings().operator_pod_labels.items() <= container_pod_labels(render()).items()


def container_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def test_operator_pod_is_not_mistaken_for_an_experiment_child(render: Render) -> None:
    # Children carry managed-by=specdecode-operator (design.md §2); the operator's pod must not.
    labels = container_pod_labels(render())
    assert labels.get(keys.LABEL_MANAGED_BY) != manifests.MANAGED_BY
    assert keys.LABEL_EXPERIMENT not in labels


def test_notes_explain_how_to_wait_for_a_verdict(helm: Path, tmp_path: Path) -> None:
    # `helm template` never renders NOTES.txt and `helm install --dry-run` needs a cluster: render a
    # copy of the chart in which the notes are the value of an ordinary YAML template.
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "notes.yaml").write_text(
        '{{- define "notes" }}' + notes + '{{ end }}\nnotes: {{ include "notes" . | toJson }}\n'
    )
    res = run_helm(
        helm, "template", "sdx", str(chart), "--namespace", "ops", "--show-only", "templates/notes.yaml"
    )
    assert res.returncode == 0, res.stderr
    rendered = yaml.safe_load(res.stdout)["notes"]
    assert "kubectl -n NAMESPACE apply -f examples/simulator.yaml" in rendered
    # Reconciling=false: a Failed run ends the wait (Completed would hang the whole timeout).
    assert (
        "kubectl -n NAMESPACE wait --for=condition=Reconciling=false --timeout=2h sdx/sim-tiny-draft"
        in rendered
    )
    assert "condition=Completed" not in rendered
    assert "in all namespaces" in rendered
    assert "kubectl -n ops rollout status deployment/sdx-specdecode-operator" in rendered


# ------------------------------------------------------------------------------------------ RBAC


def test_all_namespaces_get_one_cluster_role_with_exactly_the_intended_verbs(render: Render) -> None:
    docs = render()
    leader_election_rbac(docs)  # (checked on its own above)
    assert not [d for d in docs if d["kind"] in {"Role", "RoleBinding"}]
    table = rule_table(only(docs, "ClusterRole")["rules"])
    assert table == {**CLUSTER_RULES, **NAMESPACED_RULES}
    binding = only(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sdx-specdecode-operator", "namespace": "ops"}
    ]
    assert binding["roleRef"]["name"] == only(docs, "ClusterRole")["metadata"]["name"]


def test_listed_namespaces_get_a_role_each_and_kopf_scans_namespaces(render: Render) -> None:
    docs = render("--set", "watchNamespaces={llm,batch}")
    leader_election_rbac(docs)
    c = container(docs)
    assert c["args"][2:4] == ["--namespace=llm", "--namespace=batch"]
    assert rule_table(only(docs, "ClusterRole")["rules"]) == {**CLUSTER_RULES, **NAMESPACES_RULE}
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    assert sorted(roles) == ["batch", "llm"]
    for role in roles.values():
        assert rule_table(role["rules"]) == NAMESPACED_RULES
    bindings = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "RoleBinding"}
    assert sorted(bindings) == ["batch", "llm"]
    for binding in bindings.values():
        assert binding["subjects"][0]["namespace"] == "ops"


def test_no_wildcards_anywhere(render: Render) -> None:
    for docs in (render(), render("--set", "watchNamespaces={llm}")):
        for doc in docs:
            for rule in doc.get("rules", []):
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], (doc["kind"], rule)


def test_operator_may_create_and_clean_up_every_child_it_builds(render: Render) -> None:
    table = rule_table(only(render(), "ClusterRole")["rules"])
    # The model cache is only a claim the kubelet mounts; the token's Secret the operator only gets
    # (for its keys' names, before the arms are created), which no child needs.
    engine = {
        "simulator": {"profile": "h200-8b-draft-tiny"},
        "modelCache": {"claimName": "hf-models"},
        "hfTokenSecret": {"name": "hf-token", "key": "token"},
    }
    document = experiment_document(engine=engine)
    s, _ = validation.parse_experiment(document)
    settings = manifests.Settings()
    children = [
        *manifests.build_all("exp", document, s, settings),
        manifests.build_load_job("exp", s, settings),
    ]
    assert {c["kind"] for c in children} == set(PLURALS)
    for child in children:
        verbs = table[PLURALS[child["kind"]]]
        needed = {"create", "get", "delete"} | (set() if child["kind"] in NEVER_LISTED else {"list"})
        assert needed <= verbs, child["kind"]


def test_operator_holds_every_permission_it_grants_to_the_load_job(render: Render) -> None:
    # RBAC escalation prevention: a Role can be created (and bound) only by someone holding its rules.
    table = rule_table(only(render(), "ClusterRole")["rules"])
    role = next(o for o in manifests.build_load_rbac("exp") if o["kind"] == "Role")
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert set(rule["verbs"]) <= table[(group, resource)], (group, resource)


def test_reading_secrets_is_granted_by_default_and_only_get(render: Render) -> None:
    for docs in (render(), render("--set", "watchNamespaces={llm}")):
        rules = [r for d in docs if d["kind"] in {"ClusterRole", "Role"} for r in d["rules"]]
        secrets = [r for r in rules if "secrets" in r["resources"]]
        assert secrets == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]


def test_read_secrets_false_grants_no_access_to_secrets(render: Render) -> None:
    for extra in ((), ("--set", "watchNamespaces={llm}")):
        docs = render("--set", "rbac.readSecrets=false", *extra)
        leader_election_rbac(docs)
        rules = [r for d in docs if d["kind"] in {"ClusterRole", "Role"} for r in d["rules"]]
        assert rules, "the other rules are still there"
        assert not [r for r in rules if "secrets" in r["resources"]]
        granted = {k for d in docs if d["kind"] in {"ClusterRole", "Role"} for k in rule_table(d["rules"])}
        assert granted | {("", "secrets")} >= set(NAMESPACED_RULES)


def test_rbac_can_be_left_to_the_cluster_admin(render: Render) -> None:
    kinds = {
        d["kind"]
        for d in render(
            "--set",
            "rbac.create=false",
            "--set",
            "serviceAccount.create=false",
            "--set",
            "serviceAccount.name=given",
        )
    }
    assert kinds == {"Deployment"}


def test_the_network_policy_admits_the_operator_pod_by_its_real_name_label(render: Render) -> None:
    from specdecode.controller.settings import OperatorSettings

    docs = render("--set", "nameOverride=sdx-op")
    labels = OperatorSettings.from_env(env(docs)).render.operator_pod_labels
    pod_labels = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/name": "sdx-op"}
    assert labels.items() <= pod_labels.items()


# ------------------------------------------------------------------------------ Prometheus


def arm_pods() -> list[dict[str, Any]]:
    """The pod templates of a simulator experiment's two arms, as the controller builds them."""
    document = experiment_document(engine={"simulator": {"profile": "h200-8b-draft-tiny"}})
    spec, _ = validation.parse_experiment(document)
    built = manifests.build_all("exp", document, spec, manifests.Settings())
    pods: list[dict[str, Any]] = [d["spec"]["template"] for d in built if d["kind"] == "Deployment"]
    assert len(pods) == 2
    return pods


def pod_label_meta(label: str) -> str:
    """Prometheus' kubernetes_sd meta label for a pod label (every character not [a-zA-Z0-9_] becomes _)."""
    return f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', label)}"


def test_the_label_names_the_operator_queries_by_are_chart_values(render: Render) -> None:
    settings = env(render())
    defaults = OperatorSettings()
    assert settings["SPECDECODE_PROM_EXPERIMENT_LABEL"] == defaults.label_names.experiment
    assert settings["SPECDECODE_PROM_ARM_LABEL"] == defaults.label_names.arm
    assert settings["SPECDECODE_PROM_NAMESPACE_LABEL"] == defaults.label_names.namespace
    assert settings["SPECDECODE_PROM_POD_LABEL"] == defaults.label_names.pod
    changed = env(
        render("--set", "monitoring.labelNames.experiment=exp", "--set", "monitoring.labelNames.pod=p")
    )
    read = OperatorSettings.from_env(changed)  # as the operator reads its environment
    assert (read.label_names.experiment, read.label_names.pod) == ("exp", "p")


def test_the_dcgm_exporter_label_names_are_chart_values(render: Render) -> None:
    defaults = OperatorSettings()
    settings = OperatorSettings.from_env(env(render()))
    assert (settings.label_names.dcgm_pod, settings.label_names.dcgm_namespace) == (
        defaults.label_names.dcgm_pod,
        defaults.label_names.dcgm_namespace,
    )
    renamed = env(
        render(
            "--set", "monitoring.dcgmLabelNames.pod=exported_pod",
            "--set", "monitoring.dcgmLabelNames.namespace=exported_namespace",
        )
    )  # fmt: skip
    read = OperatorSettings.from_env(renamed)
    assert (read.label_names.dcgm_pod, read.label_names.dcgm_namespace) == (
        "exported_pod",
        "exported_namespace",
    )


def test_pod_monitors_are_off_by_default(render: Render) -> None:
    assert not [d for d in render() if d["kind"] == "PodMonitor"]


def test_the_arms_pod_monitor_selects_the_arms_and_writes_the_label_names_the_operator_reads(
    render: Render,
) -> None:
    docs = render(
        "--set", "monitoring.podMonitor.enabled=true",
        "--set", "monitoring.podMonitor.labels.release=kps",
        "--set", "monitoring.labelNames.arm=arm",
    )  # fmt: skip
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert set(monitors) == {"sdx-specdecode-operator-arms", "sdx-specdecode-operator"}
    arms = monitors["sdx-specdecode-operator-arms"]
    assert arms["metadata"]["labels"]["release"] == "kps"  # kube-prometheus-stack's podMonitorSelector
    assert arms["spec"]["namespaceSelector"] == {"any": True}
    endpoint = arms["spec"]["podMetricsEndpoints"][0]
    for pod in arm_pods():
        # the selector matches each arm pod, and the endpoint's port is the arm container's port
        assert arms["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert endpoint["port"] in {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    written = {r["sourceLabels"][0]: r["targetLabel"] for r in endpoint["relabelings"]}
    assert written[pod_label_meta(keys.LABEL_ARM)] == "arm" == env(docs)["SPECDECODE_PROM_ARM_LABEL"]
    assert written[pod_label_meta(keys.LABEL_EXPERIMENT)] == env(docs)["SPECDECODE_PROM_EXPERIMENT_LABEL"]
    assert written["__meta_kubernetes_namespace"] == env(docs)["SPECDECODE_PROM_NAMESPACE_LABEL"]
    assert written["__meta_kubernetes_pod_name"] == env(docs)["SPECDECODE_PROM_POD_LABEL"]
    # the operator's own /metrics: its pod, its metrics port, the gauges' own namespace label kept
    own = monitors["sdx-specdecode-operator"]
    assert own["spec"]["selector"]["matchLabels"].items() <= container_pod_labels(docs).items()
    assert own["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in container(docs)["ports"]}
    assert own["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True


def test_pod_monitors_follow_the_served_namespaces_and_the_metrics_switch(render: Render) -> None:
    docs = render(
        "--set", "monitoring.podMonitor.enabled=true",
        "--set", "watchNamespaces={llm,batch}",
        "--set", "metrics.enabled=false",
        "--set", "monitoring.podMonitor.namespace=monitoring",
    )  # fmt: skip
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    assert [m["metadata"]["name"] for m in monitors] == [
        "sdx-specdecode-operator-arms"
    ]  # no /metrics to scrape
    assert monitors[0]["metadata"]["namespace"] == "monitoring"
    assert monitors[0]["spec"]["namespaceSelector"] == {"matchNames": ["llm", "batch"]}


def test_an_empty_label_name_is_refused_naming_the_value(helm: Path) -> None:
    # An empty name would reach the operator as SPECDECODE_PROM_ARM_LABEL="" and break every query.
    res = run_helm(helm, "template", "sdx", str(CHART), "--set", "monitoring.labelNames.arm=")
    assert res.returncode != 0
    assert "monitoring.labelNames.arm must name a Prometheus label (it is empty)" in res.stderr, res.stderr


def test_results_stay_in_config_maps_unless_a_bucket_is_given(render: Render) -> None:
    default = OperatorSettings.from_env(env(render()))
    assert default.results_s3 is None and not default.results_limits.s3
    assert default.results_configmap_max_bytes == OperatorSettings().results_configmap_max_bytes


def test_an_s3_bucket_reaches_the_operator_and_its_load_jobs_with_the_secrets_keys(
    helm: Path, render: Render
) -> None:
    values = ["--set", "resultsStore.s3.bucket=sd-results", "--set", "resultsStore.s3.prefix=team-a"]
    values += ["--set", "resultsStore.s3.endpoint=https://s3.example.com:9000"]
    refused = run_helm(helm, "template", "sdx", str(CHART), *values)
    assert (
        refused.returncode != 0 and "resultsStore.s3.credentialsSecret must name a Secret" in refused.stderr
    )
    docs = render(*values, "--set", "resultsStore.s3.credentialsSecret=s3-keys")
    keys_from = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container(docs)["env"]
        if e["name"].startswith("AWS_")
    }
    assert keys_from == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-keys", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-keys", "key": "AWS_SECRET_ACCESS_KEY"},
    }
    settings = OperatorSettings.from_env(env(docs))
    assert settings.results_s3 is not None and settings.results_limits.s3
    assert (settings.results_s3.bucket, settings.results_s3.prefix, settings.results_s3.base) == (
        "sd-results",
        "team-a",
        "https://s3.example.com:9000",
    )
    # the load Job gets the same bucket, and the keys from the Secret of that name in its namespace
    job = manifests.build_load_job(
        "exp", validation.parse_experiment(experiment_document())[0], settings.render, generation=1
    )
    job_env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    plain = {e["name"]: e["value"] for e in job_env if "value" in e}
    assert plain["SPECDECODE_RESULTS_S3_BUCKET"] == "sd-results"
    assert plain["SPECDECODE_RESULTS_S3_ENDPOINT"] == "https://s3.example.com:9000"
    secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in job_env if e["name"].startswith("AWS_")
    }
    assert secret == {"AWS_ACCESS_KEY_ID": "s3-keys", "AWS_SECRET_ACCESS_KEY": "s3-keys"}
