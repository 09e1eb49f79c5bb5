"""Fixtures: simulator processes on loopback, and a real Prometheus server."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Sim:
    """A running `specdecode sim` process."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self, method: str, path: str, body: object | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(
                method, path, body=data, headers={"content-type": "application/json", **(headers or {})}
            )
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post(self, path: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        status, _, data = self.request("POST", path, body, headers)
        return status, (json.loads(data) if data and not data.startswith(b"data:") else data)

    def stream(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[Any]:
        """The SSE events of a streaming request (decoded JSON, or the string "[DONE]")."""
        status, _, data = self.request("POST", path, {**body, "stream": True}, headers)
        assert status == 200, data
        events: list[Any] = []
        for block in data.decode().split("\n\n"):
            if not block:
                continue
            assert block.startswith("data: "), block
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def ground_truth(self, request_id: str | None = None) -> list[dict[str, Any]]:
        q = f"?request_id={request_id}" if request_id else ""
        _, _, data = self.request("GET", "/sim/ground_truth" + q)
        return [json.loads(line) for line in data.splitlines()]

    def metrics(self) -> str:
        _, _, data = self.request("GET", "/metrics")
        return data.decode()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)


def wait_healthy(sim: Sim, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sim.proc.poll() is not None:
            raise AssertionError(f"simulator exited: {sim.log.read_text()}")
        try:
            status, _, _ = sim.request("GET", "/health")
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("simulator did not become healthy")


StartSim = Callable[..., Sim]


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[StartSim]:
    """Start simulators with extra flags; all are stopped (SIGTERM) at teardown."""
    started: list[Sim] = []

    def start(*args: str, wait: bool = True) -> Sim:
        port = free_port()
        log = tmp_path / f"sim-{port}.log"
        argv = [
            sys.executable,
            "-m",
            "specdecode.simulator",
            "Org/Model-8B",
            "--served-model-name",
            "m",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--seed",
            "42",
            "--disable-prefix-caching",
            "--generation-config",
            "vllm",
            *args,
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        sim = Sim(proc, port, log)
        started.append(sim)
        if wait:
            wait_healthy(sim)
        return sim

    yield start
    for sim in started:
        if sim.proc.poll() is None:
            sim.proc.kill()
            sim.proc.wait()


SPEC = '{"method":"draft_model","model":"Org/Draft-1B","num_speculative_tokens":4}'
FAST = ("--decode-step-ms", "1", "--batch-token-ms", "0.01", "--prefill-token-ms", "0.001")


@dataclass
class Prometheus:
    """A running Prometheus server."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, promql: str) -> list[dict[str, Any]]:
        from urllib.parse import urlencode

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/api/v1/query?" + urlencode({"query": promql}))
            body = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


@pytest.fixture
def start_prometheus() -> Iterator[Callable[[list[str]], Prometheus]]:
    """Start a real Prometheus on a free loopback port scraping `targets` every second.

    The one `make k8s-bins` builds for the e2e tests ($SPECDECODE_K8S_BIN_DIR/prometheus), else one on PATH.
    """
    built = Path(os.environ.get("SPECDECODE_K8S_BIN_DIR", "/nonexistent")) / "prometheus"
    binary = str(built) if os.access(built, os.X_OK) else shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not built: run `make test` (or `make k8s-bins`)")
    started: list[Prometheus] = []
    tmp = Path(tempfile.mkdtemp(prefix="prom-"))

    def start(targets: list[str]) -> Prometheus:
        port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: sim\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        )
        argv = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        with (tmp / "prometheus.log").open("wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        prom = Prometheus(proc, port)
        started.append(prom)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                conn.request("GET", "/-/ready")
                if conn.getresponse().status == 200:
                    return prom
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.1)
        raise AssertionError((tmp / "prometheus.log").read_text())

    yield start
    for prom in started:
        prom.proc.send_signal(signal.SIGTERM)
        try:
            prom.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            prom.proc.kill()
            prom.proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
