"""The live view of `run --local`: what it shows per stage and arm."""

from __future__ import annotations

import io

from rich.console import Console

from specdecode.experiment import records
from specdecode.loadgen import runner
from specdecode.local import view


def shown(live: view.LiveView) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=80).print(live._render())
    return out.getvalue().splitlines()


def load(live: view.LiveView, arm: str, *, done: int, failed: int = 0) -> None:
    """One arm's load of stage c4 (the other arm not served), as the load generator reports it."""
    live(runner.StageStarted("c4", 0, 1, 10, "concurrency 4", False))
    for i in range(done):
        ok = i < done - failed
        live(runner.RequestDone("c4", i, arm, ok, None if ok else "http"))
    live(runner.StageFinished("c4", False, records.StageWindow(stage="c4", start=0.0, end=1.0)))


def test_one_gpu_the_arm_not_yet_run_shows_no_zero_counts_and_the_first_arms_counts_stay() -> None:
    live = view.LiveView(Console(file=io.StringIO(), width=80))
    load(live, "control", done=10)
    [row] = [line for line in shown(live) if "concurrency 4" in line]
    assert row.split("│")[3:5] == [" 10/0            ", " –               "], row
    assert not any("treatment" in line for line in shown(live) if line.startswith("c4 "))
    load(live, "treatment", done=10, failed=2)
    table = shown(live)
    [row] = [line for line in table if "concurrency 4" in line]
    assert [cell.strip() for cell in row.split("│")[3:5]] == ["10/0", "10/2"], row
    bars = [line for line in table if line.startswith("c4 ")]
    assert [line.split()[1] for line in bars] == ["control", "treatment"], bars
