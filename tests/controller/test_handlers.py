"""The reconcile handler tick by tick against an in-memory API (`fake_kube.FakeKube`).

Faults that the pure `decide()` cannot see happen here: what the shell reads and writes (which
ConfigMap the load reads, which results are trusted) and what it does when a call fails.
"""

from __future__ import annotations

import asyncio
import copy
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from specdecode import cli, exit_status, results
from specdecode.controller import collect, handlers, kube, observe, ticks
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import keys, manifests, rounds, status, validation
from tests.controller.fake_kube import FakeKube, Operator, refusal
from tests.factories import experiment_document

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def document(**workload: Any) -> dict[str, Any]:
    doc = experiment_document()
    doc["spec"]["workload"] = {
        "stages": [{"name": "low", "rate": 1.0}],
        "requestsPerStage": 100,
        **workload,
    }
    return doc


def run(operator: Operator, ticks: int = 1, now: datetime = T0) -> dict[str, Any]:
    status: dict[str, Any] = {}
    for _ in range(ticks):
        status = asyncio.run(operator.tick(now))
    return status


def loaded_spec(client: FakeKube) -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec ConfigMap's annotations and the experiment document the load Job would read."""
    config_map = client.named(kube.CONFIG_MAP, "exp-spec")
    return (
        config_map["metadata"].get("annotations") or {},
        yaml.safe_load(config_map["data"][manifests.EXPERIMENT_FILE]),
    )


def test_a_spec_edit_gives_the_new_generation_s_load_the_new_workload(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    operator = Operator(client, document())
    assert run(operator, 2)["phase"] == "Deploying"
    annotations, loaded = loaded_spec(client)
    assert annotations[keys.GENERATION_ANNOTATION] == "1"
    assert loaded["spec"]["workload"]["requestsPerStage"] == 100

    edited = copy.deepcopy(operator.body["spec"])
    edited["workload"]["requestsPerStage"] = 1000
    edited["workload"]["stages"] = [{"name": "low", "rate": 16.0}]
    operator.edit(edited)
    status: dict[str, Any] = {}
    for _ in range(5):
        status = run(operator)
        if status.get("phase") == "Deploying" and status.get("observedGeneration") == 2:
            break
    assert (status["phase"], status["observedGeneration"]) == ("Deploying", 2)
    annotations, loaded = loaded_spec(client)
    assert annotations[keys.GENERATION_ANNOTATION] == "2"
    assert loaded["metadata"]["annotations"][keys.GENERATION_ANNOTATION] == "2"
    assert loaded["spec"]["workload"]["requestsPerStage"] == 1000
    assert loaded["spec"]["workload"]["stages"] == [{"name": "low", "rate": 16.0}]


def test_a_spec_config_map_that_names_no_generation_is_replaced(
    operator_events: list[tuple[str, str]],
) -> None:
    """One left by an older operator, or written by someone else, is not read by the load."""
    client = FakeKube()
    foreign = manifests.build_spec_config_map("exp", document(requestsPerStage=7))
    foreign["metadata"]["labels"] = manifests.labels("exp", component="load")
    client.add(foreign)
    operator = Operator(client, document())
    run(operator, 4)
    annotations, loaded = loaded_spec(client)
    assert annotations[keys.GENERATION_ANNOTATION] == "1"
    assert loaded["spec"]["workload"]["requestsPerStage"] == 100


def test_children_are_listed_for_staleness_without_their_data(
    operator_events: list[tuple[str, str]],
) -> None:
    """Result ConfigMaps can be megabytes each: every tick reads only their metadata."""
    client = FakeKube()
    operator = Operator(client, document())
    run(operator, 3)
    config_map_reads = [(method, what) for method, kind, what in client.reads if kind == kube.CONFIG_MAP]
    assert config_map_reads and all(method == "LIST-metadata" for method, _ in config_map_reads)


@pytest.mark.parametrize(("written_for", "asked"), [(1, 2), (None, 1)])
def test_the_load_refuses_an_experiment_file_of_another_generation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written_for: int | None, asked: int
) -> None:
    path = tmp_path / "experiment.yaml"
    rendered = manifests.build_spec_config_map("exp", document(), written_for)
    path.write_text(rendered["data"][manifests.EXPERIMENT_FILE])
    code = cli.main(
        [
            "loadgen",
            "--experiment",
            str(path),
            "--control-url",
            "http://127.0.0.1:9",
            "--treatment-url",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "out"),
            "--results-configmap",
            "exp-results",  # no upload is tried: nothing was measured
            "--generation",
            str(asked),
        ]
    )
    assert code == exit_status.INVALID
    err = capsys.readouterr().err
    assert f"measures generation {asked} (--generation)" in err
    assert not (tmp_path / "out").exists()


