"""`run --local` with `analysis.crossover` (issue 22): the arms side by side on two (fake) GPUs of unequal
speed, then again with their GPUs swapped; the placement effect is measured and a pass it made is
withheld.

The treatment is made identical to the control in speed (the simulator accepts nothing, drafts and
verified tokens cost nothing, k = 1), so every difference between the arms is the GPU's: one GPU is 10% slower
(`FAKE_GPU_SPEED_FACTORS`, the simulator's speed factor per device).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode import cli
from tests.factories import SHORT_STAGE_GUARDRAILS, experiment_document
from tests.local import test_run_local as run_local
from tests.local.conftest import FakeEngines

NEUTRAL = "--profile h200-8b-draft-tiny --decode-step-ms 8 --acceptance-rate 0 --draft-cost-ratio 0 --draft-fixed-ms 0 --batch-token-ms 0"


def write_experiment(tmp_path: Path, crossover: str | None) -> Path:
    analysis: dict[str, Any] = {
        "minSpeedup": 1.02,
        "sequential": False,
        "guardrails": {"maxTtftRegression": None, **SHORT_STAGE_GUARDRAILS},
    }
    if crossover is not None:
        analysis["crossover"] = crossover
    document = experiment_document(
        model="meta-llama/Llama-3.1-8B-Instruct",
        speculative={
            "method": "draft_model",
            "model": "meta-llama/Llama-3.2-1B-Instruct",
            "numSpeculativeTokens": 1,
        },
        workload={
            "dataset": {"type": "synthetic", "inputTokens": 32, "outputTokens": 32},
            "sampling": {"maxTokens": 32},
            "stages": [{"name": "c4", "concurrency": 4}],
            "requestsPerStage": 60,
            "warmupRequests": 4,
        },
        analysis=analysis,
        deadlines={"deploy": "1m", "run": "5m"},
    )
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run_on_unequal_gpus(
    tmp_path: Path, fakes: FakeEngines, crossover: str | None, slow: str
) -> dict[str, Any]:
    """Control on GPU 0, treatment on GPU 1 (`run --local`'s split); GPU `slow` is 10% slower."""
    fakes.set("FAKE_NVIDIA_SMI_GPUS", "2")
    fakes.set("FAKE_VLLM_SIM_ARGS", NEUTRAL)
    fakes.set("FAKE_GPU_SPEED_FACTORS", f"{slow}=1.1")
    out = tmp_path / "out"
    code = cli.main(
        ["run", str(write_experiment(tmp_path, crossover)), "--local", "--out", str(out), "--quiet"]
    )
    status: dict[str, Any] = json.loads((out / "result.json").read_text())
    assert code == 0, status.get("message")
    return status


def test_without_the_crossover_the_faster_gpu_is_not_promoted(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    """The harm the crossover prevents (issue 35 item 3): the control's GPU is 10% slower, so a neutral
    treatment is measured 1.1x faster; without a crossover that pass is withheld, and the message
    says how to get a decision."""
    status = run_on_unequal_gpus(tmp_path, fake_engines, None, slow="0")
    assert status["stages"][0]["speedup"]["estimate"] == pytest.approx(1.1, rel=0.04)
    assert (status["verdict"], status["reason"]) == ("Inconclusive", "PlacementUnseparated"), status[
        "message"
    ]
    assert status["environment"]["hostDifferences"] == ["speedFactor"]
    assert "to decide, run the crossover (spec.analysis.crossover: IfApart)" in status["message"]
    assert "crossover" not in status


@pytest.mark.parametrize("slow", ["0", "1"])
def test_with_the_crossover_a_neutral_treatment_on_unequal_gpus_is_never_promoted(
    tmp_path: Path, fake_engines: FakeEngines, slow: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run_on_unequal_gpus(tmp_path, fake_engines, "IfApart", slow=slow)
    assert "Placement (crossover: the arms' placements swapped)" in capsys.readouterr().err
    assert status["verdict"] != "Promote", status["message"]
    block = status["crossover"]
    assert block["ran"] is True and block["mode"] == "IfApart"
    # Round 1 as split (control GPU 0, treatment GPU 1), round 2 swapped; the slow GPU shows its factor.
    first, second = block["rounds"]
    assert first["control"].endswith("GPUs 0" + (" (speedFactor 1.1)" if slow == "0" else " (speedFactor 1)"))
    assert second["control"].startswith(first["treatment"].split(" GPUs ")[0])
    assert "GPUs 1" in second["control"] and "GPUs 0" in second["treatment"]
    # The placement effect in round 1: the treatment's GPU made it look 1.1x faster (slow control GPU) or slower.
    effect = 1.1 if slow == "0" else 1 / 1.1
    stage = status["stages"][0]
    assert stage["placement"]["effect"] == pytest.approx(effect, rel=0.04)
    assert block["effects"]["c4"] == pytest.approx(effect, rel=0.04)
    assert stage["placement"]["speedup"] == pytest.approx(1.0, abs=0.04)
    assert stage["placement"]["swapped"]["n"] == 30  # crossoverFraction 0.5 of 60
    if slow == "0":  # round 1 alone would have promoted it
        assert stage["speedup"]["ciLow"] > 1.02
        assert stage["verdict"] == "Inconclusive" and stage["placement"]["demoted"] is True
        assert stage["reasons"][0].startswith("PlacementEffect: placement effect")
        assert status["reason"] == "PlacementEffect" and block["demoted"] == ["c4"]
    else:
        assert status["verdict"] == "Reject" and block["demoted"] == []
    assert "crossover (placements swapped): placement effect" in status["message"]
    out = tmp_path / "out"
    assert len((out / "crossover" / "requests.jsonl").read_text().splitlines()) > 0
    assert (out / "logs" / "control-swapped.log").exists()
    assert (
        "<b>Placement (crossover):</b> crossover (placements swapped): placement effect"
        in (out / "report.html").read_text()
    )
    served = [(s["arm"], s["cuda_visible_devices"]) for s in fake_engines.serves()]
    assert sorted(served[:2]) == [("control", "0"), ("treatment", "1")]
    assert sorted(served[2:]) == [("control", "1"), ("treatment", "0")]


def test_a_swapped_round_that_cannot_start_withholds_the_pass_and_keeps_round_one(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    fake_engines.set("FAKE_VLLM_FAIL_AT_START", "control@1")  # the control fails on the treatment's GPU
    status = run_on_unequal_gpus(tmp_path, fake_engines, "Always", slow="0")
    assert status["phase"] == "Completed" and status["verdict"] == "Inconclusive"
    assert status["reason"] == "PlacementEffect"
    block = status["crossover"]
    assert (block["ran"], block["reason"], block["demoted"]) == (False, "SwappedRoundFailed", ["c4"])
    assert block["message"].startswith(
        "crossover: the swapped round could not be measured (EngineUnavailable: control arm exited"
    )
    assert len(block["rounds"]) == 1
    stage = status["stages"][0]
    assert stage["speedup"]["estimate"] == pytest.approx(1.1, rel=0.04)  # round 1 as measured
    assert "placement effect unknown" in stage["reasons"][0]


def test_if_apart_on_equal_gpus_runs_no_crossover_and_says_why(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "2")
    fake_engines.set("FAKE_VLLM_SIM_ARGS", NEUTRAL)
    out = tmp_path / "out"
    assert (
        cli.main(["run", str(write_experiment(tmp_path, "IfApart")), "--local", "--out", str(out), "--quiet"])
        == 0
    )
    status = json.loads((out / "result.json").read_text())
    assert status["crossover"] == {
        "mode": "IfApart",
        "ran": False,
        "reason": "NotApart",
        "message": "the arms ran on hosts that do not differ: no crossover needed",
        "rounds": [],
        "effects": {},
        "demoted": [],
    }
    assert len(fake_engines.serves()) == 2


def test_servers_given_by_url_cannot_be_swapped_and_the_status_says_so(tmp_path: Path) -> None:
    path = run_local.write_experiment(
        tmp_path,
        simulator={"profile": "h200-8b-draft-tiny"},
        requests=20,
        sequential=False,
        crossover="IfApart",
    )
    control, control_url = run_local.start_simulator_node(tmp_path, "control", 1.0)
    treatment, treatment_url = run_local.start_simulator_node(tmp_path, "treatment", 1.1)
    try:
        out = tmp_path / "out"
        code = run_local.run(path, out, "--control-url", control_url, "--treatment-url", treatment_url)
    finally:
        for process in (control, treatment):
            process.terminate()
            process.wait(15)
    assert code == 0
    status = json.loads((out / "result.json").read_text())
    assert status["environment"]["hostDifferences"] == ["speedFactor"]
    assert (status["crossover"]["ran"], status["crossover"]["reason"]) == (False, "ServersGiven")
    assert "placement" not in status["stages"][0]


def test_simulator_arms_have_no_placement_to_swap_and_the_status_says_so(tmp_path: Path) -> None:
    path = run_local.write_experiment(
        tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20, crossover="Always"
    )
    out = tmp_path / "out"
    assert run_local.run(path, out) == 0
    status = json.loads((out / "result.json").read_text())
    assert (status["crossover"]["ran"], status["crossover"]["reason"]) == (False, "SamePlacement")
    assert status["reason"] != "PlacementEffect" and "placement" not in status["stages"][0]
    assert not (out / "crossover").exists()


def test_confirm_after_a_crossover_puts_both_arms_back_on_their_first_gpus(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "2")
    # A draft that pays at c4 by far more than a loaded machine moves the simulator's timing (at the
    # profile's own ~4 ms step a CI run measured round 2 at 0.95x [0.74, 1.22] and withheld the pass).
    fake_engines.set(
        "FAKE_VLLM_SIM_ARGS", "--profile h200-8b-draft-tiny --decode-step-ms 10 --acceptance-rate 0.9"
    )
    path = write_experiment(tmp_path, "Always")
    document = yaml.safe_load(path.read_text())
    document["spec"]["analysis"]["confirm"] = True
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    assert cli.main(["run", str(path), "--local", "--out", str(out), "--quiet"]) == 0
    status = json.loads((out / "result.json").read_text())
    assert status["crossover"]["ran"] is True and status["verdict"] == "Promote", status["message"]
    rec = status["recommendation"]
    assert rec["numSpeculativeTokensPerBatchSize"] == [[1, 4096, 1]]
    assert rec["confirmationReason"] == "Confirmed", rec
    served = [(s["arm"], s["cuda_visible_devices"]) for s in fake_engines.serves()]
    assert sorted(served[2:4]) == [("control", "1"), ("treatment", "0")]  # the swapped round
    assert sorted(served[4:]) == [("control", "0"), ("treatment", "1")]  # the confirmation, as round 1
    assert (out / "logs" / "treatment-confirmation.log").exists()
