"""`run --local --control-url` to a server that is not there fails fast (issue #21 item 8): after
the first requests of the warm-up, not after every request of every stage."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from tests.local.test_run_local import result, run, write_experiment


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_unreachable_control_url_fails_as_engine_unreachable_after_the_first_requests(
    tmp_path: Path,
) -> None:
    stages = [{"name": "c4", "concurrency": 4}, {"name": "c8", "concurrency": 8}]
    path = write_experiment(
        tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, stages=stages, requests=400
    )
    out = tmp_path / "out"
    nobody = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    code = run(path, out, "--control-url", nobody, "--treatment-url", nobody)
    assert code == 3
    assert time.monotonic() - started < 30
    status = result(out)
    assert (status["phase"], status["reason"]) == ("Failed", "EngineUnreachable"), status
    assert nobody in status["message"] and "failed to connect" in status["message"]
    assert "--control-url" in status["message"] or "--treatment-url" in status["message"]
    sent = (out / "requests.jsonl").read_text().splitlines() if (out / "requests.jsonl").exists() else []
    # 2 x 802 requests were planned: only the first few went out.
    assert len(sent) <= 20, len(sent)
    assert all(json.loads(line)["error_class"] in ("connect", "cancelled") for line in sent)