def test_an_experiment_file_of_its_own_generation_is_accepted() -> None:
    rendered = manifests.build_spec_config_map("exp", document(), 3)
    assert manifests.document_generation(yaml.safe_load(rendered["data"][manifests.EXPERIMENT_FILE])) == 3


def analyzing(client: FakeKube, **settings: Any) -> Operator:
    """An experiment whose load Job finished: the next tick collects its results."""
    operator = Operator(client, document(), settings=OperatorSettings(**settings))
    run(operator, 2)  # Pending -> Deploying: children of generation 1 exist
    operator.body["status"].update(phase="Analyzing", phaseStartedAt=T0.isoformat())
    job = manifests.build_load_job("exp", validation.parse_experiment(document())[0], manifests.Settings())
    job["metadata"]["annotations"] = {keys.GENERATION_ANNOTATION: "1"}
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    client.add(job)
    return operator


def job_owner(client: FakeKube) -> dict[str, Any]:
    uid = client.named(kube.JOB, "exp-load")["metadata"]["uid"]
    return {"apiVersion": "batch/v1", "kind": "Job", "name": "exp-load", "uid": uid}


def test_forged_results_end_in_failed_never_in_a_verdict(operator_events: list[tuple[str, str]]) -> None:
    client = FakeKube()
    operator = analyzing(client)
    forged = results.pack_legacy({"requests.jsonl": "FORGED", "windows.json": "{}"})
    for cm in results.build_config_maps("exp-results", "exp", forged, generation=1):  # no Job owns it
        client.add(cm)
    status = run(operator)
    assert (status["phase"], status["reason"]) == ("Failed", "ResultsUntrusted"), status
    assert "not owned by the load Job exp-load" in status["message"]
    assert "verdict" not in status


def test_results_too_large_end_in_failed_with_the_limit_named(operator_events: list[tuple[str, str]]) -> None:
    """Not an operator killed for memory in Analyzing after every restart: a reason, once."""
    client = FakeKube()
    operator = analyzing(client, results_max_bytes=2 * 2**20)  # the workload plans ~75 KB: it is deployed
    # 2.4 MB (an older load image's JSON bundle): the run made more
    big = results.pack_legacy({"requests.jsonl": os.urandom(1_200_000).hex()})
    for cm in results.build_config_maps("exp-results", "exp", big, owners=[job_owner(client)], generation=1):
        client.add(cm)
    status = run(operator)
    assert (status["phase"], status["reason"]) == ("Failed", "ResultsTooLarge"), status
    assert "SPECDECODE_RESULTS_MAX_BYTES" in status["message"]
    assert "verdict" not in status


# ------------------------------------------------------------- faults that repeat every tick

INVALID_SELECTOR = (
    'Deployment.apps "exp-control" is invalid: spec.template.spec.nodeSelector: Invalid value: "H 200": '
    "a valid label must be an empty string or consist of alphanumeric characters"
)


def test_a_child_the_api_server_refuses_as_invalid_fails_at_once_without_arms(
    operator_events: list[tuple[str, str]],
) -> None:
    """Not Pending forever with kopf retrying: Failed/ChildRejected with the API server's words."""
    client = FakeKube()
    client.refuse = lambda method, kind, obj: (
        refusal(422, INVALID_SELECTOR) if (method, kind) == ("POST", kube.DEPLOYMENT) else None
    )
    operator = Operator(client, document())
    status = run(operator, 2)
    assert (status["phase"], status["reason"]) == ("Failed", "ChildRejected"), status
    assert "Deployment exp-control (HTTP 422)" in status["message"]
    assert 'Invalid value: "H 200"' in status["message"]
    assert "verdict" not in status
    assert client.names(kube.DEPLOYMENT) == []
    assert ("ChildRejected", status["message"]) in operator_events


def test_a_later_child_refused_after_the_arms_fails_and_deletes_the_arms(
    operator_events: list[tuple[str, str]],
) -> None:
    """The arms are created first; the API server then refuses the spec ConfigMap (422). The
    failure must not leave both GPU arms running (on main: Failed/ChildRejected, arms kept, and no
    later tick, since a Failed experiment is not reconciled)."""
    client = FakeKube()
    client.refuse = lambda method, kind, obj: (
        refusal(422, 'ConfigMap "exp-spec" is invalid: []: Too long: must have at most 1048576 bytes')
        if (method, kind) == ("POST", kube.CONFIG_MAP)
        else None
    )
    operator = Operator(client, document())
    status = run(operator, 2)
    assert (status["phase"], status["reason"]) == ("Failed", "ChildRejected"), status
    assert "ConfigMap exp-spec (HTTP 422)" in status["message"]
    assert client.names(kube.DEPLOYMENT) == []
    assert status["cleanup"] == "Deleted"
    assert not handlers._needs_reconcile(body=kopf.Body(operator.body))


