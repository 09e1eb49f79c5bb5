"""A smoke test of `benchmarks/scale/many_experiments.py`: two experiments on one operator, from
apply to verdict, against a control plane of the script's own (the figures are in
benchmarks/README.md, "Many experiments"; the full run of 50 takes minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_cluster import REPO_ROOT

pytestmark = pytest.mark.e2e

SCRIPT = REPO_ROOT / "benchmarks" / "scale" / "many_experiments.py"


def test_the_benchmark_measures_both_latencies_of_every_experiment(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    argv = [
        sys.executable,
        str(SCRIPT),
        "--experiments",
        "2",
        "--requests",
        "40",
        "--load-seconds",
        "1",
        "--interval",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "operator"), str(REPO_ROOT)])}
    done = subprocess.run(
        [*argv, "--json", str(out), "--timeout", "120"], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = result["perExperiment"]
    assert [r["name"] for r in rows] == ["exp-000", "exp-001"]
    for row in rows:
        assert row["verdict"] in ("Promote", "Reject", "Inconclusive"), row
        assert 0 < row["applyToFirstChildS"] < 60, row
        assert 0 < row["resultsToVerdictS"] < 60, row
    assert result["applyToFirstChildS"]["n"] == result["resultsToVerdictS"]["n"] == 2
    assert result["operator"]["rssMiBPeak"] > 0 and result["operator"]["cpuSeconds"] > 0
