"""Shared by the `run --local` feature tests: an experiment on the simulator's tiny-draft profile, written to
a file and run as a user would (`specdecode run FILE --local`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from specdecode import cli
from tests.factories import SHORT_STAGE_GUARDRAILS, experiment_document

#: What the local feature tests judge by default: minSpeedup 1.05, no TTFT guardrail, error and
#: output-match limits that stages of 60 requests can show, any stage may pass.
ANALYSIS: dict[str, Any] = {
    "minSpeedup": 1.05,
    "guardrails": {"maxTtftRegression": None, **SHORT_STAGE_GUARDRAILS},
    "requireStages": "any",
}


def simulated(workload: dict[str, Any], *, seed: int | None = None, **spec: Any) -> dict[str, Any]:
    """An experiment on the simulator (8B target, the 2-layer draft profile, k = 4) with this workload."""
    engine: dict[str, Any] = {"simulator": {"profile": "h200-8b-draft-tiny"}}
    if seed is not None:
        engine["seed"] = seed
    return experiment_document(
        model="sim/llama-8b",
        engine=engine,
        speculative={"method": "draft_model", "model": "sim/draft", "numSpeculativeTokens": 4},
        workload=workload,
        **spec,
    )


def run_local(tmp_path: Path, document: dict[str, Any]) -> tuple[int, dict[str, Any] | None, Path]:
    """`specdecode run experiment.yaml --local --out tmp_path/out --quiet`: the exit code, result.json (None
    when none was written) and the results directory."""
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    code = cli.main(["run", str(path), "--local", "--out", str(out), "--quiet"])
    result = out / "result.json"
    return code, (json.loads(result.read_text()) if result.exists() else None), out


def run_completed(tmp_path: Path, workload: dict[str, Any], *, seed: int) -> tuple[dict[str, Any], Path]:
    """Run `workload` on the simulator with every stage in full (sequential analysis off; deploy 1 min,
    run 5 min); the run must complete with a verdict (exit code 0 or 1). result.json and the results
    directory."""
    document = simulated(
        workload,
        seed=seed,
        analysis={**ANALYSIS, "sequential": False},
        deadlines={"deploy": "1m", "run": "5m"},
    )
    code, result, out = run_local(tmp_path, document)
    assert result is not None
    assert result["phase"] == "Completed", result["message"]
    assert code in {0, 1}
    return result, out
