"""The chart's PodMonitors through a real Prometheus Operator: kube-prometheus-stack's way (issue 21).

kube-prometheus-stack's Prometheus ignores `prometheus.io/*` annotations; it scrapes what its
PodMonitors select. Here the Prometheus Operator (built from its Go module by hack/build-k8s-bins.sh,
with its own CRDs) runs as a process against the test API server and turns a `Prometheus` resource
that selects PodMonitors labelled `release: kps` (as kube-prometheus-stack's does) and the chart's
PodMonitors into a Prometheus configuration, which it writes into the Secret `prometheus-kps`.

In a cluster its config-reloader sidecar hands that file to a Prometheus pod. Here the test does:
it expands the `$(SHARD)` and `$(POD_NAME)` placeholders as the config-reloader does, and runs the
real Prometheus binary on the generated scrape jobs, changing only how discovery reaches the API
server (out of cluster: URL, CA and token instead of the pod's service account). The operator,
configured with the chart's rendered `SPECDECODE_PROM_*` settings (a non-default arm label name), reads
that Prometheus. The experiment completes only if the PodMonitor selected both arms and wrote the
label names the operator queries by: without server-side data it fails with PrometheusNoData.
"""

from __future__ import annotations

import base64
import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_cluster import (
    Cluster,
    Component,
    free_port,
    http_ok,
    start_process,
    stop_process,
    tail,
    wait_for,
    wait_until,
)
from node_agent import NodeAgent
from operator_process import OperatorProcess
from prometheus_server import Prometheus, install_prometheus_operator_crds
from test_chart_dry_run import helm_template
from test_experiment import experiment, load_logs

pytestmark = pytest.mark.e2e

RELEASE_LABEL = {"release": "kps"}  # what kube-prometheus-stack's podMonitorSelector asks for
RELOADER_ENV = {"SHARD": "0", "POD_NAME": "prometheus-kps-0"}  # shard 0 of 1, as the StatefulSet's pod
ARM_LABEL = "sd_arm"  # monitoring.labelNames.arm, not the default: the value must reach both sides


@pytest.fixture
def prometheus_operator(cluster: Cluster, tmp_path: Path) -> Iterator[Component]:
    """The Prometheus Operator with its CRDs, serving every namespace of the test cluster."""
    binary = cluster.bin_dir / "prometheus-operator"
    assert binary.is_file(), f"{binary} is missing: run `make k8s-bins` (hack/build-k8s-bins.sh)"
    install_prometheus_operator_crds(cluster, "podmonitors", "prometheuses")
    port = free_port()
    component = start_process(
        "prometheus-operator",
        [
            "env", f"KUBECONFIG={cluster.kubeconfig}", str(binary),
            f"--web.listen-address=127.0.0.1:{port}", "--log-level=info",
        ],
        tmp_path,
    )  # fmt: skip
    try:
        wait_until(component, lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 60, "healthy (/healthz)")
        yield component
    finally:
        stop_process(component.proc)


def rendered(cluster: Cluster, namespace: str, *args: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(helm_template(cluster, namespace, *args)) if doc]


def generated_jobs(cluster: Cluster, namespace: str, pod_monitor: str) -> list[dict[str, Any]] | None:
    """The scrape jobs in the Prometheus Operator's Secret `prometheus-kps`, once one comes from `pod_monitor`."""
    res = cluster.kubectl("get", "secret", "prometheus-kps", "-n", namespace, "-o", "json", check=False)
    if res.returncode != 0:
        return None
    data = yaml.safe_load(res.stdout).get("data") or {}
    if "prometheus.yaml.gz" not in data:
        return None
    text = gzip.decompress(base64.b64decode(data["prometheus.yaml.gz"])).decode()
    # What its config-reloader sidecar does before Prometheus reads the file: expand $(VAR) from the
    # pod's environment (SHARD: this pod's shard of the targets; POD_NAME: an external label).
    for variable, value in RELOADER_ENV.items():
        text = text.replace(f"$({variable})", value)
    config = yaml.safe_load(text)
    jobs: list[dict[str, Any]] = config.get("scrape_configs") or []
    wanted = f"podMonitor/{namespace}/{pod_monitor}/0"
    return jobs if any(j["job_name"] == wanted for j in jobs) else None


def test_an_experiment_gets_its_data_through_the_charts_pod_monitor_and_the_prometheus_operator(
    cluster: Cluster,
    crd: Path,
    node_agent: NodeAgent,
    namespace: str,
    tmp_path: Path,
    prometheus_operator: Component,
) -> None:
    docs = rendered(
        cluster, namespace,
        "--set=monitoring.podMonitor.enabled=true",
        *(f"--set=monitoring.podMonitor.labels.{k}={v}" for k, v in RELEASE_LABEL.items()),
        "--set=monitoring.podMonitor.interval=1s",
        f"--set=monitoring.labelNames.arm={ARM_LABEL}",
    )  # fmt: skip
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(monitors))
    # kube-prometheus-stack's Prometheus, reduced to what matters here. Its pod never runs (no node
    # matches): this test runs Prometheus itself on the configuration the operator generates.
    kps = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": "kps", "namespace": namespace},
        "spec": {
            "podMonitorSelector": {"matchLabels": RELEASE_LABEL},
            "podMonitorNamespaceSelector": {},
            "scrapeInterval": "1s",
            "nodeSelector": {"specdecode.io/no-such-node": "true"},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(kps))
    jobs = wait_for(
        "the Prometheus Operator's configuration with the arms' PodMonitor",
        lambda: generated_jobs(cluster, namespace, "sdx-specdecode-operator-arms"),
        timeout=90,
        interval=1,
    )
    prom = Prometheus(cluster, workdir=tmp_path / "prometheus", jobs=jobs)
    prom.start()
    # the operator's settings exactly as the chart renders them
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {
        e["name"]: e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    settings = {k: v for k, v in env.items() if k.startswith("SPECDECODE_PROM_")}
    assert settings["SPECDECODE_PROM_ARM_LABEL"] == ARM_LABEL
    operator = OperatorProcess(
        cluster, namespace, tmp_path, env={**settings, "SPECDECODE_PROMETHEUS_URL": prom.url}
    )
    operator.start()
    try:
        operator.apply(experiment("exp", "h200-8b-draft-tiny"))

        def ended() -> dict[str, Any] | None:
            status = operator.status("exp")
            return status if status.get("phase") in ("Completed", "Failed") else None

        status = wait_for("the experiment to end", ended, timeout=240, interval=2)
        # every series of the arms over the run (the arms are gone once it ends)
        query = f'last_over_time(vllm:num_requests_running{{namespace="{namespace}"}}[15m])'
        series = prom.api("/api/v1/query", query=query)["result"]
        detail = (
            f"{status}\nPrometheus targets: {[(t['labels'], t['health'], t.get('lastError')) for t in prom.active_targets()]}\n"
            f"{load_logs(operator, node_agent, 'exp')}\noperator:\n{operator.log_tail()}\n"
            f"prometheus-operator:\n{tail(prometheus_operator.log)}"
        )
        assert status["phase"] == "Completed", detail
        assert status["verdict"] == "Promote", detail
        # both arms' series carry the chart's label names, the pod and the PodMonitor's job
        assert {s["metric"].get(ARM_LABEL) for s in series} == {"control", "treatment"}, series
        assert {s["metric"].get("specdecode_io_experiment") for s in series} == {"exp"}, series
        assert {s["metric"]["job"] for s in series} == {f"{namespace}/sdx-specdecode-operator-arms"}, series
    finally:
        operator.stop()
        prom.stop()
