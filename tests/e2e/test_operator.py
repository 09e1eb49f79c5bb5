"""The operator against a real API server, scheduler, controller-manager and KWOK GPU nodes.

These tests need no pod to run anything: KWOK marks the arms' pods Running and Ready, which is
enough for deployment, failure detection, garbage collection, restarts and spec changes. The full
measured experiment (pods that really run the simulator and the load) is in test_experiment.py.
"""

from __future__ import annotations

import contextlib
import copy
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from experiment_crd import CRD_FILE, CRD_NAME, experiment
from fake_gpu_nodes import GPU_NODE_NAMES, GPU_PRODUCT, gpu_node
from k8s_cluster import FEATURE_GATES, Cluster, ControlPlane, wait_for
from operator_process import OperatorProcess
from tests.experiment import cases_apiserver

from specdecode.experiment import manifests, spec

pytestmark = pytest.mark.e2e


@pytest.fixture
def operator(
    cluster: Cluster, crd: Path, gpu_nodes: list[str], namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(cluster, namespace, tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def names(operator: OperatorProcess, kind: str) -> dict[str, str]:
    items = operator.get(kind, "", "-l", "specdecode.io/experiment=exp")["items"]
    return {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}


def fetch(url: str) -> str:
    """The body, or "" while nothing answers (the operator may still be starting)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_the_operator_serves_liveness_and_counts_experiments_by_phase(operator: OperatorProcess) -> None:
    doc = experiment()
    doc["spec"]["engine"]["args"] = ["--host", "::"]
    operator.apply(doc)
    operator.wait_phase("exp", "Failed")
    assert operator.wait("liveness", lambda: fetch(f"http://127.0.0.1:{operator.liveness_port}/healthz"))
    metrics = operator.wait(
        "the experiment counted",
        lambda: (
            (text := fetch(f"http://127.0.0.1:{operator.metrics_port}/metrics"))
            and 'specdecode_experiments{phase="Failed",verdict=""} 1.0' in text
            and text
        ),
    )
    assert "specdecode_reconcile_errors_total 0.0" in metrics


def test_an_invalid_spec_fails_without_deploying_anything(operator: OperatorProcess) -> None:
    doc = experiment()
    doc["spec"]["engine"]["args"] = ["--port", "9000"]  # the schema allows it; vLLM's ownership rules don't
    operator.apply(doc)
    status = operator.wait_phase("exp", "Failed")
    assert status["reason"] == "InvalidSpec"
    assert "spec.engine.args[0]: '--port' is owned by the operator" in status["message"]
    assert "verdict" not in status
    assert condition(status, "Stalled")["status"] == "True"
    assert condition(status, "Completed")["status"] == "False"
    assert names(operator, "deployments") == {}


def test_an_arm_that_no_gpu_node_fits_fails_unschedulable(operator: OperatorProcess) -> None:
    doc = experiment()
    doc["spec"]["engine"]["resources"] = {"limits": {"nvidia.com/gpu": 16}}  # the fake nodes have 8 each
    operator.apply(doc)
    status = operator.wait_phase("exp", "Failed", timeout=60)
    assert status["reason"] == "Unschedulable", status
    assert "Insufficient nvidia.com/gpu" in status["message"]
    assert "verdict" not in status
    assert status["observedGeneration"] == 1
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])
    # cleanup: Always frees the (requested) GPUs
    operator.wait("the arms deleted", lambda: names(operator, "deployments") == {})


def test_a_child_the_api_server_refuses_fails_the_experiment_at_once(operator: OperatorProcess) -> None:
    """The API server refuses the arm's Deployment (422, here from an admission policy): on every
    tick, which kopf alone would retry forever (Pending, no deadline)."""
    with refused_by_admission(operator, "no-arms", "CREATE", "deployments", "false"):
        operator.wait(
            "the deployment policy",
            lambda: policy_active(operator, {**PROBE_DEPLOYMENT, "metadata": {"name": "probe2"}}),
        )
        operator.apply(experiment())
        failed_with(operator, "ChildRejected", "Deployment exp-control (HTTP 422)", "refused by no-arms")
    assert names(operator, "deployments") == {}


def test_a_label_value_the_api_server_would_refuse_is_an_invalid_spec(operator: OperatorProcess) -> None:
    """A label value with a space passes the CRD schema but not the Deployment's validation: refused
    by the operator's own check before anything is deployed (before: ChildRejected from the API server)."""
    doc = experiment()
    doc["spec"]["engine"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA H200"}
    operator.apply(doc)
    failed_with(operator, "InvalidSpec", "spec.engine.nodeSelector['nvidia.com/gpu.product']: label value")
    assert names(operator, "deployments") == {}


@pytest.mark.parametrize("case", sorted(cases_apiserver.REFUSED))
def test_the_api_server_refuses_what_validate_refuses(cluster: Cluster, namespace: str, case: str) -> None:
    """Each engine field `validate` refuses (tests/experiment/test_apiserver_rules.py), built into an
    arm's Deployment as the operator would, is refused by a real API server too: the rules are its."""
    res = _dry_run_arm(cluster, namespace, cases_apiserver.REFUSED[case][0])
    refused = (
        "is invalid",
        "Invalid value",
        "cannot be handled as a Deployment",
    )  # 422, or 400 for a quantity
    assert res.returncode != 0 and any(why in res.stderr for why in refused), res.stderr


@pytest.mark.parametrize("case", sorted(cases_apiserver.ACCEPTED))
def test_the_api_server_accepts_what_validate_accepts(cluster: Cluster, namespace: str, case: str) -> None:
    res = _dry_run_arm(cluster, namespace, cases_apiserver.ACCEPTED[case])
    assert res.returncode == 0, res.stderr


def _dry_run_arm(cluster: Cluster, namespace: str, engine: dict[str, Any]) -> Any:
    """A server-side dry run of the control arm's Deployment rendered from `engine` (the schema's
    parse only: the operator's own rules are what is being checked against the API server's)."""
    doc = experiment()
    doc["spec"]["engine"].update(engine)
    parsed = spec.ExperimentSpec.model_validate(doc["spec"])
    deployment = manifests.build_deployment("exp", parsed, spec.Arm.CONTROL, manifests.Settings())
    return cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(deployment), check=False
    )


@contextlib.contextmanager
def refused_by_admission(
    operator: OperatorProcess, name: str, operation: str, resource: str, expression: str
) -> Iterator[None]:
    """A ValidatingAdmissionPolicy, bound to the test's namespace, that refuses `operation` on
    `resource` (apps or core group) where `expression` is false: HTTP 422 Invalid, as the API server
    answers an object its validation refuses. Removed on leaving (so is the namespace's)."""
    group = "apps" if resource == "deployments" else ""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [group],
                        "apiVersions": ["v1"],
                        "operations": [operation],
                        "resources": [resource],
                    }
                ]
            },
            "validations": [{"expression": expression, "message": f"refused by {name}", "reason": "Invalid"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator.namespace}}
            },
        },
    }
    cluster = operator.cluster
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [policy, binding]})
    )
    try:
        yield
    finally:
        cluster.kubectl(
            "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name, check=False
        )


