"""A real Prometheus on loopback that discovers pods through a Kubernetes API server.

The scrape config is the one the project relies on: kubernetes_sd (role pod) against the API
server, keeping pods labelled ``app.kubernetes.io/managed-by=specdecode-operator`` or annotated
``prometheus.io/scrape=true``, scraping ``<podIP>:<prometheus.io/port or 8000><prometheus.io/path
or /metrics>``, with the target labels ``specdecode_io_experiment``, ``specdecode_io_arm``, ``namespace`` and ``pod``
(what the usual ``labelmap`` of ``__meta_kubernetes_pod_label_(.+)`` gives, and what the operator's
settings expect by default).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from k8s_cluster import Cluster, Component, free_port, http_ok, start_process, stop_process, wait_until

#: The scrape job the README gives users for a Prometheus configured by hand.
SCRAPE_CONFIGS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "scrape-configs.yaml"
JOB_NAME = "specdecode-pods"
#: Where hack/build-k8s-bins.sh puts the Prometheus Operator's CRDs, in the bin dir.
PROMETHEUS_OPERATOR_CRDS = "prometheus-operator-crds"


def pod_scrape_job() -> dict[str, Any]:
    """The `specdecode-pods` job of deploy/prometheus/scrape-configs.yaml."""
    jobs = yaml.safe_load(SCRAPE_CONFIGS.read_text())
    job: dict[str, Any] = next(j for j in jobs if j["job_name"] == JOB_NAME)
    return job


def install_prometheus_operator_crds(cluster: Cluster, *plurals: str) -> None:
    """The Prometheus Operator's own CRDs (hack/build-k8s-bins.sh keeps them beside the binaries, from its Go
    module), applied to the cluster; waits until those named by plural (e.g. podmonitors) are Established."""
    crds = cluster.bin_dir / PROMETHEUS_OPERATOR_CRDS
    assert crds.is_dir(), f"{crds} is missing: run `make k8s-bins` (hack/build-k8s-bins.sh)"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds), timeout=120)
    for plural in plurals:
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.monitoring.coreos.com"
        )


class PrometheusMissingError(RuntimeError):
    pass


def find_prometheus(bin_dir: Path) -> str:
    """$SPECDECODE_PROMETHEUS, else the one hack/build-k8s-bins.sh builds.

    Not Debian's: its prometheus package is built without kubernetes_sd_configs.
    """
    path = os.environ.get("SPECDECODE_PROMETHEUS") or str(bin_dir / "prometheus")
    if not os.access(path, os.X_OK):
        raise PrometheusMissingError(
            f"prometheus not found at {path}. Build it with `make k8s-bins` (hack/build-k8s-bins.sh); "
            "`make test` does this."
        )
    return path


def out_of_cluster(job: dict[str, Any], api_url: str, ca_file: Path, token_file: Path) -> dict[str, Any]:
    """`job` with each of its kubernetes_sd_configs pointed at this API server (URL, CA, bearer token)
    instead of the pod's in-cluster service account; everything else (role, namespaces, selectors) kept."""
    sd = [
        {
            **c,
            "api_server": api_url,
            "tls_config": {"ca_file": str(ca_file)},
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
        }
        for c in job.get("kubernetes_sd_configs", [])
    ]
    return {**job, "kubernetes_sd_configs": sd}


def scrape_config(
    api_url: str,
    ca_file: Path,
    token_file: Path,
    interval: str = "1s",
    static: dict[str, str] | None = None,
    jobs: list[dict[str, Any]] | None = None,
) -> str:
    """prometheus.yml (JSON, which is YAML) for pod discovery through the given API server, plus one
    job per entry of ``static`` (job name -> host:port), such as an operator run as a local process.

    The pod job is the one a user copies (deploy/prometheus/scrape-configs.yaml), or ``jobs`` when
    given (such as those the Prometheus Operator generates), pointed at this API server. The static
    jobs honour the scraped labels: the operator's gauges carry their own ``namespace``.
    """
    discovered = jobs if jobs is not None else [pod_scrape_job()]
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": [
            *(out_of_cluster(job, api_url, ca_file, token_file) for job in discovered),
            *(
                {"job_name": job, "honor_labels": True, "static_configs": [{"targets": [target]}]}
                for job, target in (static or {}).items()
            ),
        ],
    }
    return json.dumps(config, indent=1)


@dataclass
class Prometheus:
    """Starts Prometheus for a cluster (needs its API URL, CA and bearer token); stops it by PID."""

    cluster: Cluster
    workdir: Path | None = None
    binary: str = ""
    component: Component | None = None
    url: str = ""
    startup_s: float = 0.0
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    _token_file: Path | None = None
    _static: dict[str, str] = field(default_factory=dict)
    jobs: list[dict[str, Any]] | None = None
    """Discovery jobs in place of deploy/prometheus/scrape-configs.yaml's (see `scrape_config`)."""

    def start(self) -> str:
        c = self.cluster
        self.binary = self.binary or find_prometheus(c.bin_dir)
        if not (c.api_url and c.token and c.ca_file):
            raise RuntimeError("Prometheus discovery needs the cluster's API URL, bearer token and CA file")
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="specdecode-prom-")
            self.workdir = Path(self._tmp.name)
        d = self.workdir
        d.mkdir(parents=True, exist_ok=True)
        token_file = d / "token"
        token_file.write_text(c.token)
        token_file.chmod(0o600)
        self._token_file = token_file
        self._write_config()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        self.component = start_process("prometheus", [
            self.binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", "--log.level=info",
        ], d)  # fmt: skip
        try:
            wait_until(self.component, lambda: http_ok(f"{self.url}/-/ready"), 60, "ready (/-/ready)")
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self.url

    def _write_config(self) -> None:
        c = self.cluster
        assert self.workdir is not None and self._token_file is not None and c.ca_file is not None
        (self.workdir / "prometheus.yml").write_text(
            scrape_config(c.api_url, c.ca_file, self._token_file, static=self._static, jobs=self.jobs)
        )

    def scrape_static(self, job: str, target: str | None) -> None:
        """Adds (or, with None, removes) a static scrape job and reloads the configuration."""
        if target is None:
            self._static.pop(job, None)
        else:
            self._static[job] = target
        self._write_config()
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200, resp.status

    def stop(self) -> None:
        if self.component is not None:
            stop_process(self.component.proc)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as resp:
            body = json.load(resp)
        assert body.get("status") == "success", body
        return body["data"]

    def active_targets(self) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/targets", state="active")["activeTargets"])
