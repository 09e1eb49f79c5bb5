"""The handler carries out what `decide()` asks, against an in-memory API (`fake_kube.FakeKube`):
a failed load's finished stages read and kept (`Action.KEEP_FINISHED_STAGES`), and their report
stored in ConfigMap `<exp>-report` (`Action.STORE_REPORT`), owned by the experiment; a ConfigMap
of that name the experiment does not own is never replaced."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specdecode import results
from specdecode.controller import kube
from specdecode.experiment import keys, manifests, validation
from tests.controller.fake_kube import FakeKube, Operator
from tests.controller.test_collect import measured, prometheus, vector  # noqa: F401 (the fixture)
from tests.factories import experiment_document
from tests.report import synthetic

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def document() -> dict[str, Any]:
    doc = experiment_document()
    doc["spec"].pop("prometheus", None)  # the stages keep the load Job's own figures
    return doc


def failed_load(client: FakeKube, *, stored: bool) -> Operator:
    """An experiment whose load failed during the second stage (`stored`: after storing the first's):
    its Job failed, its arms have no pods (either fails the run)."""
    operator = Operator(client, document())
    asyncio.run(operator.tick(T0))
    asyncio.run(operator.tick(T0))  # Deploying: the arms exist
    operator.body["status"].update(phase="Running", phaseStartedAt=T0.isoformat())
    experiment = validation.parse_experiment(document())[0]
    job = manifests.build_load_job("exp", experiment, manifests.Settings())
    job["metadata"]["annotations"] = {keys.GENERATION_ANNOTATION: "1"}
    job["status"] = {
        "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "killed"}
        ]
    }
    uid = client.add(job)["metadata"]["uid"]
    if stored:
        recs, windows = synthetic.run(experiment, n=300)
        first = windows[0].stage
        files = {
            "requests.jsonl": "".join(r.model_dump_json() + "\n" for r in recs if r.stage == first),
            "windows.json": json.dumps(
                {"anchor": {"monotonic": 0.0, "wall": 1.8e9}, "windows": [windows[0].model_dump()]}
            ),
            "loadgen-summary.json": json.dumps({"validity": {"valid": True}}),
        }
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "exp-load", "uid": uid}
        for cm in results.build_config_maps(
            "exp-results", "exp", results.pack(files), owners=[owner], generation=1
        ):
            client.add(cm)
    return operator


def failed(operator: Operator) -> dict[str, Any]:
    """The status after the tick that sees the load fail: Failed, never a verdict."""
    status = asyncio.run(operator.tick(T0 + timedelta(minutes=1)))
    assert status["phase"] == "Failed" and "verdict" not in status, status
    return status


def report_html(client: FakeKube) -> str:
    data = client.named(kube.CONFIG_MAP, "exp-report")["binaryData"]["report.html.gz"]
    return gzip.decompress(base64.b64decode(data)).decode()


def test_a_load_that_failed_keeps_the_stages_it_finished_and_stores_their_report(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    status = failed(failed_load(client, stored=True))
    assert [s["name"] for s in status["stages"]] == ["low"]
    assert status["message"].endswith(
        "the 1 of 2 stage(s) measured before that (low) are kept in status.stages and ConfigMap exp-report"
    )
    assert status["resultsRef"] == {"configMap": "exp-report"}
    report = client.named(kube.CONFIG_MAP, "exp-report")
    assert [o["uid"] for o in report["metadata"]["ownerReferences"]] == ["experiment-uid"]
    assert report["metadata"]["annotations"] == {keys.GENERATION_ANNOTATION: "1"}
    assert report_html(client).startswith("<!DOCTYPE html>")
    assert client.names(kube.DEPLOYMENT) == []  # and the failure's cleanup (Always) went on after it


def test_a_load_that_stored_nothing_fails_without_reading_results(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    status = failed(failed_load(client, stored=False))
    assert "stages" not in status and "resultsRef" not in status
    assert not [name for method, kind, name in client.reads if method == "GET" and kind == kube.CONFIG_MAP]
    assert client.names(kube.DEPLOYMENT) == []


def test_a_report_name_taken_by_a_foreign_config_map_keeps_the_failure_without_the_stages(
    operator_events: list[tuple[str, str]],
) -> None:
    client = FakeKube()
    operator = failed_load(client, stored=True)
    client.add(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "exp-report"}, "data": {"a": "b"}}
    )
    status = failed(operator)
    assert "stages" not in status and "resultsRef" not in status
    assert "are kept" not in status["message"]
    assert client.named(kube.CONFIG_MAP, "exp-report")["data"] == {"a": "b"}  # never replaced
    assert client.names(kube.DEPLOYMENT) == []


def test_a_verdict_s_report_is_stored_by_the_tick_and_one_whose_name_is_taken_is_not(
    operator_events: list[tuple[str, str]], request: pytest.FixtureRequest
) -> None:
    """The verdict stands either way; only a report with nowhere to go says so in the message."""
    answering: Callable[[int, bytes], str] = request.getfixturevalue("prometheus")
    for foreign in (False, True):
        client = FakeKube()
        doc = document()
        doc["spec"]["prometheus"] = {"url": answering(200, vector("1"))}
        operator = Operator(client, doc)
        asyncio.run(operator.tick(T0))
        asyncio.run(operator.tick(T0))
        operator.body["status"].update(phase="Analyzing", phaseStartedAt=T0.isoformat())
        job = manifests.build_load_job("exp", validation.parse_experiment(doc)[0], manifests.Settings())
        job["metadata"]["annotations"] = {keys.GENERATION_ANNOTATION: "1"}
        job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        uid = client.add(job)["metadata"]["uid"]
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "exp-load", "uid": uid}
        for cm in results.build_config_maps(
            "exp-results", "exp", results.pack(measured()), owners=[owner], generation=1
        ):
            client.add(cm)
        if foreign:
            client.add(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "exp-report"}, "data": {}}
            )
        status = asyncio.run(operator.tick(T0 + timedelta(minutes=1)))
        assert (status["phase"], status["verdict"]) == ("Completed", "Promote"), status
        if foreign:
            assert "resultsRef" not in status
            assert status["message"].endswith(
                "; the report was not stored: ConfigMap exp-report exists and is not this experiment's"
            )
            assert client.named(kube.CONFIG_MAP, "exp-report")["data"] == {}
        else:
            assert status["resultsRef"] == {"configMap": "exp-report"}
            stored = client.named(kube.CONFIG_MAP, "exp-report")
            assert [o["uid"] for o in stored["metadata"]["ownerReferences"]] == ["experiment-uid"]
            assert (
                json.loads(gzip.decompress(base64.b64decode(stored["binaryData"]["result.json.gz"])))[
                    "verdict"
                ]
                == "Promote"
            )
        assert client.names(kube.DEPLOYMENT) == []