def policy_active(operator: OperatorProcess, probe: dict[str, Any]) -> bool:
    """Whether the API server now refuses `probe` (a server-side dry run): a new policy takes a
    moment to be enforced."""
    res = operator.cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        operator.namespace,
        "-f",
        "-",
        input=json.dumps(probe),
        check=False,
    )
    return res.returncode != 0 and "refused by" in res.stderr


def delete_refused(operator: OperatorProcess, deployment: str) -> bool:
    res = operator.cluster.kubectl(
        "delete", "--dry-run=server", "-n", operator.namespace, "deployment", deployment, check=False
    )
    return res.returncode != 0 and "refused by" in res.stderr


PROBE_DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "probe"},
    "spec": {
        "replicas": 0,
        "selector": {"matchLabels": {"app": "probe"}},
        "template": {
            "metadata": {"labels": {"app": "probe"}},
            "spec": {"containers": [{"name": "c", "image": "probe"}]},
        },
    },
}

SPEC_PROBE = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "exp-spec"}}


def test_a_child_refused_after_the_arms_exist_frees_their_gpus_even_across_a_failed_cleanup(
    operator: OperatorProcess,
) -> None:
    """The arms are created first, then the API server refuses the spec ConfigMap (422). The arms'
    DELETE is refused too, so the ending's cleanup fails: the experiment stays Failed with
    status.cleanup Retrying, and an operator started afresh once DELETE works deletes the arms.
    (On main: Failed/ChildRejected with both arms running, never cleaned up.)"""
    # a Deployment the delete policy is seen to refuse once it is enforced
    operator.cluster.kubectl(
        "create", "-n", operator.namespace, "-f", "-", input=json.dumps(PROBE_DEPLOYMENT)
    )
    with refused_by_admission(
        operator, "no-spec-map", "CREATE", "configmaps", "object.metadata.name != 'exp-spec'"
    ):
        operator.wait("the spec policy", lambda: policy_active(operator, SPEC_PROBE))
        with refused_by_admission(operator, "no-arm-delete", "DELETE", "deployments", "false"):
            operator.wait("the delete policy", lambda: delete_refused(operator, "probe"))
            operator.apply(experiment())
            status = failed_with(
                operator, "ChildRejected", "ConfigMap exp-spec (HTTP 422)", "refused by no-spec-map"
            )
            status = operator.wait(
                "the cleanup retried",
                lambda: (st := operator.status("exp")).get("cleanup") == "Retrying" and st,
            )
            assert "cleaning up the arms failed" in status["message"], status
            assert set(names(operator, "deployments")) == {"exp-control", "exp-treatment"}
            operator.stop()
        operator.start()
        status = operator.wait(
            "the restarted operator to clean up",
            lambda: (st := operator.status("exp")).get("cleanup") == "Deleted" and st,
        )
    assert (status["phase"], status["reason"]) == ("Failed", "ChildRejected")
    assert "cleaning up the arms failed" not in status["message"]
    operator.wait("the arms deleted", lambda: names(operator, "deployments") == {})


