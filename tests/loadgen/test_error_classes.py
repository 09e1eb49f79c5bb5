"""Every error class a record can carry is produced by a real exchange with the fake server (#23):
the classes `test_runner.py` did not reach (a 4xx answer, a request timeout, a response that is
not HTTP), each next to one it could be confused with."""

from __future__ import annotations

import json
from pathlib import Path

from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import runner

from .test_runner import Start, make_spec, read_records, run


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
