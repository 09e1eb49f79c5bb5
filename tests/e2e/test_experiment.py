"""A full experiment through the real operator, with pods that really run (node_agent.py).

Both arms run `specdecode sim` in their own network namespaces on the node agent's fake GPU nodes,
the load Job runs `specdecode loadgen` against both Services by name and writes its results
ConfigMaps with its ServiceAccount token, Prometheus scrapes both arms through kubernetes_sd, and
the operator decides. The simulator's parameters make the expected verdict certain.
"""

from __future__ import annotations

import base64
import copy
import errno
import gzip
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from html import escape as html_escape
from pathlib import Path
from typing import Any

import pytest
from fake_gpu_nodes import AGENT_GPU_NODE_NAMES, AGENT_LABEL, AGENT_TOLERATION, GPU_PRODUCT, GPU_TOLERATION
from k8s_cluster import Cluster, free_port, wait_for
from node_agent import NodeAgent, TcpRelay, host_path_claim
from operator_process import OperatorProcess
from prometheus_server import Prometheus
from tests.factories import SHORT_STAGE_GUARDRAILS
from tests.grafana import dashboard

from specdecode import results
from specdecode.experiment import search, sequential, simprofiles, validation
from specdecode.experiment import status as experiment_status

pytestmark = pytest.mark.e2e


def experiment(name: str, profile: str, *, engine_args: list[str] | None = None) -> dict[str, Any]:
    """Small and fast: one closed-loop stage at concurrency 1, 80 requests of 64 tokens per arm.

    As in tests/local, the TTFT guardrail is relaxed (the simulated draft model's prefill makes TTFT
    worse, which would reject the tiny draft for another reason than its speed-up), 80 requests
    make the tiny draft's true 1.15x TPOT speed-up show as a lower bound above minSpeedup 1.05, and
    the error and output-match limits are ones 59 clean pairs show (the defaults need 299).
    """
    return {
        "apiVersion": "specdecode.io/v1alpha1",
        "kind": "SpecDecodeExperiment",
        "metadata": {"name": name},
        "spec": {
            "model": "sim/llama-8b",
            "engine": {
                "simulator": {"profile": profile},
                "args": engine_args or [],
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT, AGENT_LABEL: "true"},
                "tolerations": [GPU_TOLERATION, AGENT_TOLERATION],
            },
            "speculative": {"method": "draft_model", "model": "sim/draft", "numSpeculativeTokens": 4},
            "workload": {
                "dataset": {"type": "synthetic", "inputTokens": 64, "outputTokens": 64},
                "sampling": {"maxTokens": 64},
                "stages": [{"name": "c1", "concurrency": 1}],
                "requestsPerStage": 80,
                "warmupRequests": 8,
            },
            "analysis": {
                "minSpeedup": 1.05,
                "requireStages": "any",
                "guardrails": {"maxTtftRegression": 10.0, **SHORT_STAGE_GUARDRAILS},
            },
            "deadlines": {"deploy": "2m", "run": "3m"},
        },
    }