def test_a_failure_under_cleanup_never_scales_the_arms_to_zero_and_says_so(operator: OperatorProcess) -> None:
    with refused_by_admission(
        operator, "no-spec-map", "CREATE", "configmaps", "object.metadata.name != 'exp-spec'"
    ):
        operator.wait("the spec policy", lambda: policy_active(operator, SPEC_PROBE))
        doc = experiment()
        doc["spec"]["cleanup"] = "Never"
        operator.apply(doc)
        status = failed_with(
            operator, "ChildRejected", "kept at 0 replicas (spec.cleanup: Never): their GPUs are free"
        )
    assert status["cleanup"] == "ScaledToZero"
    deployments = operator.get("deployments", "", "-l", "specdecode.io/experiment=exp")["items"]
    assert sorted((d["metadata"]["name"], d["spec"]["replicas"]) for d in deployments) == [
        ("exp-control", 0),
        ("exp-treatment", 0),
    ]
    operator.wait(
        "no arm pod", lambda: operator.get("pods", "", "-l", "specdecode.io/experiment=exp")["items"] == []
    )


def failed_with(operator: OperatorProcess, reason: str, *says: str) -> dict[str, Any]:
    """The status once `exp` failed (within a minute) with `reason`, its message saying each of `says`."""
    status = operator.wait_phase("exp", "Failed", timeout=60)
    assert status["reason"] == reason, status
    for phrase in says:
        assert phrase in status["message"], status
    assert "verdict" not in status
    return status


