"""`workload.sweep` end to end: `specdecode run --local` on the simulator runs the generated stages (issue 17)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from specdecode import cli
from tests.factories import experiment_document


def test_a_concurrency_sweep_runs_its_generated_stages_in_ascending_load(tmp_path: Path) -> None:
    document = experiment_document(
        model="sim/llama-8b",
        engine={"simulator": {"profile": "h200-8b-draft-tiny"}},
        speculative={"method": "draft_model", "model": "sim/draft", "numSpeculativeTokens": 4},
        workload={
            "dataset": {"type": "synthetic", "inputTokens": 64, "outputTokens": 64},
            "sampling": {"maxTokens": 64},
            "sweep": {"concurrency": {"values": [64, 1]}},
            "requestsPerStage": 60,
            "warmupRequests": 2,
        },
        analysis={"minSpeedup": 1.05, "guardrails": {"maxTtftRegression": None}, "requireStages": "any"},
        deadlines={"deploy": "1m", "run": "5m"},
    )
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    assert cli.main(["run", str(path), "--local", "--out", str(out), "--quiet"]) == 0
    status = json.loads((out / "result.json").read_text())
    assert status["phase"] == "Completed", status["message"]
    stages = {s["name"]: s for s in status["stages"]}
    assert list(stages) == ["c1", "c64"]  # ascending load, whatever order the values were listed in
    # the profile's measured shape: a clear win at concurrency 1, none at 64
    assert stages["c1"]["verdict"] == "Pass"
    assert stages["c64"]["verdict"] != "Pass"
    assert stages["c1"]["speedup"]["estimate"] > stages["c64"]["speedup"]["estimate"]
    assert status["verdict"] == "Promote"
    loads = {json.loads(line)["stage"] for line in (out / "requests.jsonl").read_text().splitlines()}
    assert {"c1", "c64"} <= loads