def test_a_failure_under_cleanup_never_keeps_the_arms_at_zero_replicas_and_says_so(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    client.refuse = lambda method, kind, obj: (
        refusal(422, 'ConfigMap "exp-spec" is invalid')
        if (method, kind) == ("POST", kube.CONFIG_MAP)
        else None
    )
    doc = document()
    doc["spec"]["cleanup"] = "Never"
    status = run(Operator(client, doc), 2)
    assert (status["phase"], status["reason"], status["cleanup"]) == (
        "Failed",
        "ChildRejected",
        "ScaledToZero",
    )
    assert "kept at 0 replicas (spec.cleanup: Never): their GPUs are free" in status["message"]
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]
    assert [client.named(kube.DEPLOYMENT, n)["spec"]["replicas"] for n in client.names(kube.DEPLOYMENT)] == [
        0,
        0,
    ]


def test_a_cleanup_that_fails_is_finished_by_a_restarted_operator(
    operator_events: list[tuple[str, str]],
) -> None:
    """The arms' DELETE fails when the experiment ends: it stays Failed, status.cleanup Retrying,
    and is still reconciled; an operator started afresh (nothing in memory) deletes the arms."""
    client = FakeKube()
    operator = Operator(client, document())
    run(operator, 2)
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]
    client.refuse = lambda method, kind, obj: (
        refusal(500, "etcd timeout") if method == "DELETE" and kind == kube.DEPLOYMENT else None
    )
    status = run(operator, now=T0 + timedelta(minutes=31))  # past the deploy deadline: Failed
    assert (status["phase"], status["reason"], status["cleanup"]) == (
        "Failed",
        "DeployDeadlineExceeded",
        "Retrying",
    ), status
    assert "cleaning up the arms failed" in status["message"]
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]
    assert handlers._needs_reconcile(body=kopf.Body(operator.body))
    assert run(operator, now=T0 + timedelta(minutes=32))["cleanup"] == "Retrying"  # still refused

    client.refuse = lambda method, kind, obj: None
    restarted = Operator(client, operator.body)
    status = run(restarted, now=T0 + timedelta(minutes=33))
    assert (status["phase"], status["reason"], status["cleanup"]) == (
        "Failed",
        "DeployDeadlineExceeded",
        "Deleted",
    )
    assert "cleaning up the arms failed" not in status["message"]
    assert client.names(kube.DEPLOYMENT) == []
    assert not handlers._needs_reconcile(body=kopf.Body(restarted.body))
    assert ("CleanedUp", "the arms are deleted") in operator_events


def test_an_api_error_on_every_tick_fails_pending_at_the_deploy_deadline(
    operator_events: list[tuple[str, str]],
) -> None:
    """Pending has no deadline of its own in decide(); a create that fails every tick used to keep
    it there forever."""
    client = FakeKube()
    client.refuse = lambda method, kind, obj: (
        refusal(500, "etcdserver: request timed out") if method == "POST" else None
    )
    operator = Operator(client, document())
    run(operator)  # accepted: Pending since T0
    retrying = run(operator, 3, now=T0 + timedelta(minutes=29))
    assert retrying["phase"] == "Pending"
    assert retrying["message"].startswith(
        "retrying: HTTP 500 from the API server (for Deployment exp-control)"
    )
    status = run(operator, now=T0 + timedelta(minutes=31))
    assert (status["phase"], status["reason"]) == ("Failed", "KubernetesApiError"), status
    assert "etcdserver: request timed out" in status["message"]
    assert "spec.deadlines.deploy (30m)" in status["message"]


def test_a_list_refused_on_every_tick_fails_at_the_deadline_and_frees_the_gpus(
    operator_events: list[tuple[str, str]],
) -> None:
    """Nothing can be observed (the operator lost `list pods`): the arms are deleted all the same."""
    client = FakeKube()
    operator = Operator(client, document())
    run(operator, 2)  # Deploying since T0: both arms created
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]
    client.refuse = lambda method, kind, obj: (
        refusal(403, 'pods is forbidden: cannot list resource "pods"')
        if (method, kind) == ("LIST", kube.POD)
        else None
    )
    assert run(operator, 2, now=T0 + timedelta(minutes=29))["phase"] == "Deploying"
    status = run(operator, now=T0 + timedelta(minutes=31))
    assert (status["phase"], status["reason"]) == ("Failed", "KubernetesApiError"), status
    assert 'cannot list resource "pods"' in status["message"]
    assert "verdict" not in status
    assert client.names(kube.DEPLOYMENT) == []  # cleanup: Always


