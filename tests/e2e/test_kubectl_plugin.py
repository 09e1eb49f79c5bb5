"""`kubectl specdecode` through the real kubectl's plugin discovery, against the real control plane,
the real operator and pods that really run (node_agent.py), as in test_experiment.py.

kubectl finds `kubectl-specdecode` because the venv's bin directory is on PATH (the package's
console script); the plugin itself calls the same kubectl (first on PATH) with the test's KUBECONFIG.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_gpu_nodes import AGENT_LABEL, AGENT_TOLERATION, GPU_PRODUCT, GPU_TOLERATION
from k8s_cluster import Cluster
from node_agent import NodeAgent
from operator_process import OperatorProcess
from prometheus_server import Prometheus
from tests.factories import SHORT_STAGE_GUARDRAILS

pytestmark = pytest.mark.e2e


def experiment(name: str, stages: list[dict[str, Any]], **analysis: Any) -> dict[str, Any]:
    """The tiny simulated draft of test_experiment.py (its 80 requests at concurrency 1 are promoted)."""
    return {
        "apiVersion": "specdecode.io/v1alpha1",
        "kind": "SpecDecodeExperiment",
        "metadata": {"name": name},
        "spec": {
            "model": "sim/llama-8b",
            "engine": {
                "simulator": {"profile": "h200-8b-draft-tiny"},
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT, AGENT_LABEL: "true"},
                "tolerations": [GPU_TOLERATION, AGENT_TOLERATION],
            },
            "speculative": {"method": "draft_model", "model": "sim/draft", "numSpeculativeTokens": 4},
            "workload": {
                "dataset": {"type": "synthetic", "inputTokens": 64, "outputTokens": 64},
                "sampling": {"maxTokens": 64},
                "stages": stages,
                "requestsPerStage": 80,
                "warmupRequests": 8,
            },
            "analysis": {
                "minSpeedup": 1.05,
                "requireStages": "any",
                "guardrails": {"maxTtftRegression": 10.0, **SHORT_STAGE_GUARDRAILS},
                **analysis,
            },
            "deadlines": {"deploy": "2m", "run": "5m"},
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


def plugin_env(cluster: Cluster) -> dict[str, str]:
    """The real kubectl and the package's console scripts on PATH, the test cluster's kubeconfig."""
    path = os.pathsep.join([str(cluster.bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "KUBECONFIG": str(cluster.kubeconfig)}
    env.pop("KUBECTL", None)
    return env


def kubectl_specdecode(
    cluster: Cluster, *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`kubectl specdecode ARGS` through kubectl's plugin discovery."""
    return subprocess.run(
        [str(cluster.kubectl_path), "specdecode", *args],
        env=plugin_env(cluster),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def test_kubectl_finds_the_plugin_on_path(cluster: Cluster) -> None:
    listed = subprocess.run(
        [str(cluster.kubectl_path), "plugin", "list", "--name-only"],
        env=plugin_env(cluster),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "kubectl-specdecode" in listed.stdout, listed.stdout + listed.stderr


def test_watch_follows_the_stages_to_the_verdict_then_get_and_report_show_it(
    cluster: Cluster, operator: OperatorProcess, node_agent: NodeAgent, tmp_path: Path
) -> None:
    name = "plugin-exp"
    ns = operator.namespace
    stages = [{"name": "c1", "concurrency": 1}, {"name": "c2", "concurrency": 2, "requests": 30}]
    operator.apply(experiment(name, stages))

    watched = kubectl_specdecode(cluster, "watch", name, "-n", ns, "--interval", "0.5", timeout=300)
    status = operator.status(name)
    pods = operator.get("pods", "", "-l", f"specdecode.io/experiment={name}")["items"]
    detail = (
        f"{watched.stdout}{watched.stderr}\n{status}\n"
        + "\n".join(node_agent.pod_log(p, lines=30) for p in pods)
        + f"\noperator:\n{operator.log_tail()}"
    )
    assert watched.returncode == 0, detail
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", detail
    lines = watched.stdout.splitlines()
    known = {"Pending", "Deploying", "Running", "Analyzing", "Completed", "Failed"}
    phases = [line.split()[1] for line in lines if line[:2].isdigit() and line.split()[1] in known]
    # In order (Pending may pass before the first look; a phase's message may change within it).
    assert [p for p in dict.fromkeys(phases) if p != "Pending"] == [
        "Deploying",
        "Running",
        "Analyzing",
        "Completed",
    ], detail
    # The first stage is stored while the second runs: the watch saw it finish during the load.
    assert any("stage c1 measured:" in line and "pairs in" in line for line in lines), detail
    assert not any("stage warmup" in line for line in lines), detail  # warm-up rounds are no stage
    assert "Verdict:     Promote" in lines, detail

    listed = kubectl_specdecode(cluster, "get", "-n", ns)
    assert listed.returncode == 0, listed.stderr
    head, row = listed.stdout.splitlines()
    assert head.split()[:4] == ["NAME", "PHASE", "VERDICT", "REASON"]
    c1 = status["stages"][0]
    assert row.split()[:3] == [name, "Completed", "Promote"]
    assert f"c1 {c1['speedup']['estimate']:.2f}x {c1['verdict']}" in row

    one = kubectl_specdecode(cluster, "get", name, "-n", ns)
    assert one.returncode == 0, one.stderr
    assert "Phase:       Completed" in one.stdout.splitlines()
    assert any(line.split()[:1] == ["c1"] for line in one.stdout.splitlines())

    written = kubectl_specdecode(cluster, "report", name, "-n", ns, cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert f"from ConfigMap {status['resultsRef']['configMap']}" in written.stdout

    # Not writable (a directory in its place, also for root): one line, exit 3.
    (tmp_path / "taken").mkdir()
    refused = kubectl_specdecode(cluster, "report", name, "-n", ns, "-o", str(tmp_path / "taken"))
    assert refused.returncode == 3, refused.stderr
    assert "Traceback" not in refused.stderr and "cannot write the results to" in refused.stderr


def test_abort_ends_a_running_experiment_keeping_its_finished_stage_and_releases_the_gpus(
    cluster: Cluster, operator: OperatorProcess, node_agent: NodeAgent
) -> None:
    name = "plugin-abort"
    ns = operator.namespace
    # c1 is stored after ~30 pairs; "slow" would then run for 5 minutes at one request per second.
    stages = [
        {"name": "c1", "concurrency": 2, "requests": 30},
        {"name": "slow", "rate": 1.0, "requests": 300},
    ]
    operator.apply(experiment(name, stages, sequential=False))
    operator.wait_phase(name, "Running", timeout=150)

    def c1_stored() -> bool:
        found = operator.get("configmaps", "", "-l", f"specdecode.io/results={name}")["items"]
        return bool(found)

    operator.wait("the results of stage c1 stored", c1_stored, timeout=150)
    assert operator.status(name)["phase"] == "Running"

    aborted = kubectl_specdecode(cluster, "abort", name, "-n", ns)
    assert aborted.returncode == 0, aborted.stderr
    assert "abort requested" in aborted.stdout
    status = operator.wait_phase(name, "Completed", "Failed", timeout=60)
    assert (status["phase"], status["reason"]) == ("Failed", "Aborted"), status
    assert status.get("verdict") is None
    assert [s["name"] for s in status.get("stages", [])] == ["c1"], status

    selector = f"specdecode.io/experiment={name}"

    def released() -> bool:
        left = operator.get("deployments,jobs", "", "-l", selector)["items"]
        pods = operator.get("pods", "", "-l", selector)["items"]
        return not left and not pods

    operator.wait("the arms, the load Job and their pods deleted", released, timeout=90)

    again = kubectl_specdecode(cluster, "abort", name, "-n", ns)
    assert again.returncode == 0, again.stderr
    assert "has already ended (Failed)" in again.stdout
    listed = kubectl_specdecode(cluster, "get", "-n", ns)
    assert listed.stdout.splitlines()[1].split()[:4] == [name, "Failed", "-", "Aborted"]


def test_get_and_report_of_a_missing_experiment_say_so_through_kubectl(
    cluster: Cluster, crd: Path, namespace: str
) -> None:
    missing = kubectl_specdecode(cluster, "report", "nope", "-n", namespace)
    assert missing.returncode == 1
    assert "not found" in missing.stderr and "Traceback" not in missing.stderr
    empty = kubectl_specdecode(cluster, "get", "-n", namespace)
    assert empty.returncode == 0 and empty.stdout == ""
    assert f"No experiments found in namespace {namespace}." in empty.stderr
