"""Trace replay end to end: `specdecode run --local` on the simulator replays the built-in `bursty`
trace to both arms on its (scaled) schedule and reaches a verdict (issue 17)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from specdecode import exit_status
from specdecode.loadgen import plan, trace
from tests.local.simulated import ANALYSIS, run_local, simulated


def test_the_bursty_trace_is_replayed_to_both_arms_on_its_scaled_schedule_to_a_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This test checks what is replayed, not whether this shared 2-core machine can pace within the
    # 5 ms schedule-lag budget while it also runs both simulators (tests/loadgen/test_pacing.py
    # checks pacing); with the default budget a burst on a loaded machine failed the run
    # InvalidMeasurement (seen: p99 7.9 and 12.4 ms). The median lag is still asserted below.
    monkeypatch.setattr(plan, "Budgets", functools.partial(plan.Budgets, schedule_lag_p99_ms=100.0))
    document = simulated(
        {
            "dataset": {"type": "trace", "builtin": "bursty"},
            "stages": [{"name": "r3", "rate": 3}],
            "requestsPerStage": 60,
            "warmupRequests": 2,
        },
        seed=7,
        analysis=ANALYSIS,
        deadlines={"deploy": "1m", "run": "5m"},
    )
    code, result, out = run_local(tmp_path, document)
    assert result is not None
    assert result["phase"] == "Completed", result["message"]
    assert result["verdict"] in {"Promote", "Reject", "Inconclusive"}
    assert code in {0, 1}
    [stage] = result["stages"]
    assert stage["name"] == "r3" and stage["verdict"] is not None

    bursty = trace.bursty(7)
    expected = bursty.offsets(60, rate=3.0)
    recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["stage"] == "r3"]
    for arm in ("control", "treatment"):
        mine = sorted((r for r in measured if r["arm"] == arm), key=lambda r: r["index"])
        assert [r["prompt_id"] for r in mine] == [r.prompt_id for r in bursty.records[: len(mine)]]
        # the trace's gaps, scaled to 3 req/s, as the intended send times of this arm
        first = mine[0]["intended"]
        assert [r["intended"] - first for r in mine] == pytest.approx(expected[: len(mine)], abs=1e-6)
        lags = sorted(r["schedule_lag_ms"] for r in mine)
        assert lags[len(lags) // 2] < 5.0
        # each request asked for (and, with ignore_eos, got) its record's output length
        ok = [r for r in mine if r["ok"]]
        assert ok
        assert all(r["completion_tokens"] == bursty.records[r["index"]].output_tokens for r in ok)


def test_a_bad_trace_file_is_refused_with_its_line_before_any_arm_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.jsonl").write_text(
        '{"timestamp": 1, "promptTokens": 5, "outputTokens": 3}\n'
        '{"timestamp": 0.5, "promptTokens": 5, "outputTokens": 3}\n'
    )
    document = simulated(
        {"dataset": {"type": "trace", "path": "t.jsonl"}, "stages": [{"name": "r2", "rate": 2}]},
    )
    code, _, out = run_local(tmp_path, document)
    assert code == exit_status.INVALID
    err = capsys.readouterr().err
    assert f"{tmp_path / 't.jsonl'}:2: 'timestamp' 0.5 is before line 1's 1" in err
    assert "started the control arm" not in err
    assert not (out / "requests.jsonl").exists()