def test_real_engines_in_a_restricted_namespace_fail_at_once_naming_pod_security(
    operator: OperatorProcess,
) -> None:
    """vLLM images run as root, which Pod Security `restricted` refuses: no pod is ever created.
    Not 30 minutes of DeployDeadlineExceeded with a hint about pods' events."""
    operator.cluster.kubectl(
        "label", "namespace", operator.namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    doc = experiment()
    del doc["spec"]["engine"]["simulator"]
    doc["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.33.0"
    operator.apply(doc)
    says = ("Pod Security admission refuses", 'violates PodSecurity "restricted:latest"')
    failed_with(operator, "PodCreationForbidden", *says)
    operator.wait("the arms deleted", lambda: names(operator, "deployments") == {})


def with_api_key() -> dict[str, Any]:
    """An experiment whose arms and load Job read the API key of Secret `vllm-key`; cleanup Never, so
    that an arm once created would still be there to see."""
    doc = experiment(cleanup="Never")
    doc["spec"]["engine"]["apiKeySecret"] = {"name": "vllm-key", "key": "api-key"}
    return doc


def test_a_missing_api_key_secret_fails_the_experiment_before_any_arm_is_created(
    operator: OperatorProcess,
) -> None:
    """Not a pod in CreateContainerConfigError on a GPU (KWOK would even run it Ready): issue 16."""
    operator.apply(with_api_key())
    status = failed_with(
        operator,
        "SecretMissing",
        f"spec.engine.apiKeySecret names Secret vllm-key, which does not exist in namespace {operator.namespace}",
        f"kubectl create secret generic vllm-key -n {operator.namespace} --from-literal=api-key=...",
    )
    assert "arms" not in status
    assert names(operator, "deployments") == {}  # cleanup Never: none was ever created
    assert names(operator, "jobs") == {}


def test_an_api_key_secret_that_exists_lets_the_experiment_deploy_as_before(
    operator: OperatorProcess,
) -> None:
    operator.cluster.kubectl(
        "create", "secret", "generic", "vllm-key", "-n", operator.namespace, "--from-literal=api-key=k"
    )
    operator.apply(with_api_key())
    operator.wait("both arms", lambda: len(names(operator, "deployments")) == 2)
    status = operator.wait(
        "both arms Ready, waiting for Prometheus",
        lambda: s if "waiting for Prometheus" in (s := operator.status("exp")).get("message", "") else None,
    )
    assert status["phase"] == "Deploying", status


def test_arms_are_owned_by_the_experiment_and_deleting_it_removes_them(operator: OperatorProcess) -> None:
    operator.apply(experiment())
    operator.wait("both arms", lambda: len(names(operator, "deployments")) == 2)
    deployments = operator.get("deployments", "", "-l", "specdecode.io/experiment=exp")["items"]
    for deployment in deployments:
        owner = deployment["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("SpecDecodeExperiment", "exp", True)
        pod = deployment["spec"]["template"]["spec"]
        assert pod["containers"][0]["command"] == ["specdecode", "sim"]
    for kind in ("services", "networkpolicies", "configmaps", "serviceaccounts"):
        assert names(operator, kind), kind
    operator.cluster.kubectl("delete", "sdx", "exp", "-n", operator.namespace, "--wait=true", timeout=60)
    for kind in ("deployments", "services", "networkpolicies", "poddisruptionbudgets", "jobs"):
        operator.wait(f"{kind} garbage-collected", lambda kind=kind: names(operator, kind) == {}, timeout=60)


def test_a_restarted_operator_resumes_without_duplicating_children(operator: OperatorProcess) -> None:
    operator.apply(experiment())
    operator.wait("both arms", lambda: len(names(operator, "deployments")) == 2)
    before = names(operator, "deployments")
    operator.stop()
    operator.start()
    # Prometheus is unreachable in these tests: the arms stay Deploying, waiting to be scraped.
    status = operator.wait(
        "the restarted operator to reconcile",
        lambda: (
            operator.status("exp")
            if "waiting for Prometheus" in operator.status("exp").get("message", "")
            else None
        ),
    )
    assert status["phase"] == "Deploying"
    assert names(operator, "deployments") == before  # the same objects, not new ones
    assert names(operator, "jobs") == {}  # no load Job before Prometheus scrapes both arms
    assert status["observedGeneration"] == 1


def test_a_spec_change_restarts_the_experiment_for_the_new_generation(operator: OperatorProcess) -> None:
    operator.apply(experiment())
    operator.wait("both arms", lambda: len(names(operator, "deployments")) == 2)
    first = names(operator, "deployments")
    changed = copy.deepcopy(experiment())
    changed["spec"]["engine"]["seed"] = 7
    operator.apply(changed)

    def regenerated() -> bool:
        now = names(operator, "deployments")
        status = operator.status("exp")
        return (
            len(now) == 2
            and set(now.values()).isdisjoint(first.values())
            and status.get("observedGeneration") == 2
        )

    operator.wait("children rebuilt for generation 2", regenerated)
    deployment = operator.get("deployment", "exp-control")
    assert deployment["metadata"]["annotations"]["specdecode.io/generation"] == "2"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--seed") + 1] == "7"
    status = operator.status("exp")
    assert all(c["observedGeneration"] == 2 for c in status["conditions"])
    assert condition(status, "Promoted")["status"] == "False"


def test_prometheus_down_fails_the_experiment_and_never_promotes(operator: OperatorProcess) -> None:
    doc = experiment(deadlines={"deploy": "15s", "run": "5m"})  # prometheus.url points at a closed port
    operator.apply(doc)
    status = operator.wait_phase("exp", "Failed", timeout=90)
    assert status["reason"] == "PrometheusNoData", status
    assert "unreachable" in status["message"]
    assert "verdict" not in status
    assert condition(status, "Promoted")["status"] == "False"
    assert "Load" not in {c["reason"] for c in status["conditions"]}
    assert names(operator, "jobs") == {}  # no load was sent to arms nobody could measure


def test_both_arms_share_a_node_and_the_status_says_where_each_ran(operator: OperatorProcess) -> None:
    operator.apply(experiment())  # spec.placement.colocate: Preferred by default

    def recorded() -> dict[str, Any] | None:
        status = operator.status("exp")
        return status if status.get("environment", {}).get("arms") else None

    # Prometheus is unreachable here: the arms stay Deploying, but where they run is recorded.
    environment = operator.wait("the arms' hosts recorded", recorded)["environment"]
    control, treatment = environment["arms"]["control"], environment["arms"]["treatment"]
    assert control["node"] == treatment["node"] and control["node"] in GPU_NODE_NAMES
    assert (control["gpuProduct"], control["cpuCount"]) == (GPU_PRODUCT, 64)  # the Node's labels and capacity
    assert environment["hostDifferences"] == []
    pods = operator.get("pods", "", "-l", "specdecode.io/experiment=exp")["items"]
    assert {p["spec"]["nodeName"] for p in pods} == {control["node"]}


def test_required_colocation_fails_an_arm_that_cannot_join_the_other(operator: OperatorProcess) -> None:
    doc = experiment(placement={"colocate": "Required"})
    doc["spec"]["engine"]["resources"] = {"limits": {"nvidia.com/gpu": 5}}  # 8 per node: one arm per node
    operator.apply(doc)
    status = operator.wait_phase("exp", "Failed", timeout=90)
    assert status["reason"] == "Unschedulable", status
    assert "spec.placement.colocate is Required: one node must have GPUs for both arms" in status["message"]
    pods = operator.get("pods", "", "-l", "specdecode.io/experiment=exp")["items"]
    assert len({p["spec"].get("nodeName") for p in pods if p["spec"].get("nodeName")}) <= 1


def test_an_api_server_restarted_mid_experiment_only_delays_it(
    control_plane_factory: Any, tmp_path: Path
) -> None:
    """Fault matrix, "API server restarted": its own control plane (restarting the session's would
    disturb the other tests), the API away for 8 s while both arms exist. The operator keeps running,
    the children stay the same objects, and it acts on the experiment again afterwards (an abort
    annotation written after the restart deletes the arms)."""
    cp: ControlPlane = control_plane_factory(feature_gates=FEATURE_GATES)
    cluster = cp.cluster
    assert cluster is not None
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    wait_for(
        f"{CRD_NAME} Established",
        lambda: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in cluster.get_json(f"crd/{CRD_NAME}").get("status", {}).get("conditions") or []
        ),
    )
    nodes = {"apiVersion": "v1", "kind": "List", "items": [gpu_node(n) for n in GPU_NODE_NAMES]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(nodes))
    cluster.kubectl("create", "namespace", "restarted")
    operator = OperatorProcess(cluster, "restarted", tmp_path)
    operator.start()
    try:
        operator.apply(experiment())
        operator.wait("both arms", lambda: len(names(operator, "deployments")) == 2)
        before = names(operator, "deployments")
        cp.restart_apiserver(down=8.0)
        assert operator.process is not None and operator.process.poll() is None, operator.log_tail()
        assert names(operator, "deployments") == before  # the same objects, not new ones
        # The tick that created the arms writes Deploying only when it returns (kopf's status patch), so
        # the restart may fall between the two: the patch is then written by a later tick. Deploying,
        # not Failed, once the operator writes status again:
        assert operator.wait_phase("exp", "Deploying", "Failed")["phase"] == "Deploying"
        generation = operator.get("sdx", "exp")["metadata"]["generation"]
        operator.cluster.kubectl(
            "annotate", "sdx", "exp", f"specdecode.io/abort={generation}", "-n", operator.namespace
        )
        status = operator.wait_phase("exp", "Failed")
        assert status["reason"] == "Aborted", status
        operator.wait("the arms deleted", lambda: names(operator, "deployments") == {})
        assert operator.process.poll() is None, operator.log_tail()
    finally:
        operator.stop()
