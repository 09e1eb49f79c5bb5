"""Multi-turn sessions end to end: `specdecode run --local` on the simulator sends the built-in
conversations as sessions to both arms, turn after turn, with prefix caching on in both, and reports
each arm's prefix-cache hit rate (issue 17)."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.local.simulated import run_completed


def test_sessions_run_turn_after_turn_on_both_arms_with_prefix_caching_and_report_each_arm_s_hit_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, out = run_completed(
        tmp_path,
        {
            "dataset": {"type": "multiTurn", "builtin": "conversations"},
            "sampling": {"maxTokens": 32},
            "stages": [{"name": "s4", "concurrency": 4}],
            "requestsPerStage": 60,
            "warmupRequests": 4,
        },
        seed=7,
    )
    assert result["environment"]["prefixCaching"] is True
    # both arms were started with prefix caching on, explicitly
    assert "--enable-prefix-caching" in result["environment"]["engineCommand"].split()
    started = [line for line in capsys.readouterr().err.splitlines() if line.startswith("started the ")]
    assert len(started) == 2
    assert all("--enable-prefix-caching" in line.split() for line in started)

    [stage] = result["stages"]
    for arm in ("control", "treatment"):
        rate = stage[arm]["prefixCacheHitRate"]
        assert rate is not None and 0.2 < rate < 1.0, (arm, rate)
    # the speed-up per turn index (informative), every measured pair in one of them
    assert [t["name"] for t in stage["turns"]] == ["1", "2", "3", "4", "5"]
    assert sum(t["pairs"] for t in stage["turns"]) == 60

    recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["stage"] == "s4"]
    assert len(measured) == 120 and all(r["ok"] for r in measured)
    by_pair: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in measured:
        by_pair[r["index"]].append(r)
    # each turn is one pair: the same session, turn and prompt on both arms
    assert all(
        len(p) == 2 and len({(r["session"], r["turn"], r["prompt_id"]) for r in p}) == 1
        for p in by_pair.values()
    )
    for arm in ("control", "treatment"):
        sessions: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in measured:
            if r["arm"] == arm:
                sessions[r["session"]].append(r)
        assert len(sessions) >= 12  # 60 turns of conversations of 3-5 turns
        for turns in sessions.values():
            turns.sort(key=lambda r: r["turn"])
            assert [r["turn"] for r in turns] == list(range(1, len(turns) + 1))
            # turn k went out only once this arm's reply to turn k-1 was complete, on the same slot
            for before, after in itertools.pairwise(turns):
                assert after["sent"] >= before["end"]
                assert after["slot"] == before["slot"]
                # later turns repeat the earlier ones: longer prompts
                assert after["prompt_tokens"] > before["prompt_tokens"]

    html = (out / "report.html").read_text()
    assert "prefix-cache hits" in html and "prefix caching: on in both arms" in html
    assert "per turn of the sessions" in html