def test_the_first_tick_writes_the_pending_phase(operator_events: list[tuple[str, str]]) -> None:
    """Pending is the status' default: without an explicit write `kubectl get sdx` shows no phase."""
    client = FakeKube()
    client.refuse = lambda method, kind, obj: refusal(500, "down") if method == "POST" else None
    assert run(Operator(client, document()))["phase"] == "Pending"


def test_an_api_server_away_for_a_while_only_delays_the_experiment(
    operator_events: list[tuple[str, str]],
) -> None:
    """Every call fails (a restarting API server) for some ticks within the deadline: the phase and
    the children are kept, and the experiment goes on once it is back."""
    client = FakeKube()
    operator = Operator(client, document())
    run(operator, 2)
    before = {
        name: client.named(kube.DEPLOYMENT, name)["metadata"]["uid"] for name in client.names(kube.DEPLOYMENT)
    }
    client.refuse = lambda method, kind, obj: refusal(
        503, "the server is currently unable to handle the request"
    )
    away = run(operator, 3, now=T0 + timedelta(minutes=1))
    assert away["phase"] == "Deploying" and away["message"].startswith("retrying: HTTP 503")
    client.refuse = lambda method, kind, obj: None
    back = run(operator, now=T0 + timedelta(minutes=2))
    assert (back["phase"], back["message"]) == ("Deploying", "creating both arms")  # the retry note is gone
    assert {
        name: client.named(kube.DEPLOYMENT, name)["metadata"]["uid"] for name in client.names(kube.DEPLOYMENT)
    } == before


def test_a_workload_whose_results_the_operator_could_not_read_deploys_nothing(
    operator_events: list[tuple[str, str]],
) -> None:
    """Better InvalidSpec now than hours of GPUs ending in ResultsTooLarge."""
    client = FakeKube()
    huge = document(requestsPerStage=1_000_000, stages=[{"name": f"s{i}", "rate": 1.0} for i in range(32)])
    status = run(Operator(client, huge), 2)
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec"), status
    assert "more than the 48 MiB the operator reads (SPECDECODE_RESULTS_MAX_BYTES)" in status["message"]
    assert "lower requestsPerStage" in status["message"]
    assert client.names(kube.DEPLOYMENT) == []


def test_a_child_name_taken_by_a_foreign_object_is_never_adopted(
    operator_events: list[tuple[str, str]],
) -> None:
    """`<exp>-spec` written by someone else (not labelled, so not found stale) would be the workload
    the load runs: the experiment waits for the name to be freed, then fails, and never uses it."""
    client = FakeKube()
    foreign = manifests.build_spec_config_map("exp", document(requestsPerStage=7), 1)
    del foreign["metadata"]["labels"]
    client.add(foreign)
    operator = Operator(client, document())
    waiting = run(operator, 3, now=T0 + timedelta(minutes=1))
    assert waiting["phase"] == "Pending", waiting
    assert waiting["message"].startswith("retrying: ConfigMap exp-spec exists and is not this experiment's")
    status = run(operator, now=T0 + timedelta(minutes=32))  # Pending since T0 + 1 min
    assert (status["phase"], status["reason"]) == ("Failed", "ChildConflict"), status
    assert client.names(kube.DEPLOYMENT) == [] and client.names(kube.JOB) == []
    assert loaded_spec(client)[1]["spec"]["workload"]["requestsPerStage"] == 7  # untouched, unused


def test_a_report_config_map_the_experiment_does_not_own_is_never_replaced() -> None:
    client = FakeKube()
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "exp-report"},
        "data": {"a": "b"},
    }
    client.add(foreign)
    experiment, _ = validation.parse_experiment(document())
    metadata = {"name": "exp", "namespace": "ns", "uid": "experiment-uid", "generation": 1}
    store = collect.store_report(client, status.ExperimentStatus(), [], [], experiment, metadata)
    with pytest.raises(
        collect.ReportNameTaken, match="ConfigMap exp-report exists and is not this experiment's"
    ):
        asyncio.run(store)
    assert client.named(kube.CONFIG_MAP, "exp-report")["data"] == {"a": "b"}
    del client.store[(kube.CONFIG_MAP, "exp-report")]
    asyncio.run(collect.store_report(client, status.ExperimentStatus(), [], [], experiment, metadata))
    stored = client.named(kube.CONFIG_MAP, "exp-report")
    assert [o["uid"] for o in stored["metadata"]["ownerReferences"]] == ["experiment-uid"]
    asyncio.run(
        collect.store_report(client, status.ExperimentStatus(), [], [], experiment, metadata)
    )  # its own: replaced


