"""Every error class a record can carry (`recording.error_class`) is produced by a real exchange with
the fake server (#23): the classes `test_runner.py` did not reach (a 4xx answer, a request timeout, a
response that is not HTTP), each next to one it could be confused with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest

from specdecode import cli, exit_status
from specdecode.experiment import spec
from specdecode.loadgen import http, recording, runner, sse
from specdecode.loadgen import plan as plan_mod
from specdecode.results import format as format_mod

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


def test_engine_data_of_the_wrong_type_is_a_counted_error_that_names_the_field_and_is_stored(
    fake_server: Start, tmp_path: Path
) -> None:
    """`finish_reason` an object, `prompt_tokens` a string, a non-numeric per-request acceptance
    count: each request is a `malformed_sse` error saying which field (#36). Before, the first was a
    record dropped (its pair never judged) and the last an ok record whose count failed the upload."""
    faults = {
        "finishobj": "finish_reason is an object, not a string",
        "promptstr": "usage.prompt_tokens is a string, not a whole count",
        "acceptstr": "metrics.speculative_decoding.num_accepted_draft_tokens is a string, not a whole count",
    }
    dataset = tmp_path / "prompts.jsonl"
    lines = [{"prompt": f"fine prompt {i}"} for i in range(3)] + [{"prompt": f"FAULT:{f} x"} for f in faults]
    dataset.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    server = fake_server("--step-ms", "1", "--tokens-per-step", "1-3")
    plan = plan_mod.plan_from_spec(
        make_spec(
            dataset={"type": "jsonl", "path": str(dataset)},
            requestsPerStage=len(lines),
            requestTimeoutSeconds=2.0,
        ),
        Path(),
    )
    out = tmp_path / "out"
    result = run(
        plan, {"control": runner.Endpoint(server.url), "treatment": runner.Endpoint(server.url)}, out
    )
    for arm in ("control", "treatment"):
        counted = result.summary["stages"][0]["arms"][arm]
        assert (counted["ok"], counted["errors"]) == (3, {"malformed_sse": 3})
    recs = read_records(out)
    assert len(recs) == 2 * len(lines)
    for i, (fault, why) in enumerate(faults.items(), start=4):
        for rec in (r for r in recs if r.prompt_id == f"prompts.jsonl:{i}"):
            assert (rec.ok, rec.error_class) == (False, "malformed_sse"), fault
            assert rec.error is not None and why in rec.error, (fault, rec.error)
    # What the load Job stores reads back whole: every record, the refused ones with their reason.
    stored, _, _, _ = format_mod.parse(format_mod.unpack(format_mod.split(format_mod.encode_dir(out))))
    assert len(stored) == 2 * len(lines)
    assert sum(1 for r in stored if r.error_class == "malformed_sse") == 6


def test_a_record_of_engine_data_no_check_foresaw_is_an_error_record_not_a_lost_one() -> None:
    """The safety net under the stream's checks: a value the record refuses (here a `finish_reason`
    that is not a string, put past the parser) makes an error record with the field, timing kept."""
    sp = plan_mod.plan_from_spec(make_spec(requestsPerStage=1), Path()).stages[0]
    ex = http.Exchange()
    ex.sent = 10.0
    parsed = sse.Stream(token_events=[(10.5, 1)], finish_reason=cast(str, {"type": "length"}), done=True)
    rec = recording.record(sp, 10.0, 0, spec.Arm.CONTROL, "rid-1", ex, 10.0, 0, parsed)
    assert (rec.ok, rec.error_class, rec.request_id, rec.sent) == (False, "malformed_sse", "rid-1", 0.0)
    assert rec.error is not None and "finish_reason" in rec.error
