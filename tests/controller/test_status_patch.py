"""What the handler writes to `.status`: only changed fields, and null for a field the new status
dropped, so that the old verdict is never reported for the new spec (#23)."""

from __future__ import annotations

import asyncio
import copy

import kopf

from specdecode.controller import handlers
from specdecode.experiment import status
from tests.controller.fake_kube import FakeKube, Operator
from tests.controller.test_handlers import T0, document

VERDICT = {
    "observedGeneration": 1,
    "phase": "Completed",
    "verdict": "Promote",
    "reason": "SpeedupShown",
    "message": "1.30x faster",
    "speedupSummary": "low 1.30x",
    "completedAt": "2026-12-01T07:00:00Z",
    "stages": [{"name": "low", "verdict": "Pass", "speedup": {"metric": "tpot", "estimate": 1.3, "n": 40}}],
    "resultsRef": {"configMap": "exp-report"},
}


def test_fields_the_new_status_drops_are_patched_to_null_and_unchanged_ones_not_written() -> None:
    old = status.ExperimentStatus.model_validate(VERDICT)
    new = status.ExperimentStatus(observed_generation=2, phase=status.Phase.PENDING, message="1.30x faster")
    written = handlers._status_fields(kopf.Body({"status": VERDICT}), old, new)
    for dropped in ("verdict", "reason", "speedupSummary", "completedAt", "resultsRef"):
        assert dropped in written and written[dropped] is None, (dropped, written)
    assert written["stages"] == []  # the list's default: written, so the old stages go
    assert written["observedGeneration"] == 2
    assert "message" not in written  # unchanged: not written


def test_a_spec_edit_removes_the_old_verdict_from_the_stored_status(
    operator_events: list[tuple[str, str]],
) -> None:
    operator = Operator(FakeKube(), document())
    operator.body["status"] = copy.deepcopy(VERDICT)
    edited = copy.deepcopy(operator.body["spec"])
    edited["workload"]["requestsPerStage"] = 200
    operator.edit(edited)
    stored = asyncio.run(operator.tick(T0))
    assert (stored["observedGeneration"], stored["phase"]) == (2, "Pending"), stored
    left = {"verdict", "speedupSummary", "completedAt", "resultsRef"} & set(stored)
    assert not left, f"the old verdict's fields survived the spec edit: {left}"
    assert not stored.get("stages")
    assert stored["reason"] == "Accepted"
    promoted = next(c for c in stored["conditions"] if c["type"] == "Promoted")
    assert (promoted["status"], promoted["observedGeneration"]) == ("False", 2)