def test_the_abort_annotation_of_the_current_generation_ends_the_experiment_and_deletes_its_children(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    operator = Operator(client, document())
    assert run(operator, 2)["phase"] == "Deploying"
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]
    # As if the load had started (decide() is tested per phase; here: the shell deletes the Job).
    job = manifests.build_load_job(
        "exp", validation.parse_experiment(document())[0], OperatorSettings().render, generation=1
    )
    job["metadata"].setdefault("annotations", {})[keys.GENERATION_ANNOTATION] = "1"
    client.add(job)
    operator.body["metadata"]["annotations"] = {"specdecode.io/abort": "1"}
    ended = run(operator)
    assert (ended["phase"], ended["reason"]) == ("Failed", "Aborted")
    assert client.names(kube.DEPLOYMENT) == []
    assert client.names(kube.JOB) == []
    assert [reason for reason, _ in operator_events if reason == "Aborted"] == ["Aborted"]


def test_an_abort_annotation_naming_another_generation_is_ignored(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    operator = Operator(client, document())
    operator.body["metadata"]["annotations"] = {"specdecode.io/abort": "7"}
    assert run(operator, 2)["phase"] == "Deploying"
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]


def test_the_arms_disruption_budget_is_created_with_them_and_deleted_when_the_experiment_ends(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    doc = document()
    doc["spec"]["cleanup"] = "Never"  # the arms are kept, but no longer protected from drains
    operator = Operator(client, doc)
    assert run(operator, 2)["phase"] == "Deploying"
    assert client.names(kube.DISRUPTION_BUDGET) == ["exp-arms"]
    status = run(operator, now=T0 + timedelta(hours=2))  # never Ready: the deploy deadline passes
    assert (status["phase"], status["reason"]) == ("Failed", "DeployDeadlineExceeded"), status
    assert client.names(kube.DISRUPTION_BUDGET) == []
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]


def arm_pod(arm: str, name: str, *, node: str | None = "gpu-0") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {keys.LABEL_EXPERIMENT: "exp", keys.LABEL_ARM: arm}},
        "spec": {"nodeName": node} if node else {},
    }


def test_the_treatment_pod_s_log_is_read_for_degradations_and_only_its() -> None:
    client = FakeKube()
    pods = [arm_pod("control", "exp-control-a"), arm_pod("treatment", "exp-treatment-b")]
    line = (
        "(EngineCore_DP0 pid=7) WARNING 12-02 00:12:34 [vllm.py:816] Async scheduling not supported with "
        "suffix-based speculative decoding and will be disabled."
    )
    client.logs = {"exp-control-a": line, "exp-treatment-b": "INFO vLLM API server version 0.20.0\n" + line}
    found = asyncio.run(handlers._degradations(client, "default", pods))  # type: ignore[arg-type]
    assert found is not None and [d.kind for d in found] == ["AsyncSchedulingDisabled"]
    assert [r for r in client.reads if r[0] == "LOG"] == [("LOG", kube.POD, "exp-treatment-b")]


def test_a_treatment_log_the_api_server_cannot_give_is_not_read_rather_than_clean() -> None:
    client = FakeKube()  # no kubelet behind the node: no log
    assert asyncio.run(handlers._degradations(client, "default", [arm_pod("treatment", "t")])) is None  # type: ignore[arg-type]
    unplaced = [arm_pod("treatment", "t", node=None)]
    assert asyncio.run(handlers._degradations(client, "default", unplaced)) is None  # type: ignore[arg-type]
    assert client.reads == [("LOG", kube.POD, "t")]


def ready_arms_with_pods(client: FakeKube, *, treatment_env: list[dict[str, str]]) -> None:
    """What the Deployment controller, the scheduler and the kubelet would add: each arm Ready, with
    a pod from its template on a node labelled with its GPU product (`treatment_env`: added to the
    treatment's pod, as a webhook or an edit of its Deployment would)."""
    client.add(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-0", "labels": {observe.LABEL_GPU_PRODUCT: "NVIDIA-H200"}},
        }
    )
    for arm in ("control", "treatment"):
        deployment = client.named(kube.DEPLOYMENT, f"exp-{arm}")
        deployment["status"] = {"readyReplicas": 1}
        template = copy.deepcopy(deployment["spec"]["template"])
        if arm == "treatment":
            template["spec"]["containers"][0]["env"] += treatment_env
        client.add(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {**template["metadata"], "name": f"exp-{arm}-x"},
                "spec": {**template["spec"], "nodeName": "gpu-0"},
                "status": {"phase": "Running", "containerStatuses": [{"name": "engine", "ready": True}]},
            }
        )


