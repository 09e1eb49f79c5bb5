"""Per-stage prompt lengths end to end: `specdecode run --local` on the simulator (issue 17)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import yaml

from specdecode import cli
from tests.factories import experiment_document


def test_each_stage_sends_its_own_lengths_to_both_arms(tmp_path: Path) -> None:
    document = experiment_document(
        model="sim/llama-8b",
        engine={"simulator": {"profile": "h200-8b-draft-tiny"}},
        speculative={"method": "draft_model", "model": "sim/draft", "numSpeculativeTokens": 4},
        workload={
            "dataset": {"type": "synthetic", "inputTokens": 64, "outputTokens": 32},
            "sampling": {"maxTokens": 32},
            "stages": [
                {"name": "short-c1", "concurrency": 1},
                {"name": "long-c4", "concurrency": 4, "inputTokens": 1024, "outputTokens": 16},
            ],
            "requestsPerStage": 20,
            "warmupRequests": 2,
        },
        analysis={"minSpeedup": 1.05, "guardrails": {"maxTtftRegression": None}, "requireStages": "any"},
        deadlines={"deploy": "1m", "run": "5m"},
    )
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    cli.main(["run", str(path), "--local", "--out", str(out), "--quiet"])
    status = json.loads((out / "result.json").read_text())
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
