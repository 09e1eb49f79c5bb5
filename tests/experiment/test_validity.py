"""The validity block as a typed model: what main wrote before it was one still parses and writes back
to the same JSON, in the load generator's summary, in a results bundle, in status and in result.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from specdecode import results
from specdecode.experiment import validity
from specdecode.experiment.spec import Arm
from specdecode.experiment.status import ExperimentStatus

ROOT = Path(__file__).resolve().parents[2]

#: `loadgen-summary.json`'s `validity` as main's summary.build wrote it (8548d82: a late open-loop run,
#: interrupted, kernel stamps), before the block was a model.
LOADGEN_BLOCK: dict[str, Any] = {
    "valid": False,
    "reasons": ["schedule lag p99 9.00 ms > budget 5.00 ms", "the run was interrupted"],
    "schedule_lag_ms": {"n": 2, "mean": 9.0, "p50": 9.0, "p90": 9.0, "p99": 9.0, "max": 9.0},
    "schedule_lag_budget_ms": 5.0,
    "loop_lag_ms": {"n": 10, "mean": 20.0, "p50": 20.0, "p90": 20.0, "p99": 20.0, "max": 20.0},
    "loop_lag_budget_ms": 5.0,
    "client_cpu_percent": 10.0,
    "client_cpu_budget_percent": 90.0,
    "connections_opened": {"control": 2, "treatment": 3},
    "stamps": "kernel",
}

#: A block without samples: the distribution's nulls are part of the JSON.
EMPTY_BLOCK: dict[str, Any] = {
    **LOADGEN_BLOCK,
    "valid": True,
    "reasons": [],
    "schedule_lag_ms": {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None},
}


def stored_results() -> list[Path]:
    return sorted(ROOT.glob("benchmarks/real-gpu/results*/*/result.json"))


@pytest.mark.parametrize("block", [LOADGEN_BLOCK, EMPTY_BLOCK], ids=["late", "empty"])
def test_a_load_generator_s_block_reads_and_writes_back_the_same_json(block: dict[str, Any]) -> None:
    parsed = validity.Validity.model_validate(block)
    assert parsed.wire() == block
    assert list(parsed.wire()) == list(block)  # the load generator's order, too
    assert parsed.connections_opened == {Arm.CONTROL: 2, Arm.TREATMENT: 3}
    assert parsed.schedule_lag_ms is not None and parsed.schedule_lag_ms.n == block["schedule_lag_ms"]["n"]


def test_status_carries_the_block_with_its_nulls_although_status_drops_its_own() -> None:
    status = ExperimentStatus.model_validate({"phase": "Completed", "validity": EMPTY_BLOCK})
    assert isinstance(status.validity, validity.Validity)
    wire = status.wire()
    assert wire["validity"] == EMPTY_BLOCK
    assert "verdict" not in wire  # status's own nulls are still left out
    assert ExperimentStatus.model_validate(json.loads(json.dumps(wire))).wire() == wire


def test_keys_of_another_load_image_are_kept() -> None:
    block = {
        **LOADGEN_BLOCK,
        "shards": {"load-0": {"valid": True}},
        "stages": {"c1": {"valid": False, "why": "x"}},
    }
    assert validity.Validity.model_validate(block).wire() == block
    assert validity.Validity.model_validate({}).wire() == {}


@pytest.mark.parametrize("path", stored_results(), ids=lambda p: str(p.relative_to(ROOT / "benchmarks")))
def test_a_stored_result_s_status_reads_and_writes_back_its_block(path: Path) -> None:
    """result.json of run --local (one GPU: each arm's block under `arms`) written by main's images."""
    doc = json.loads(path.read_text())
    doc = doc.get("status", doc)
    status = ExperimentStatus.model_validate(doc)
    assert status.validity is not None and status.validity.simultaneous is False
    assert status.validity.arms is not None and set(status.validity.arms) == set(Arm)
    assert status.wire()["validity"] == doc["validity"]


def test_stored_results_are_there_to_read() -> None:
    assert len(stored_results()) >= 3


def test_a_results_bundle_as_main_packs_it_gives_the_block() -> None:
    summary = {"stages": [], "validity": LOADGEN_BLOCK, "definitions": {}}
    files = {"requests.jsonl": "", "windows.json": "{}", "loadgen-summary.json": json.dumps(summary)}
    *_, parsed = results.parse(results.unpack(results.pack(files)))
    block = validity.Validity.of_summary(parsed)
    assert block is not None and not block.valid and block.wire() == LOADGEN_BLOCK
    assert validity.Validity.of_summary({"stages": []}) is None


def test_a_stage_is_as_the_run_and_its_own_entry() -> None:
    block = validity.Validity.model_validate(
        {"valid": True, "reasons": ["run"], "stages": {"c16": {"valid": False, "reasons": ["late"]}}}
    )
    assert block.stage("c16") == validity.StageValidity(valid=False, reasons=["run", "late"])
    assert block.stage("c1") == validity.StageValidity(valid=True, reasons=["run"])
    assert validity.of_stage(None, "c1").valid
    assert not validity.of_stage(validity.Validity(valid=False), "c1").valid


def test_one_after_the_other_merges_as_main_did() -> None:
    """`run --local` on one GPU (main's `_merged_validity`): reasons by arm, each block under `arms`."""
    treatment = {**EMPTY_BLOCK, "valid": False, "reasons": ["client CPU 95% > budget 90%"]}
    merged = validity.merged(
        validity.Validity.model_validate(EMPTY_BLOCK), validity.Validity.model_validate(treatment)
    )
    assert merged.wire() == {
        "valid": False,
        "reasons": ["treatment: client CPU 95% > budget 90%"],
        "simultaneous": False,
        "arms": {"control": EMPTY_BLOCK, "treatment": treatment},
    }
    missing = validity.merged(validity.Validity.model_validate(EMPTY_BLOCK), None)
    assert missing.wire() == {
        "valid": True,
        "reasons": [],
        "simultaneous": False,
        "arms": {"control": EMPTY_BLOCK, "treatment": None},
    }


def test_an_interruption_is_forgiven_and_nothing_else() -> None:
    block = validity.Validity.model_validate(LOADGEN_BLOCK)
    kept = block.forgiving(validity.INTERRUPTED)
    assert not kept.valid and kept.reasons == ["schedule lag p99 9.00 ms > budget 5.00 ms"]
    only = validity.Validity.model_validate({**LOADGEN_BLOCK, "reasons": [validity.INTERRUPTED]})
    assert only.forgiving(validity.INTERRUPTED).valid
    assert only.forgiving(validity.INTERRUPTED).wire() == {**LOADGEN_BLOCK, "valid": True, "reasons": []}
    assert block.wire() == LOADGEN_BLOCK  # the original is left as it was (frozen)
    with pytest.raises(ValueError):
        copy.copy(block).__setattr__("valid", True)