@pytest.mark.parametrize("fairness", ["Warn", "Fail"])
def test_the_arms_live_pods_are_compared_before_the_load(
    fairness: str, operator_events: list[tuple[str, str]]
) -> None:
    client = FakeKube()
    doc = document()
    doc["spec"]["analysis"] = {"fairness": fairness}
    operator = Operator(client, doc)
    assert run(operator, 2)["phase"] == "Deploying"
    ready_arms_with_pods(client, treatment_env=[{"name": "EXTRA", "value": "1"}])
    status = run(operator)
    assert status["armDifferences"] == [{"field": "env.EXTRA", "treatment": "1"}], status
    assert "ArmsDiffer" in {reason for reason, _ in operator_events}
    if fairness == "Warn":
        assert status["phase"] == "Running", status
        assert client.names(kube.JOB) == ["exp-load"]
    else:
        assert (status["phase"], status["reason"]) == ("Failed", "ArmsDiffer"), status
        assert client.names(kube.JOB) == []
        assert client.names(kube.DEPLOYMENT) == []  # cleanup: Always frees the GPUs


def test_arms_whose_pods_differ_only_in_speculation_start_the_load_without_a_difference(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    doc = document()
    doc["spec"]["analysis"] = {"fairness": "Fail"}
    operator = Operator(client, doc)
    assert run(operator, 2)["phase"] == "Deploying"
    ready_arms_with_pods(client, treatment_env=[])
    status = run(operator)
    assert status["phase"] == "Running", status
    assert "armDifferences" not in status
    assert "ArmsDiffer" not in {reason for reason, _ in operator_events}


def in_round(phase: str, round_: status.Round) -> dict[str, Any]:
    """The status of an experiment whose stages ran on gpu-a (control) and gpu-b (treatment)."""
    hosts = status.ArmHosts(control=status.Host(node="gpu-a"), treatment=status.Host(node="gpu-b"))
    return status.ExperimentStatus(
        observed_generation=1,
        phase=status.Phase(phase),
        phase_started_at=T0.isoformat(),
        environment=status.Environment(arms=hosts, host_differences=["node"]),
        rounds=[round_],
    ).wire()


def test_a_round_re_renders_the_arms_it_starts_again_once_pinned_to_their_nodes(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    doc = document()
    doc["spec"]["analysis"] = {"crossover": "IfApart", "confirm": True}
    s, _ = validation.parse_experiment(doc)
    for child in manifests.build_all("exp", doc, s, manifests.Settings(), generation=1):
        client.add(child)
    operator = Operator(client, doc)
    round_ = rounds.confirmation_round([[1, 4, 4], [5, 4096, 0]], None, crossed=False)
    round_ = round_.model_copy(update={"nodes": status.CrossoverPlacement(treatment="gpu-b")})
    operator.body["status"] = in_round("Deploying", round_)
    run(operator, 2)
    assert client.replaced == ["exp-treatment"]  # once: the second tick finds it rendered for the round
    treatment = client.named(kube.DEPLOYMENT, "exp-treatment")["spec"]["template"]
    assert treatment["metadata"]["annotations"][keys.ROUND_ANNOTATION] == "Confirmation"
    assert treatment["metadata"]["annotations"][keys.GENERATION_ANNOTATION] == "1"
    pinned = treatment["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pinned["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-b"]
    args = " ".join(treatment["spec"]["containers"][0]["args"])
    assert '"num_speculative_tokens_per_batch_size":[[1,4,4],[5,4096,0]]' in args
    control = client.named(kube.DEPLOYMENT, "exp-control")["spec"]["template"]
    assert keys.ROUND_ANNOTATION not in control["metadata"]["annotations"]  # it keeps serving


def ready_pod(arm: str, round_name: str) -> dict[str, Any]:
    """An arm's pod rendered for a round, Ready on its node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"exp-{arm}-{round_name.lower()}",
            "labels": {keys.LABEL_EXPERIMENT: "exp", keys.LABEL_ARM: arm},
            "annotations": {keys.GENERATION_ANNOTATION: "1", keys.ROUND_ANNOTATION: round_name},
        },
        "spec": {"nodeName": "gpu-a" if arm == "treatment" else "gpu-b"},
        "status": {"phase": "Running", "containerStatuses": [{"name": "engine", "ready": True}]},
    }


def test_a_round_s_load_reads_its_own_spec_with_the_salt_of_the_stages_load(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    doc = document()
    doc["spec"]["analysis"] = {"crossover": "IfApart"}
    s, _ = validation.parse_experiment(doc)
    for child in manifests.build_all("exp", doc, s, manifests.Settings(), generation=1):
        client.add(child)
    for arm in ("control", "treatment"):
        client.add(ready_pod(arm, "Crossover"))
    operator = Operator(client, doc)
    stages = in_round("Running", rounds.crossover_round(None))
    operator.body["status"] = {**stages, "rounds": []}
    assert run(operator)["phase"] == "Running"
    stages_job = client.named(kube.JOB, "exp-load")
    operator.body["status"] = stages
    assert run(operator)["phase"] == "Running"
    job = client.named(kube.JOB, "exp-load-crossover")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    first_args = stages_job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--salt") + 1] == first_args[first_args.index("--salt") + 1]
    spec_map = client.named(kube.CONFIG_MAP, "exp-spec-crossover")
    assert spec_map["metadata"]["annotations"][keys.GENERATION_ANNOTATION] == "1"
    round_doc = yaml.safe_load(spec_map["data"][manifests.EXPERIMENT_FILE])
    assert round_doc["spec"]["analysis"]["sequential"] is False
    assert round_doc["spec"]["workload"]["stages"][0]["requests"] == 50  # half of requestsPerStage 100
    assert manifests.document_generation(round_doc) == 1


def test_a_search_probe_s_load_reads_its_one_stage_and_leaves_the_arms_as_they_are(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    doc = document(search={"goal": "breakEven", "concurrency": {"from": 1, "to": 16}, "requestsPerProbe": 64})
    s, _ = validation.parse_experiment(doc)
    assert s.workload.search is not None
    for child in manifests.build_all("exp", doc, s, manifests.Settings(), generation=1):
        client.add(child)
    for arm in ("control", "treatment"):
        client.add(ready_pod(arm, "stages"))
    operator = Operator(client, doc)
    operator.body["status"] = in_round("Running", rounds.probe_round(s.workload.search, 2, 16))
    assert run(operator)["phase"] == "Running"
    assert client.replaced == []  # no arm rendered again
    job = client.named(kube.JOB, "exp-load-search2-c16")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--results-configmap") + 1] == "exp-results-search2-c16"
    probe_doc = yaml.safe_load(
        client.named(kube.CONFIG_MAP, "exp-spec-search2-c16")["data"][manifests.EXPERIMENT_FILE]
    )
    workload = probe_doc["spec"]["workload"]
    assert workload["stages"] == [{"name": "search2-c16", "concurrency": 16, "requests": 64}]
    assert (workload["warmupRequests"], probe_doc["spec"]["analysis"]["sequential"]) == (0, True)


def test_a_new_experiment_s_first_tick_accepts_it_and_creates_its_arms(
    operator_events: list[tuple[str, str]],
) -> None:
    """Not an interval later: with 50 experiments applied together, that interval was most of
    apply -> first child (benchmarks/README.md, "Many experiments")."""
    client = FakeKube()
    status = run(Operator(client, document(requestsPerStage=300)))  # no WeakDesign: 300 show the guardrails
    assert (status["phase"], status["observedGeneration"]) == ("Deploying", 1), status
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]
    assert [reason for reason, _ in operator_events] == ["Accepted", "Deploying"]
    operator_events.clear()
    run(Operator(FakeKube(), document()))  # 100 requests a stage: the default guardrails need 299
    assert [reason for reason, _ in operator_events] == ["Accepted", "WeakDesign", "Deploying"]


def test_analyzing_is_written_before_the_tick_judges_the_results(
    operator_events: list[tuple[str, str]],
) -> None:
    """A watcher sees Analyzing: the tick that finds the load Job done writes it before it judges (a
    big run's results take seconds); a new experiment's Pending is not written apart (its arms follow)."""
    client = FakeKube()
    operator = analyzing(client)
    assert client.status_patches == []  # the first ticks: Pending and Deploying in kopf's own patch
    for arm in ("control", "treatment"):
        client.add(ready_pod(arm, "stages"))
    operator.body["status"].update(phase="Running")
    forged = results.pack_legacy({"requests.jsonl": "FORGED", "windows.json": "{}"})
    for cm in results.build_config_maps("exp-results", "exp", forged, generation=1):
        client.add(cm)
    client.status_patches.clear()
    status = run(operator)
    assert [p.get("phase") for p in client.status_patches] == ["Analyzing"], (status, client.status_patches)
    assert (status["phase"], status["reason"]) == ("Failed", "ResultsUntrusted"), status


def test_a_spec_edit_keeps_its_pending_tick_to_delete_the_old_children(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    operator = Operator(client, document())
    run(operator, 2)
    edited = copy.deepcopy(operator.body["spec"])
    edited["workload"]["requestsPerStage"] = 7
    operator.edit(edited)
    status = run(operator)
    assert (status["phase"], status["observedGeneration"]) == ("Pending", 2), status


def test_a_failing_tick_is_retried_after_three_intervals_not_kopf_s_minute() -> None:
    """The reconcile timer's backoff: three ticks (at least 5 s), so a transient API error costs
    seconds, not kopf's default 60 s (mutation benchmark survivor: `3 * interval` -> `3 ** interval`,
    243 s at the default 5 s). kopf has no public view of a handler's options: its registry's.
    The timer's own interval is short: the handler waits out the tick interval itself (`ticks.py`)."""
    import kopf

    (timer,) = [
        h
        for h in kopf.get_default_registry()._spawning.get_all_handlers()
        if h.fn is handlers.reconcile_experiment
    ]
    assert timer.interval == ticks.POLL < 1.0
    assert handlers.SETTINGS.interval == 5.0
    assert timer.backoff == 15.0


def with_api_key(**engine: Any) -> dict[str, Any]:
    doc = document()
    doc["spec"]["engine"] = {"image": "vllm/x:1", "apiKeySecret": {"name": "vllm-key", "key": "api-key"}}
    doc["spec"]["engine"].update(engine)
    return doc


def secret(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data}


def test_a_missing_api_key_secret_fails_the_first_tick_without_creating_anything(
    operator_events: list[tuple[str, str]],
) -> None:
    """Not a pod stuck in CreateContainerConfigError once the arms hold their GPUs (issue 16)."""
    client = FakeKube()
    status = run(Operator(client, with_api_key()))
    assert (status["phase"], status["reason"]) == ("Failed", "SecretMissing"), status
    assert "spec.engine.apiKeySecret names Secret vllm-key" in status["message"]
    assert ("GET", kube.SECRET, "vllm-key") in client.reads
    assert [k for k, _ in client.store] == []  # nothing created: no arm, no Service, no ConfigMap
    assert ("SecretMissing", status["message"]) in operator_events


def test_a_secret_with_its_key_creates_the_arms_as_before(operator_events: list[tuple[str, str]]) -> None:
    client = FakeKube()
    client.add(secret("vllm-key", **{"api-key": "c2VjcmV0"}))
    status = run(Operator(client, with_api_key()))
    assert status["phase"] == "Deploying", status
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]


def test_the_s3_credentials_secret_is_checked_where_the_load_job_reads_it(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    client.add(secret("s3-keys", AWS_ACCESS_KEY_ID="a2V5"))  # no AWS_SECRET_ACCESS_KEY
    env = {"SPECDECODE_RESULTS_S3_BUCKET": "results", "SPECDECODE_RESULTS_S3_CREDENTIALS_SECRET": "s3-keys"}
    operator = Operator(client, document(), settings=OperatorSettings.from_env(env))
    status = run(operator)
    assert (status["phase"], status["reason"]) == ("Failed", "SecretMissing"), status
    assert "resultsStore.s3.credentialsSecret" in status["message"]
    assert "has no key AWS_SECRET_ACCESS_KEY" in status["message"]
    assert "a2V5" not in status["message"]  # key names only, never a value
    assert client.names(kube.DEPLOYMENT) == []


def test_secrets_the_operator_may_not_read_are_not_checked_and_said_once(
    operator_events: list[tuple[str, str]],
) -> None:
    """403 (the chart's rbac.readSecrets: false): the experiment goes on, the pods' errors remain the check."""
    client = FakeKube()
    client.refuse = lambda method, kind, obj: (
        refusal(403, 'secrets "vllm-key" is forbidden') if kind == kube.SECRET else None
    )
    operator = Operator(client, with_api_key())
    for _ in range(2):  # two ticks in Pending (as while a spec edit's stale children go)
        operator.body["status"] = {"observedGeneration": 1, "phase": "Pending"}
        status = run(operator)
    assert status["phase"] == "Deploying", status
    assert client.names(kube.DEPLOYMENT) == ["exp-control", "exp-treatment"]
    said = [line for line in operator.logged if "not checking that the Secrets" in line]
    assert len(said) == 1, operator.logged
    assert 'secrets "vllm-key" is forbidden' in said[0]