@pytest.fixture
def operator(
    cluster: Cluster,
    crd: Path,
    node_agent: NodeAgent,
    prometheus: Prometheus,
    namespace: str,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(cluster, namespace, tmp_path, env={"SPECDECODE_PROMETHEUS_URL": prometheus.url})
    process.start()
    try:
        yield process
    finally:
        process.stop()


def arms_scraped(prometheus: Prometheus, namespace: str, name: str) -> set[str]:
    """The arms of experiment ``name`` that Prometheus scrapes successfully now (up == 1)."""
    query = f'up{{namespace="{namespace}",specdecode_io_experiment="{name}"}}'
    result = prometheus.api("/api/v1/query", query=query)["result"]
    return {r["metric"].get("specdecode_io_arm", "") for r in result if r["value"][1] == "1"}


def run_to_the_end(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent, name: str, timeout: float = 240
) -> tuple[dict[str, Any], set[str]]:
    """Waits for Completed or Failed, noting which arms Prometheus scraped meanwhile.

    Polls every 2 s (each `kubectl get` costs CPU that the load generator, measuring its own
    event-loop lag on this small machine, would otherwise lose).
    """
    scraped: set[str] = set()
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if operator.process is not None and operator.process.poll() is not None:
            raise AssertionError(
                f"the operator exited ({operator.process.returncode}):\n{operator.log_tail()}"
            )
        scraped.update(arms_scraped(prometheus, operator.namespace, name))
        status = operator.status(name)
        if status.get("phase") in ("Completed", "Failed"):
            return status, scraped
        time.sleep(2)
    targets = [
        (t["labels"].get("pod"), t["health"], t.get("lastError"))
        for t in prometheus.active_targets()
        if t["labels"].get("namespace") == operator.namespace
    ]
    raise AssertionError(
        f"{name} not Completed or Failed after {timeout:.0f} s: {status}\nPrometheus targets: {targets}\n"
        f"{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    )


def assert_the_dashboard_shows(prometheus: Prometheus, namespace: str, name: str, since: float) -> None:
    """Every query of deploy/grafana/specdecode.json (#18), templated on this experiment, returns at
    least one series with a value over the experiment's run: the vLLM metrics of its arms and the
    operator's gauges (scraped from the operator's --metrics-port)."""
    selector = f'namespace="{namespace}",experiment="{name}"'

    def verdict_scraped() -> bool:
        query = f"specdecode_experiment_verdict{{{selector}}} == 1"
        return bool(prometheus.api("/api/v1/query", query=query)["result"])

    wait_for("the operator's verdict gauge scraped", verdict_scraped)
    variables = {"namespace": namespace, "experiment": name}
    # A step past now: the range's last step then sees the newest sample (the verdict's first scrape
    # can be newer than the last whole step before now).
    end = time.time() + 1
    empty = []
    for where, expr in dashboard.queries(dashboard.load()):
        promql = dashboard.substitute(expr, variables)
        result = prometheus.api(
            "/api/v1/query_range", query=promql, start=f"{since:.3f}", end=f"{end:.3f}", step="1s"
        )["result"]
        if not any(value != "NaN" for series in result for _, value in series["values"]):
            empty.append(f"{where}: {promql}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


def report_html(operator: OperatorProcess, name: str) -> str:
    """The report the operator stored in ConfigMap `<name>-report`."""
    data = operator.get("configmap", f"{name}-report")["binaryData"]["report.html.gz"]
    return gzip.decompress(base64.b64decode(data)).decode()


def load_logs(operator: OperatorProcess, node_agent: NodeAgent, name: str) -> str:
    pods = operator.get("pods", "", "-l", f"specdecode.io/experiment={name}")["items"]
    return "\n".join(node_agent.pod_log(p, lines=30) for p in pods)


@pytest.mark.parametrize(
    ("profile", "verdict"),
    [("h200-8b-draft-tiny", "Promote"), ("h200-8b-draft-1b", "Reject")],
    ids=["a tiny draft model is promoted", "a 1b draft model is rejected"],
)
def test_a_simulated_experiment_runs_for_real_and_ends_with_the_verdict_of_its_simulator(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent, profile: str, verdict: str
) -> None:
    # The operator waits until Prometheus scrapes both arms before it starts the load, so no
    # start-up delay is needed for the first stage's counters to be seen.
    name = "exp"
    doc = experiment(name, profile)
    doc["spec"]["analysis"]["confirm"] = True
    job = f"operator-{operator.namespace}"
    prometheus.scrape_static(job, f"127.0.0.1:{operator.metrics_port}")
    started = time.time()
    try:
        operator.apply(doc)
        status, scraped = run_to_the_end(operator, prometheus, node_agent, name, timeout=360)
        if status.get("phase") == "Completed":
            assert_the_dashboard_shows(prometheus, operator.namespace, name, started)
    finally:
        prometheus.scrape_static(job, None)
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed", detail
    assert status["verdict"] == verdict, detail
    assert scraped == {"control", "treatment"}, f"Prometheus scraped {scraped}"
    # analysis.confirm: the tiny draft's recommended schedule (k = 4 up to 4096 running requests) is
    # checked by a round with the treatment re-rendered; the rejected 1b draft has none to check.
    recommendation = status["recommendation"]
    if verdict == "Promote":
        assert recommendation["numSpeculativeTokensPerBatchSize"] == [[1, 4096, 4]], detail
        assert [(r["name"], r["outcome"]) for r in status["rounds"]] == [("Confirmation", "Measured")], detail
        assert (recommendation["confirmationReason"], recommendation.get("confirmed")) == (
            "Confirmed",
            True,
        ), detail
        (confirmed,) = recommendation["confirmation"]
        assert (confirmed["name"], confirmed["k"], confirmed["verdict"]) == ("c1", 4, "Pass"), detail
        assert confirmed["speedup"]["n"] == 80, detail  # the round runs the stage to its bound
    else:
        assert recommendation["confirmationReason"] == "NoSchedule" and "rounds" not in status, detail

    (stage,) = status["stages"]
    assert stage["name"] == "c1"
    assert stage["startedAt"] < stage["finishedAt"], stage  # the dashboard's stage markers (#18)
    assert stage["verdict"] == ("Pass" if verdict == "Promote" else "Fail")
    # The sequential design looks every 10 pairs of this 80-request stage from FIRST_LOOK on: a 2x
    # slower draft is decided at the first look, a 1.15x faster one at that look or later.
    first_look = sequential.planned_looks(80)[0]
    assert first_look == sequential.FIRST_LOOK
    assert stage["control"]["requests"] >= first_look and stage["treatment"]["requests"] >= first_look
    assert stage["control"]["errors"] == 0 and stage["treatment"]["errors"] == 0
    estimate = stage["speedup"]["estimate"]
    assert (estimate > 1.05) if verdict == "Promote" else (estimate < 1.05)
    # The draft's memory cost (#18): each arm's KV cache, read from vllm:cache_config_info through
    # Prometheus; the simulated draft takes its profile's draft_kv_share of the treatment's.
    params = simprofiles.PROFILES[profile]
    arms = status["environment"]["arms"]
    expected = {
        arm: params.kv_capacity_tokens(speculative=arm == "treatment") // 16 * 16
        for arm in ("control", "treatment")
    }
    assert {arm: arms[arm]["kvCacheTokens"] for arm in expected} == expected, arms
    assert expected["treatment"] < expected["control"]
    assert arms["treatment"]["maxConcurrency"] < arms["control"]["maxConcurrency"], arms
    html = report_html(operator, name)
    assert "memory: the draft takes" in html
    # GPU telemetry (#18): this cluster has no DCGM exporter, and the status and the report say so.
    assert stage["gpu"] == {"source": "absent"}, stage
    assert "no DCGM metrics for the arms&#x27; pods" in html

    uid = operator.get("sdx", name)["metadata"]["uid"]
    results = [
        cm
        for cm in operator.get("configmaps")["items"]
        if cm["metadata"]["name"].startswith(f"{name}-results")
    ]
    assert results, "the load Job wrote no results ConfigMap"
    jobs = {j["metadata"]["name"]: j["metadata"]["uid"] for j in operator.get("jobs")["items"]}
    confirmation = f"{name}-results-confirmation-"
    for cm in results:  # owned by the experiment (deleted with it) and by the Job that wrote it (trusted)
        owners = [(o["kind"], o["name"], o["uid"]) for o in cm["metadata"].get("ownerReferences", [])]
        writer = (
            f"{name}-load-confirmation" if cm["metadata"]["name"].startswith(confirmation) else f"{name}-load"
        )
        assert owners == [("SpecDecodeExperiment", name, uid), ("Job", writer, jobs[writer])]
    assert any(cm["metadata"]["name"].startswith(confirmation) for cm in results) is (verdict == "Promote")

    load = operator.get("pods", "", "-l", f"job-name={name}-load")["items"]
    assert [p["status"]["phase"] for p in load] == ["Succeeded"]
    (cs,) = load[0]["status"]["containerStatuses"]
    assert cs["state"]["terminated"]["exitCode"] == 0


def test_a_lossy_treatment_at_the_default_limits_is_never_promoted(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Issue 35 item 2: the treatment's greedy text differs from the control's 5% of the time and its
    decode is faster; at the default minOutputMatch (0.99) and maxErrorRate the 80-request stage cannot
    show them, so the verdict is Reject (a mismatch seen) or Inconclusive (GuardrailUndecided), never
    Promote on the speed-up alone."""
    name = "lossy"
    doc = experiment(name, "h200-8b-draft-tiny")
    # a clear speed win (acceptance 0.9): the speed-up alone would stop the stage at its first look
    doc["spec"]["engine"]["simulator"].update(outputMismatchRate=0.05, acceptanceRate=0.9)
    doc["spec"]["analysis"]["guardrails"] = {"maxTtftRegression": 10.0}
    operator.apply(doc)
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed", detail
    assert status["verdict"] != "Promote", detail
    (stage,) = status["stages"]
    match = next(g for g in stage["guardrails"] if g["name"] == "outputMatch")
    if status["verdict"] == "Reject":
        # the critical outcomes (`guardrails.is_critical`): a mismatch seen, or already surely below
        # (2 of the first 20 differ: the interval's top is 0.987)
        assert status["reason"] == "OutputMismatch", detail
        assert match["outcome"] in {"Breached", "SurelyBreached"}, detail
    else:  # no mismatch among the 80 pairs: outputMatch cannot show 0.99 (299 needed)
        assert status["verdict"] == "Inconclusive", detail
        # GuardrailUndecided when the speed-up passed; InsufficientEvidence if a loaded machine's
        # timing left the speed-up itself undecided too
        assert status["reason"] in {"GuardrailUndecided", "InsufficientEvidence"}, detail
        assert match["outcome"] == "Undecided" and "not yet shown" in match["note"], detail


def test_two_load_pods_send_one_schedule_and_reach_the_verdict_of_one_load_pod_on_the_same_seed(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """`workload.loadPods: 2` (#16): an Indexed Job of two load pods, each sending half of the pairs
    (index mod 2) to both arms, each storing its own results; the operator merges them and judges
    the experiment as it judges the one-pod run of the same spec and seed."""
    verdicts = {}
    for pods in (1, 2):  # both at once (the agent's nodes have GPUs for both)
        doc = experiment(f"pods{pods}", "h200-8b-draft-1b")
        doc["spec"]["workload"]["stages"] = [{"name": "c2", "concurrency": 2}]
        doc["spec"]["workload"]["loadPods"] = pods
        operator.apply(doc)
    for pods in (1, 2):
        name = f"pods{pods}"
        status, _ = run_to_the_end(operator, prometheus, node_agent, name, timeout=360)
        detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
        assert status["phase"] == "Completed", detail
        (stage,) = status["stages"]
        verdicts[pods] = (status["verdict"], stage["name"], stage["verdict"])
        load = operator.get("pods", "", "-l", f"job-name={name}-load")["items"]
        assert sorted(p["status"]["phase"] for p in load) == ["Succeeded"] * pods, detail
        stored = {
            cm["metadata"]["name"]
            for cm in operator.get("configmaps")["items"]
            if cm["metadata"]["name"].startswith(f"{name}-results-")
        }
        if pods == 2:
            job = operator.get("job", f"{name}-load")
            assert (job["spec"]["completionMode"], job["status"]["succeeded"]) == ("Indexed", 2)
            assert {f"{name}-results-pod0-0", f"{name}-results-pod1-0"} <= stored, stored
            # two pods run each stage to its bound (no pod stops on its half alone): all 80 pairs
            assert stage["control"]["requests"] == stage["treatment"]["requests"] == 80, detail
            validity = status["validity"]
            assert [p["pod"] for p in validity["pods"]] == [0, 1] and validity["valid"], validity
        else:
            assert f"{name}-results-0" in stored and not any("-pod" in n for n in stored), stored
    assert verdicts[2] == verdicts[1] == ("Reject", "c2", "Fail"), verdicts


def test_the_arms_gpu_telemetry_from_dcgm_series_is_in_the_status_and_the_report(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """#18: each simulator arm serves the DCGM exporter's series of its GPU (`--dcgm`), labelled with
    its pod and namespace as dcgm-exporter's Kubernetes pod mapping labels them; the operator reads
    them from the real Prometheus over the stage's window into `stages[].gpu` and the report."""
    name = "gpu"
    doc = experiment(name, "h200-8b-draft-1b", engine_args=["--dcgm"])
    doc["spec"]["engine"]["env"] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    operator.apply(doc)
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed" and status["verdict"] == "Reject", detail
    (stage,) = status["stages"]
    gpu = stage["gpu"]
    assert gpu["source"] == "dcgm-exporter", detail
    for arm in ("control", "treatment"):
        figures = gpu[arm]
        assert figures["gpus"] == 1, gpu
        assert 0 < figures["utilizationMean"] <= 100, gpu  # busy for most of a closed-loop stage
        assert figures["memoryUsedMeanMib"] == figures["memoryUsedMaxMib"] == 129393, gpu
        assert 120 < figures["powerMeanWatts"] <= 700, gpu
    html = report_html(operator, name)
    assert "GPU per arm (dcgm-exporter, per GPU)" in html
    assert "no DCGM metrics" not in html


def test_the_break_even_search_runs_its_probes_as_rounds_and_stops_where_the_pure_search_does(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Issue 17: `workload.search` in a cluster. After the stages, each probe is a round of its own
    (its load Job, spec and results; the arms stay as they are) at the load `search.step` chose from
    the probes judged so far; `status.search` is what the pure search gives on those probes, as in
    `run --local`. Cheap: three probes at most (1, 16, then 4 if 16 does not clear), 64 requests
    each (four waves at 16); the steeper compute slope of tests/local's sweep puts c16 below
    break-even."""
    name = "be"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["engine"]["simulator"]["batchTokenMs"] = 0.03
    wanted = {
        "goal": "breakEven",
        "concurrency": {"from": 1, "to": 16},
        "maxProbes": 3,
        "requestsPerProbe": 64,
    }
    doc["spec"]["workload"].update({"requestsPerStage": 24, "search": wanted})
    operator.apply(doc)
    status, _ = run_to_the_end(operator, prometheus, node_agent, name, timeout=420)
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed", detail

    found = status["search"]
    probes = found["probes"]
    assert (found["axis"], found["ran"]) == ("concurrency", True), detail
    assert [(r["name"], r["probe"], r["outcome"]) for r in status["rounds"]] == [
        (p["name"], i, "Measured") for i, p in enumerate(probes, 1)
    ], detail
    assert [p["name"] for p in probes[:2]] == ["search1-c1", "search2-c16"], detail  # the bounds first
    assert all(p["speedup"]["n"] > 0 for p in probes), detail  # each a measured paired stage
    # The pure search over the probes as judged: the same loads in the same order, the same stop.
    spec_ = validation.parse_experiment(doc)[0]
    assert spec_.workload.search is not None
    judged = [
        (r["load"], experiment_status.StageResult.model_validate(p))
        for r, p in zip(status["rounds"], probes, strict=True)
    ]
    for i, (load, _) in enumerate(judged):
        assert search.progress(spec_.workload.search, judged[:i])[0].next_load == load, detail
    step, pure = search.progress(spec_.workload.search, judged)
    assert step.next_load is None, detail
    assert experiment_status.SearchResult.model_validate(found) == pure, detail

    # each probe went from Analyzing straight to its load (the arms deployed once, never again);
    # each probe's results were written by its own Job
    reasons = [
        e["reason"]
        for e in operator.get("events")["items"]
        for _ in range(e.get("count") or 1)
        if e["involvedObject"].get("name") == name
    ]
    assert (reasons.count("Deploying"), reasons.count("SearchProbe")) == (1, len(probes)), reasons
    jobs = {j["metadata"]["name"] for j in operator.get("jobs")["items"]}
    assert {f"{name}-load-{p['name']}" for p in probes} <= jobs, detail
    html = report_html(operator, name)
    assert "Break-even search" in html and html_escape(search.describe(pure)) in html, detail


def test_a_trace_from_a_config_map_is_mounted_into_the_load_job_and_replayed_to_a_verdict(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Issue 17: the load Job reads `workload.dataset: {type: trace, configMap}` from its mount.

    A closed-loop stage sends the trace's requests (its prompt lengths and output lengths) without
    its timing: an open-loop stage on this shared machine risks the 5 ms schedule-lag budget, and
    the replay's timing is covered by tests/local/test_trace_local.py."""
    name = "traced"
    lines = [
        {"timestamp": i * 0.1, "promptTokens": 48 + i, "outputTokens": 64, "sessionId": f"s{i % 3}"}
        for i in range(20)
    ]
    operator.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "traces"},
            "data": {"prod.jsonl": "\n".join(json.dumps(line) for line in lines) + "\n"},
        }
    )
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["workload"]["dataset"] = {
        "type": "trace",
        "configMap": {"name": "traces", "key": "prod.jsonl"},
    }
    operator.apply(doc)
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed", detail
    assert status["verdict"] == "Promote", detail
    (stage,) = status["stages"]
    assert stage["control"]["errors"] == 0 and stage["treatment"]["errors"] == 0, detail


def test_an_engine_that_keeps_crashing_fails_the_experiment_with_crash_loop_back_off(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    name = "crashing"
    operator.apply(experiment(name, "h200-8b-draft-tiny", engine_args=["--no-such-flag"]))
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    assert status["phase"] == "Failed", status
    assert status["reason"] == "CrashLoopBackOff", status
    assert status.get("verdict") is None


@pytest.fixture
def model_cache(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """A PersistentVolumeClaim `hf-models`, bound by the real PV binder to a hostPath volume here.

    Yields the volume's directory on this machine (what a pre-populated cache volume holds).
    """
    host = tmp_path / "volume"
    host.mkdir()
    pv_name = f"{namespace}-hf-models"
    items = host_path_claim(pv_name, "hf-models", namespace, host)
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    try:
        wait_for(
            "the claim bound",
            lambda: (
                cluster.get_json("pvc/hf-models", "-n", namespace).get("status", {}).get("phase") == "Bound"
            ),
        )
        yield host
    finally:
        cluster.kubectl("delete", "pv", pv_name, "--wait=false", "--ignore-not-found", check=False)


def ready_arm_processes(operator: OperatorProcess, node_agent: NodeAgent, name: str) -> dict[str, int] | None:
    """The pid of each arm's engine process once both arms' pods are Ready (the engine has exec'd)."""
    found: dict[str, int] = {}
    for pod in operator.get("pods", "", "-l", f"specdecode.io/experiment={name}")["items"]:
        arm = pod["metadata"]["labels"].get("specdecode.io/arm")
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
        runtime = node_agent.pods.get(pod["metadata"]["uid"])
        proc = runtime.containers[0].proc if runtime is not None else None
        if arm and ready and proc is not None and proc.poll() is None:
            found[arm] = proc.pid
    return found if set(found) == {"control", "treatment"} else None


def environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only offline"])
def test_both_arms_see_the_same_model_cache(
    cluster: Cluster,
    operator: OperatorProcess,
    node_agent: NodeAgent,
    model_cache: Path,
    read_only: bool,
) -> None:
    """Each arm's engine process, in its own mount namespace, sees the claim's volume at /models as
    HF_HOME: a file put into the volume beforehand, and (read-write) a file written by one arm and
    read by the other. `/proc/PID/root` is the process's own view of the file system. The Hub token
    reaches both arms' environment from its Secret, never their command line."""
    name = "cached"
    token = secrets.token_hex(8)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-token"},
        "stringData": {"t": token},
    }
    operator.apply(secret)
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["engine"]["modelCache"] = {"claimName": "hf-models", "subPath": "hf", "readOnly": read_only}
    doc["spec"]["engine"]["offline"] = read_only
    doc["spec"]["engine"]["hfTokenSecret"] = {"name": "hf-token", "key": "t"}
    snapshot = Path("hub/models--sim--llama-8b/snapshots/0")  # where `hf download` would put it
    (model_cache / "hf" / snapshot).mkdir(parents=True)
    (model_cache / "hf" / snapshot / "config.json").write_text('{"from": "the volume"}')
    operator.apply(doc)
    pids = operator.wait(
        "both arms Ready", lambda: ready_arm_processes(operator, node_agent, name), timeout=120
    )
    roots = {arm: Path(f"/proc/{pid}/root") for arm, pid in pids.items()}
    for arm, pid in pids.items():
        env = environ(pid)
        assert (env["HF_HOME"], env["HF_HUB_CACHE"]) == ("/models", "/models/hub"), arm
        assert env["HF_TOKEN"] == token, arm
        assert token not in Path(f"/proc/{pid}/cmdline").read_text(), arm
        assert (env.get("HF_HUB_OFFLINE"), env.get("TRANSFORMERS_OFFLINE")) == (
            ("1", "1") if read_only else (None, None)
        ), arm
        assert (roots[arm] / "models" / snapshot / "config.json").read_text() == '{"from": "the volume"}', arm
    if read_only:
        for arm, root in roots.items():
            with pytest.raises(OSError) as refused:
                (root / "models" / "hub" / "written").write_text(arm)
            assert refused.value.errno == errno.EROFS, arm
    else:
        (roots["control"] / "models" / "hub" / "written-by-control").write_text("control")
        assert (roots["treatment"] / "models" / "hub" / "written-by-control").read_text() == "control"
        assert (model_cache / "hf" / "hub" / "written-by-control").read_text() == "control"
    cluster.kubectl("delete", "sdx", name, "-n", operator.namespace, "--wait=false")


def test_a_model_cache_claim_that_does_not_exist_fails_the_experiment_unschedulable_naming_it(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    name = "no-claim"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["engine"]["modelCache"] = {"claimName": "no-such-claim"}
    operator.apply(doc)
    status, _ = run_to_the_end(operator, prometheus, node_agent, name, timeout=90)
    assert (status["phase"], status["reason"]) == ("Failed", "Unschedulable"), status
    assert 'persistentvolumeclaim "no-such-claim" not found' in status["message"], status


def test_an_operator_restarted_during_the_load_resumes_to_the_same_verdict_without_duplicates(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    operator.apply(experiment("exp", "h200-8b-draft-tiny"))
    operator.wait_phase("exp", "Running", timeout=120)
    job_uid = operator.wait("the load Job", lambda: operator.get("job", "exp-load")["metadata"]["uid"])
    arms = {
        d["metadata"]["name"]: d["metadata"]["uid"]
        for d in operator.get("deployments", "", "-l", "specdecode.io/experiment=exp")["items"]
    }
    operator.stop()  # all state is in status and in the children: nothing is lost with the process
    operator.start()
    status, _ = run_to_the_end(operator, prometheus, node_agent, "exp")
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", status
    jobs = operator.get("jobs", "", "-l", "specdecode.io/experiment=exp")["items"]
    assert [j["metadata"]["uid"] for j in jobs] == [job_uid]
    assert len(operator.get("pods", "", "-l", "job-name=exp-load")["items"]) == 1
    assert len(arms) == 2  # (the arms themselves are deleted by the cleanup policy once Completed)


def test_a_load_job_killed_mid_run_keeps_the_stages_it_finished(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """The load Job stores its results after every stage: SIGKILL during the second stage (no
    chance to clean up) still leaves the first one in status.stages and the report."""
    name = "killed"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["workload"]["stages"] = [{"name": "c1", "concurrency": 1}, {"name": "c2", "concurrency": 1}]
    doc["spec"]["analysis"]["sequential"] = False  # every stage runs its 80 requests: a wide window
    operator.apply(doc)
    operator.wait_phase(name, "Running", timeout=120)
    operator.wait(
        "the results of stage c1",
        lambda: any(
            cm["metadata"]["name"].startswith(f"{name}-results") for cm in operator.get("configmaps")["items"]
        ),
        timeout=120,
    )
    # The load generator this test's node agent started (never a pattern that another run's matches).
    (load_pod,) = operator.get("pods", "", "-l", f"job-name={name}-load")["items"]
    runtime = node_agent.pods[load_pod["metadata"]["uid"]]
    (container,) = runtime.containers
    assert container.proc is not None and container.proc.poll() is None, "no load generator process to kill"
    os.killpg(container.proc.pid, signal.SIGKILL)  # the container: its own process group
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Failed" and status["reason"] == "LoadJobFailed", detail
    assert status.get("verdict") is None, detail
    assert [s["name"] for s in status.get("stages", [])] == ["c1"], detail
    (c1,) = status["stages"]
    assert c1["control"]["requests"] == 80 and c1["treatment"]["requests"] == 80, detail
    assert c1["speedup"]["estimate"] > 1.0, detail
    assert "the 1 of 2 stage(s) measured before that (c1)" in status["message"], detail
    assert status["resultsRef"]["configMap"] == f"{name}-report", detail
    report = operator.get("configmap", f"{name}-report")
    assert "report.html.gz" in report["binaryData"]


def test_a_workload_edited_while_deploying_is_the_workload_measured(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """`kubectl edit` of the workload restarts the experiment: the new generation's load reads the
    new generation's `<exp>-spec` (not the old one, kept by create-if-absent), and the results
    the verdict is computed from are that load's."""
    name = "edited"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["workload"]["requestsPerStage"] = 24
    doc["spec"]["analysis"]["sequential"] = False  # every stage runs all its requests: countable
    operator.apply(doc)
    operator.wait_phase(name, "Deploying", timeout=60)
    edited = copy.deepcopy(doc)
    edited["spec"]["workload"]["requestsPerStage"] = 40
    operator.apply(edited)
    operator.wait("generation 2", lambda: operator.status(name).get("observedGeneration") == 2)
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed" and status["observedGeneration"] == 2, detail
    (stage,) = status["stages"]
    assert stage["control"]["requests"] == 40 and stage["treatment"]["requests"] == 40, detail
    spec_map = operator.get("configmap", f"{name}-spec")
    assert spec_map["metadata"]["annotations"]["specdecode.io/generation"] == "2"
    results = [
        cm
        for cm in operator.get("configmaps")["items"]
        if cm["metadata"]["name"].startswith(f"{name}-results")
    ]
    assert results and {cm["metadata"]["annotations"]["specdecode.io/generation"] for cm in results} == {"2"}
    uid = operator.get("sdx", name)["metadata"]["uid"]
    report = operator.get("configmap", f"{name}-report")  # deleted with the experiment, not orphaned
    assert [o["uid"] for o in report["metadata"]["ownerReferences"]] == [uid]


def start_disruptable_run(operator: OperatorProcess, name: str) -> str:
    """An experiment in Running with its load pod running (all 80 requests: the load goes on a
    while); returns the selector of its treatment arm's pod."""
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["analysis"]["sequential"] = False
    operator.apply(doc)
    operator.wait_phase(name, "Running", timeout=120)
    operator.wait(
        "the load pod running",
        lambda: (
            [
                p["status"].get("phase")
                for p in operator.get("pods", "", "-l", f"job-name={name}-load")["items"]
            ]
            == ["Running"]
        ),
        timeout=60,
    )
    return f"specdecode.io/experiment={name},specdecode.io/arm=treatment"


def test_an_arm_pod_lost_during_the_load_fails_without_a_verdict(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """A pod deleted (or preempted, or evicted by the kubelet) mid-run: its replacement is a cold arm
    and the requests in flight fail on one side only. That measured a half-dead arm, so no verdict."""
    name = "disrupted"
    arm = start_disruptable_run(operator, name)
    operator.cluster.kubectl("delete", "pod", "-n", operator.namespace, "--wait=false", "-l", arm)
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\noperator:\n{operator.log_tail()}"
    assert (status["phase"], status["reason"]) == ("Failed", "ArmDisrupted"), detail
    assert "treatment arm pod" in status["message"], detail
    assert status.get("verdict") is None, detail
    operator.wait("the arms deleted (cleanup: Always)", lambda: operator.get("deployments")["items"] == [])


def test_an_eviction_of_an_arm_is_refused_while_the_experiment_runs_and_allowed_after_it(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """The Eviction API (what `kubectl drain` and the cluster autoscaler call) meets the arms'
    PodDisruptionBudget `<exp>-arms`: the run goes on undisturbed to its verdict, and the budget
    goes with the experiment's end (cleanup: Never keeps the arms, now evictable)."""
    name = "drained"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["cleanup"] = "Never"
    operator.apply(doc)
    operator.wait_phase(name, "Running", timeout=120)
    (pod,) = operator.get("pods", "", "-l", f"specdecode.io/experiment={name},specdecode.io/arm=treatment")[
        "items"
    ]
    pod_name = pod["metadata"]["name"]
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod_name}}
    path = f"/api/v1/namespaces/{operator.namespace}/pods/{pod_name}/eviction"

    def evict() -> subprocess.CompletedProcess[str]:
        return operator.cluster.kubectl(
            "create", "--raw", path, "-f", "-", input=json.dumps(eviction), check=False
        )

    refused = evict()
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", detail
    assert operator.get("pdb")["items"] == []
    allowed = evict()
    assert allowed.returncode == 0, allowed


def test_a_forged_results_config_map_changes_nothing(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Anyone who may create ConfigMaps can label one for the experiment as its only results part:
    the operator never reads it (nor one forged under the right name: tests/controller)."""
    name = "exp"
    forged = results.build_config_maps(
        "zz-forged", name, results.pack_legacy({"requests.jsonl": "FORGED"}), generation=1
    )[0]
    operator.cluster.kubectl("apply", "-n", operator.namespace, "-f", "-", input=json.dumps(forged))
    operator.apply(experiment(name, "h200-8b-draft-tiny"))
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", detail


def test_an_experiment_deleted_during_the_load_leaves_nothing_behind(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Arms, load, spec, results and report all go with it: no GPU held, nothing orphaned."""
    name = "deleted"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["workload"]["stages"] = [{"name": "c1", "concurrency": 1}, {"name": "c2", "concurrency": 1}]
    doc["spec"]["analysis"]["sequential"] = False
    operator.apply(doc)
    operator.wait_phase(name, "Running", timeout=120)
    operator.wait(
        "the results of stage c1",
        lambda: any(
            cm["metadata"]["name"] == f"{name}-results-0" for cm in operator.get("configmaps")["items"]
        ),
        timeout=120,
    )
    operator.cluster.kubectl("delete", "sdx", name, "-n", operator.namespace, "--wait=false")
    selector = f"specdecode.io/experiment={name}"

    def gone() -> bool:
        left = [
            operator.get(kind, "", "-l", selector)["items"]
            for kind in ("deployments", "jobs", "pods", "configmaps", "services", "networkpolicies", "pdb")
        ]
        return not any(left) and not operator.get("sdx")["items"]

    operator.wait("every child of the experiment deleted", gone, timeout=120)


def test_a_simulated_experiment_completes_in_a_namespace_enforcing_pod_security_restricted(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """The simulator arms and the load Job meet `restricted` (real vLLM arms do not: test_operator)."""
    operator.cluster.kubectl(
        "label", "namespace", operator.namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    name = "restricted"
    operator.apply(experiment(name, "h200-8b-draft-tiny"))
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", detail


def test_a_neutral_treatment_on_a_slower_node_is_flagged_and_the_crossover_swaps_it_out_of_a_promote(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Issue 22: speculation made neutral (nothing accepted, drafts free, k = 1), the arms forced onto
    different nodes (5 GPUs each, 8 per node), one node 10% slower: whichever arm lands there, the
    placement is measured as a 1.1x speed-up or slow-down, the status says where each arm ran, and
    the crossover swaps the arms' nodes, measures the placement effect and never promotes."""
    name = "placed"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["engine"]["simulator"].update(
        {"acceptanceRate": 0.0, "draftCostRatio": 0.0, "draftFixedMs": 0.0}
    )
    doc["spec"]["engine"]["resources"] = {"limits": {"nvidia.com/gpu": 5}}
    doc["spec"]["speculative"]["numSpeculativeTokens"] = 1
    doc["spec"]["analysis"] = {**doc["spec"].get("analysis", {}), "crossover": "IfApart"}
    slow = AGENT_GPU_NODE_NAMES[1]
    node_agent.node_env[slow] = {"SPECDECODE_SIM_SPEED_FACTOR": "1.1"}
    try:
        operator.apply(doc)
        status, _ = run_to_the_end(operator, prometheus, node_agent, name, timeout=420)
    finally:
        del node_agent.node_env[slow]
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed", detail
    env = status["environment"]
    nodes = {arm: env["arms"][arm]["node"] for arm in ("control", "treatment")}
    assert sorted(nodes.values()) == sorted(AGENT_GPU_NODE_NAMES), detail
    assert env["hostDifferences"] == ["node"], detail
    events = [e for e in operator.get("events")["items"] if e.get("reason") == "PlacementDiffers"]
    assert events and events[0]["type"] == "Warning", detail
    assert f"node: {nodes['control']} (control) vs {nodes['treatment']} (treatment)" in events[0]["message"]
    # The placement alone: 1.1x when the control got the slow node, 1/1.1 when the treatment did.
    placement_effect = 1.1 if nodes["control"] == slow else 1 / 1.1
    assert status["stages"][0]["speedup"]["estimate"] == pytest.approx(placement_effect, rel=0.04), detail
    # The crossover (IfApart, the arms apart): both arms start again on each other's node for half
    # the requests, and the two rounds separate the placement from the speculation.
    crossover = status["crossover"]
    assert (crossover["mode"], crossover["ran"]) == ("IfApart", True), detail
    assert crossover["rounds"] == [nodes, {"control": nodes["treatment"], "treatment": nodes["control"]}], (
        detail
    )
    assert [(r["name"], r["outcome"]) for r in status["rounds"]] == [("Crossover", "Measured")], detail
    # Had the arms not really moved, both rounds would measure the same and the effect would be 1.
    assert crossover["effects"]["c1"] == pytest.approx(placement_effect, rel=0.04), detail
    placed = status["stages"][0]["placement"]
    assert placed["speedup"] == pytest.approx(1.0, abs=0.04), detail  # speculation made neutral
    assert status["verdict"] != "Promote", detail
    if nodes["control"] == slow:  # measured 1.1x > minSpeedup 1.05: the pass the placement made is withheld
        assert (status["verdict"], status["reason"], crossover["demoted"]) == (
            "Inconclusive",
            "PlacementEffect",
            ["c1"],
        ), detail
    else:
        assert (status["verdict"], crossover["demoted"]) == ("Reject", []), detail


def test_a_win_measured_with_the_arms_on_different_nodes_is_not_promoted_without_a_crossover(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Issue 35 item 3: the arms forced onto different nodes (5 GPUs each, 8 per node), the crossover
    Off (the default): the stage passes on its interval, but nothing separated the nodes from the
    speed-up, so the run ends Inconclusive `PlacementUnseparated`, saying how to get a decision."""
    name = "apart"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["engine"]["resources"] = {"limits": {"nvidia.com/gpu": 5}}
    operator.apply(doc)
    status, _ = run_to_the_end(operator, prometheus, node_agent, name)
    detail = f"{status}\n{load_logs(operator, node_agent, name)}\noperator:\n{operator.log_tail()}"
    assert status["phase"] == "Completed", detail
    env = status["environment"]
    nodes = {arm: env["arms"][arm]["node"] for arm in ("control", "treatment")}
    assert sorted(nodes.values()) == sorted(AGENT_GPU_NODE_NAMES) and env["hostDifferences"] == ["node"], (
        detail
    )
    stage = status["stages"][0]
    assert stage["speedup"]["ciLow"] >= 1.05, detail  # the interval alone would have promoted it
    assert (status["verdict"], status["reason"]) == ("Inconclusive", "PlacementUnseparated"), detail
    assert (stage["verdict"], stage["code"]) == ("Inconclusive", "PlacementUnseparated"), detail
    assert status["message"].startswith(
        f"not promoted: the arms ran on different hosts (node: {nodes['control']} (control) vs "
        f"{nodes['treatment']} (treatment))"
    ), detail
    assert "to decide, run the crossover (spec.analysis.crossover: IfApart) or co-locate" in status["message"]
    assert "crossover" not in status, detail


def test_of_two_operator_replicas_only_the_lease_holder_acts_and_the_other_finishes_when_it_dies(
    cluster: Cluster, crd: Path, node_agent: NodeAgent, prometheus: Prometheus, namespace: str, tmp_path: Path
) -> None:
    """Leader election (controller/lease.py): short timings so the standby takes over within ~6 s."""
    env = {
        "SPECDECODE_PROMETHEUS_URL": prometheus.url,
        "SPECDECODE_LEADER_ELECTION": "true",
        "SPECDECODE_LEADER_ELECTION_NAMESPACE": namespace,
        "SPECDECODE_LEASE_DURATION": "6",
        "SPECDECODE_RENEW_DEADLINE": "4",
        "SPECDECODE_RETRY_PERIOD": "1",
    }
    replicas = {
        name: OperatorProcess(
            cluster, namespace, tmp_path, {**env, "SPECDECODE_LEADER_ELECTION_IDENTITY": name}, replica=name
        )
        for name in ("a", "b")
    }
    try:
        for replica in replicas.values():
            replica.start()
        first = replicas["a"]

        def holder() -> str:
            leases = cluster.get_json("leases", "-n", namespace)["items"]
            held = [(x.get("spec") or {}).get("holderIdentity") for x in leases]
            return str(held[0] or "") if held else ""

        leader_name = first.wait("a replica holding the Lease", holder)
        leader = replicas[leader_name]
        standby = next(r for n, r in replicas.items() if n != leader_name)
        leader.apply(experiment("exp", "h200-8b-draft-tiny"))
        leader.wait_phase("exp", "Running", timeout=120)
        # Each phase change is logged by the replica that made it ("Accepted: generation 1: ...").
        assert "Accepted: generation 1" in leader.log.read_text()
        assert "generation 1" not in standby.log.read_text(), standby.log_tail()
        job_uid = leader.get("job", "exp-load")["metadata"]["uid"]
        leader.kill()  # no release: the standby must wait out the lease duration
        status, _ = run_to_the_end(standby, prometheus, node_agent, "exp")
        assert status["phase"] == "Completed" and status["verdict"] == "Promote", status
        assert holder() == next(n for n in replicas if n != leader_name)
        assert "Promote (" in standby.log.read_text(), standby.log_tail()
        jobs = standby.get("jobs", "", "-l", "specdecode.io/experiment=exp")["items"]
        assert [j["metadata"]["uid"] for j in jobs] == [job_uid]
    finally:
        for replica in replicas.values():
            replica.stop()


def test_an_operator_killed_while_pending_is_restarted_and_finishes_the_experiment(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Pending lasts one tick unless something holds it: a foreign `<exp>-spec` keeps it retrying."""
    foreign = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "exp-spec"}, "data": {"a": "b"}}
    operator.apply(foreign)
    operator.apply(experiment("exp", "h200-8b-draft-tiny"))

    def retrying() -> dict[str, Any] | None:
        status = operator.status("exp")
        return status if "is not this experiment's" in str(status.get("message")) else None

    assert operator.wait("the experiment retrying in Pending", retrying)["phase"] == "Pending"
    operator.kill()
    operator.cluster.kubectl("delete", "configmap", "exp-spec", "-n", operator.namespace)
    assert operator.status("exp")["phase"] == "Pending"
    operator.start()
    status, _ = run_to_the_end(operator, prometheus, node_agent, "exp")
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", status
    assert len(operator.get("jobs", "", "-l", "specdecode.io/experiment=exp")["items"]) == 1


def test_an_operator_killed_while_analyzing_is_restarted_and_finishes_with_the_verdict(
    operator: OperatorProcess, prometheus: Prometheus, node_agent: NodeAgent
) -> None:
    """Analyzing lasts one tick unless Prometheus is away: the operator that takes over from Running
    gets a Prometheus URL where nothing listens, so it retries in Analyzing until it is killed."""
    operator.env["SPECDECODE_ANALYSIS_GRACE"] = "300"
    operator.apply(experiment("exp", "h200-8b-draft-tiny"))
    operator.wait_phase("exp", "Running", timeout=120)
    operator.stop()
    operator.env["SPECDECODE_PROMETHEUS_URL"] = f"http://127.0.0.1:{free_port()}"
    operator.start()

    def retrying() -> dict[str, Any] | None:
        status = operator.status("exp")
        analyzing = status.get("phase") == "Analyzing" and "retrying" in str(status.get("message"))
        return status if analyzing else None

    operator.wait("the experiment retrying in Analyzing", retrying, timeout=120)
    operator.kill()
    operator.env["SPECDECODE_PROMETHEUS_URL"] = prometheus.url
    operator.start()
    status, _ = run_to_the_end(operator, prometheus, node_agent, "exp")
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", status
    assert len(operator.get("jobs", "", "-l", "specdecode.io/experiment=exp")["items"]) == 1


def test_the_chart_installed_in_a_restricted_namespace_runs_a_simulated_experiment_to_its_verdict(
    cluster: Cluster, crd: Path, node_agent: NodeAgent, prometheus: Prometheus, namespace: str, tmp_path: Path
) -> None:
    """`helm install` into a namespace enforcing Pod Security `restricted`: the operator's own pod
    (run by the node agent on agent-cpu-0, in-cluster credentials, leader election on) is admitted,
    and so are the simulator arms and the load Job; the experiment ends Completed with its verdict.
    Prometheus listens on the host's loopback, so the pod reaches it through a relay on the bridge."""
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    prometheus_port = int(prometheus.url.rsplit(":", 1)[1])
    relay = TcpRelay((node_agent.gateway, prometheus_port), ("127.0.0.1", prometheus_port))
    relay.start()
    release = "psa"
    helm = [str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}", "-n", namespace]
    extra_env = [
        {"name": "SPECDECODE_INTERVAL", "value": "1"},
        {"name": "SPECDECODE_ANALYSIS_GRACE", "value": "30"},
    ]
    install = [
        *helm,
        "install",
        release,
        str(Path(__file__).resolve().parents[2] / "charts" / "specdecode-operator"),
        "--skip-crds",
        f"--set=watchNamespaces={{{namespace}}}",
        f"--set=operator.prometheusUrl=http://{node_agent.gateway}:{prometheus_port}",
        "--set=nodeSelector.kubernetes\\.io/hostname=agent-cpu-0",
        "--set=operator.logFormat=plain",
        "--set=metrics.podAnnotations=false",
        f"--set-json=operator.extraEnv={json.dumps(extra_env)}",
    ]
    view = OperatorProcess(cluster, namespace, tmp_path)  # kubectl helpers only: no process of its own
    try:
        subprocess.run(install, check=True, capture_output=True, text=True, timeout=120)
        selector = "app.kubernetes.io/name=specdecode-operator"

        def operator_pods() -> list[dict[str, Any]]:
            return list(view.get("pods", "", "-l", selector)["items"])

        def detail() -> str:
            return "\n".join(node_agent.pod_log(p) for p in operator_pods())

        view.apply(experiment("exp", "h200-8b-draft-tiny"))
        try:
            status, _ = run_to_the_end(view, prometheus, node_agent, "exp")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator pod:\n{detail()}") from None
        assert status["phase"] == "Completed" and status["verdict"] == "Promote", f"{status}\n{detail()}"
        (pod,) = operator_pods()
        lease = view.get("lease", f"{release}-specdecode-operator-leader")
        assert lease["spec"]["holderIdentity"] == pod["metadata"]["name"]
    finally:
        subprocess.run([*helm, "uninstall", release, "--wait", "--timeout=60s"], check=False, timeout=90)
        relay.stop()


@pytest.mark.parametrize("fairness", ["Warn", "Fail"])
def test_an_arm_edited_before_it_is_ready_is_named_as_a_difference_between_the_arms(
    cluster: Cluster,
    crd: Path,
    node_agent: NodeAgent,
    prometheus: Prometheus,
    namespace: str,
    tmp_path: Path,
    fairness: str,
) -> None:
    """Issue 18: the treatment's Deployment gets an extra env var while both arms are held
    Unschedulable (a node selector no node matches, which both Deployments then drop alike). Warn:
    the load runs to its verdict, with the difference in status, condition ArmsDiffer and a Warning
    event; Fail: Failed ArmsDiffer before any load."""
    hold = "specdecode.io/e2e-hold"
    env = {"SPECDECODE_PROMETHEUS_URL": prometheus.url, "SPECDECODE_UNSCHEDULABLE_GRACE": "120"}
    process = OperatorProcess(cluster, namespace, tmp_path, env)
    name = "unfair"
    doc = experiment(name, "h200-8b-draft-tiny")
    doc["spec"]["engine"]["nodeSelector"][hold] = "held"
    doc["spec"]["analysis"]["fairness"] = fairness
    process.start()
    try:
        process.apply(doc)
        arms = [f"{name}-control", f"{name}-treatment"]
        process.wait(
            "both arms' Deployments",
            lambda: sorted(d["metadata"]["name"] for d in process.get("deployments")["items"]) == arms,
        )
        extra = {"containers": [{"name": "engine", "env": [{"name": "EXTRA", "value": "1"}]}]}
        cluster.kubectl(
            "patch", "deployment", f"{name}-treatment", "-n", namespace,
            "-p", json.dumps({"spec": {"template": {"spec": extra}}}),
        )  # fmt: skip
        release = {"spec": {"template": {"spec": {"nodeSelector": {hold: None}}}}}
        for deployment in arms:
            cluster.kubectl("patch", "deployment", deployment, "-n", namespace, "-p", json.dumps(release))
        if fairness == "Warn":
            status, _ = run_to_the_end(process, prometheus, node_agent, name)
        else:
            status = process.wait_phase(name, "Running", "Completed", "Failed", timeout=120)
        detail = f"{status}\noperator:\n{process.log_tail()}"
        assert status["armDifferences"] == [{"field": "env.EXTRA", "treatment": "1"}], detail
        differ = next(c for c in status["conditions"] if c["type"] == "ArmsDiffer")
        assert (differ["status"], differ["message"]) == (
            "True",
            "env.EXTRA: absent (control) vs 1 (treatment)",
        )
        if fairness == "Warn":
            assert status["phase"] == "Completed" and status["verdict"] == "Promote", detail
            events = [e for e in process.get("events")["items"] if e.get("reason") == "ArmsDiffer"]
            assert events and events[0]["type"] == "Warning", detail
            assert "env.EXTRA: absent (control) vs 1 (treatment)" in events[0]["message"], detail
        else:
            assert (status["phase"], status["reason"]) == ("Failed", "ArmsDiffer"), detail
            assert "env.EXTRA: absent (control) vs 1 (treatment)" in status["message"], detail
            assert status.get("startedAt") is None, detail
            assert process.get("jobs")["items"] == [], detail  # no load
            process.wait(
                "the arms deleted (cleanup: Always)", lambda: process.get("deployments")["items"] == []
            )
    finally:
        process.stop()
