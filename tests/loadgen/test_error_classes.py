"""Every error class a record can carry (`recording.error_class`) is produced by a real exchange with
the fake server (#23): the classes `test_runner.py` did not reach (a 4xx answer, a request timeout, a
response that is not HTTP), each next to one it could be confused with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode import cli, exit_status
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import runner

from .test_runner import Start, experiment_file, make_spec, read_records, run


def test_4xx_timeouts_and_broken_http_get_their_own_class(fake_server: Start, tmp_path: Path) -> None:
    faults = ("http400", "http500", "stall", "disconnect", "badhttp")
    dataset = tmp_path / "prompts.jsonl"
    lines = [{"prompt": f"fine prompt {i}"} for i in range(3)] + [
        {"prompt": f"FAULT:{f} please"} for f in faults
    ]
    dataset.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    server = fake_server("--step-ms", "1")  # 1 ms steps: a fine request ends well inside the timeout
    plan = plan_mod.plan_from_spec(
        make_spec(
            dataset={"type": "jsonl", "path": str(dataset)},
            requestsPerStage=len(lines),
            stages=[{"name": "c8", "concurrency": 8}],
            requestTimeoutSeconds=2.0,
        ),
        Path(),
    )
    out = tmp_path / "out"
    result = run(plan, {"control": runner.Endpoint(server.url)}, out)
    control = result.summary["stages"][0]["arms"]["control"]
    assert control["ok"] == 3
    assert control["errors"] == {
        "http_4xx": 1,
        "http_5xx": 1,
        "timeout": 1,
        "disconnect": 1,
        "malformed_http": 1,
    }
    classes = {r.prompt_id: r.error_class for r in read_records(out)}
    assert len(classes) == len(lines)
    expected = [None] * 3 + ["http_4xx", "http_5xx", "timeout", "disconnect", "malformed_http"]
    assert [classes[f"prompts.jsonl:{i + 1}"] for i in range(len(lines))] == expected


def test_a_load_where_no_request_succeeded_exits_failed_and_says_it_could_not_measure(
    fake_server: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specdecode loadgen` exits FAILED, not OK, when every request of the measured stages failed
    (mutation benchmark survivor: `ok == 0` -> `ok < 0`); the control: one that succeeds exits OK."""
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"FAULT:http400 {i}"}) + "\n" for i in range(4)))
    experiment = experiment_file(tmp_path, 4, 50.0)
    doc = json.loads(experiment.read_text())
    doc["spec"]["workload"]["dataset"] = {"type": "jsonl", "path": str(dataset)}
    experiment.write_text(json.dumps(doc))
    server = fake_server("--step-ms", "1")
    argv = ["loadgen", "--experiment", str(experiment), "--control-url", server.url]
    argv += ["--treatment-url", server.url, "--quiet"]
    assert cli.main([*argv, "--out", str(tmp_path / "refused")]) == exit_status.FAILED
    assert "no request succeeded" in capsys.readouterr().err
    dataset.write_text("".join(json.dumps({"prompt": f"fine prompt {i}"}) + "\n" for i in range(4)))
    assert cli.main([*argv, "--out", str(tmp_path / "fine")]) == exit_status.OK
