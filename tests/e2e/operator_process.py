"""The operator under test: `specdecode operator` as a real process against the test cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from k8s_cluster import Cluster, free_port, stop_process, tail


class OperatorProcess:
    """Starts, restarts and stops `specdecode operator -n NAMESPACE --standalone`."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        *,
        replica: str = "",
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.log = log_dir / f"operator-{namespace}{'-' + replica if replica else ''}.log"
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "SPECDECODE_INTERVAL": "1",
            "SPECDECODE_UNSCHEDULABLE_GRACE": "3",
            "SPECDECODE_ANALYSIS_GRACE": "10",
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = free_port()
        self.liveness_port = free_port()

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "specdecode",
            "operator",
            "-n",
            self.namespace,
            "--standalone",
            "--log-format",
            "plain",
            f"--metrics-port={self.metrics_port}",
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
        ]
        sink = self.log.open("ab")
        self.process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        sink.close()
        self.starts += 1

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def kill(self) -> None:
        """SIGKILL: no cleanup handler runs (a Lease it holds is not released)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def log_tail(self) -> str:
        return tail(self.log) if self.log.exists() else ""

    # --------------------------------------------------------------------------------- the resource

    def apply(self, document: Mapping[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(document))

    def get(self, kind: str, name: str = "", *selectors: str) -> dict[str, Any]:
        args = [kind, *([name] if name else []), "-n", self.namespace, *selectors]
        return self.cluster.get_json(*args)

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get("sdx", name).get("status") or {})

    def wait(self, what: str, check: Callable[[], Any], timeout: float = 90.0) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"the operator exited ({self.process.returncode}):\n{self.log_tail()}")
            last = check()
            if last:
                return last
            time.sleep(0.3)
        raise AssertionError(
            f"timed out waiting for {what}; last: {last!r}\noperator log:\n{self.log_tail()}"
        )

    def wait_phase(self, name: str, *phases: str, timeout: float = 90.0) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") in phases else None

        result: dict[str, Any] = self.wait(f"{name} in phase {'/'.join(phases)}", reached, timeout)
        return result
