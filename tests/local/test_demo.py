"""`specdecode demo`, the README's first command, with the JSON view (#23, audit §6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_demo_promotes_the_tiny_draft_at_low_load_and_turns_it_off_above_c4(tmp_path: Path) -> None:
    """What the README promises of `make demo`: speculation wins at concurrency 1 and 4 and loses at
    64, so the verdict is Promote with a recommendation of where to turn it off; the results land in
    --out. `--json`: every line on stdout is a JSON object, the progress events first, the final
    status last (the same as result.json)."""
    out = tmp_path / "demo-out"
    done = subprocess.run(
        [sys.executable, "-m", "specdecode", "demo", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    *events, final = lines
    assert final == json.loads((out / "result.json").read_text())
    assert (out / "report.html").stat().st_size > 0 and (out / "requests.jsonl").stat().st_size > 0

    started = [e["stage"] for e in events if e.get("event") == "StageStarted" and not e["warmup"]]
    assert started == ["c1", "c4", "c16", "c64"]
    finished = {e["stage"] for e in events if e.get("event") == "StageFinished"}
    assert finished >= {"c1", "c4", "c16", "c64"}
    done_events = [e for e in events if e.get("event") == "RequestDone"]
    assert {e["arm"] for e in done_events} == {"control", "treatment"}
    assert all(e["ok"] and e["errorClass"] is None for e in done_events)

    assert (final["phase"], final["verdict"]) == ("Completed", "Promote"), final["message"]
    verdicts = {s["name"]: s["verdict"] for s in final["stages"]}
    assert (verdicts["c1"], verdicts["c4"], verdicts["c64"]) == ("Pass", "Pass", "Fail"), verdicts
    assert final["recommendation"]["beneficialUpTo"] == "c4", final["recommendation"]
