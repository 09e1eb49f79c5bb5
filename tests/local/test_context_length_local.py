"""Per-stage prompt lengths end to end: `specdecode run --local` on the simulator (issue 17)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from tests.local.simulated import ANALYSIS, run_local, simulated


def test_each_stage_sends_its_own_lengths_to_both_arms(tmp_path: Path) -> None:
    document = simulated(
        {
            "dataset": {"type": "synthetic", "inputTokens": 64, "outputTokens": 32},
            "sampling": {"maxTokens": 32},
            "stages": [
                {"name": "short-c1", "concurrency": 1},
                {"name": "long-c4", "concurrency": 4, "inputTokens": 1024, "outputTokens": 16},
            ],
            "requestsPerStage": 20,
            "warmupRequests": 2,
        },
        analysis=ANALYSIS,
        deadlines={"deploy": "1m", "run": "5m"},
    )
    _, status, out = run_local(tmp_path, document)
    assert status is not None
    assert status["phase"] == "Completed", status["message"]
    assert [s["name"] for s in status["stages"]] == ["short-c1", "long-c4"]
    # two lengths measured: the recommendation has a row per length
    assert [r["inputTokens"] for r in status["recommendation"]["byInputLength"]] == [64, 1024]
    tokens: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
    for line in (out / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        tokens[(r["stage"], r["arm"])].add((r["prompt_tokens"], r["completion_tokens"]))
    # inputTokens - 4 filler words and the nonce `[<hex>]`, 3 simulator tokens: 63 and 1023
    for arm in ("control", "treatment"):
        assert tokens[("short-c1", arm)] == {(63, 32)}
        assert tokens[("long-c4", arm)] == {(1023, 16)}
        assert tokens[("warmup-long-c4", arm)] == {(1023, 16)}  # its warm-up round at its lengths
