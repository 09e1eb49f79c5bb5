"""A real-text built-in dataset end to end: `specdecode run --local` on the simulator sends the shipped
`real-mixed` prompts to both arms and reports speed-up and acceptance per category (issue 17)."""

from __future__ import annotations

import json
from pathlib import Path

from specdecode.loadgen import workload
from tests.local.simulated import run_completed


def test_the_real_mixed_dataset_gives_a_verdict_and_one_row_per_category(tmp_path: Path) -> None:
    result, out = run_completed(
        tmp_path,
        {
            "dataset": {"type": "builtin", "name": "real-mixed"},
            "stages": [{"name": "c8", "concurrency": 8}],
            "requestsPerStage": 48,
            "warmupRequests": 8,
        },
        seed=3,
    )
    [stage] = result["stages"]
    rows = {c["name"]: c for c in stage["categories"]}
    assert set(rows) == {"chat", "code", "math", "summarisation"}
    assert sum(c["pairs"] for c in rows.values()) == stage["speedup"]["n"] == 48
    for row in rows.values():
        assert row["pairs"] >= 3 and row["speedup"] is not None and row["acceptanceRate"] is not None

    # both arms got the shipped prompts, each request labelled with its line's category
    shipped = {i.id: i.category for i in workload.builtin("real-mixed")}
    recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["stage"] == "c8"]
    assert len(measured) == 2 * 48
    assert all(shipped[r["prompt_id"]] == r["category"] for r in measured)
    by_arm = {
        arm: sorted((r["index"], r["prompt_id"]) for r in measured if r["arm"] == arm)
        for arm in ("control", "treatment")
    }
    assert by_arm["control"] == by_arm["treatment"]
    assert "<th class=l>category</th>" in (out / "report.html").read_text()
