"""`collect()`'s failure reasons: what the operator says when results or Prometheus cannot give a
verdict (#23). Results live in an in-memory API (`fake_kube.FakeKube`); Prometheus is a loopback
HTTP server that answers what each test says."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from specdecode.controller import collect, results
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import reconcile, records, spec, status, validation
from tests.controller.fake_kube import FakeKube
from tests.factories import experiment_document
from tests.report import synthetic

JOB_UID = "job-uid-1"
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "exp-load", "uid": JOB_UID}
BODY = {"metadata": {"name": "exp", "namespace": "llm", "generation": 1, "uid": "experiment-uid"}}


def experiment(prometheus_url: str | None = None) -> spec.ExperimentSpec:
    doc = experiment_document()
    doc["spec"].pop("prometheus", None)
    if prometheus_url:
        doc["spec"]["prometheus"] = {"url": prometheus_url}
    return validation.parse_experiment(doc)[0]


def stored(files: dict[str, str]) -> FakeKube:
    """A namespace holding `files` as this generation's load Job writes them."""
    client = FakeKube()
    for cm in results.build_config_maps(
        "exp-results", "exp", results.pack(files), owners=[JOB_OWNER], generation=1
    ):
        client.add(cm)
    return client


def measured(validity: dict[str, Any] | None = None) -> dict[str, str]:
    """The files of a run of known effect, as the load Job writes them."""
    recs, windows = synthetic.run(experiment(), n=40)
    return {
        "requests.jsonl": "".join(r.model_dump_json() + "\n" for r in recs),
        "windows.json": json.dumps(
            {"anchor": {"monotonic": 0.0, "wall": 1.8e9}, "windows": [w.model_dump() for w in windows]}
        ),
        "loadgen-summary.json": json.dumps({"validity": validity or {"valid": True}}),
    }


def run_collect(
    client: FakeKube, experiment: spec.ExperimentSpec, settings: OperatorSettings | None = None
) -> reconcile.Judgement | reconcile.CollectFailure:
    return asyncio.run(
        collect.collect(
            client,
            BODY,
            experiment,
            status.ExperimentStatus(),
            settings or OperatorSettings(),
            job_uids={None: JOB_UID},
        )
    )


class _Prometheus(http.server.BaseHTTPRequestHandler):
    """Answers every query with the class's `answer`: (HTTP status, body)."""

    answer: tuple[int, bytes] = (200, b"")

    def do_GET(self) -> None:
        code, body = self.answer
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[Callable[[int, bytes], str]]:
    """A Prometheus on loopback: call it with the answer, get its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def answering(code: int, body: bytes) -> str:
        _Prometheus.answer = (code, body)
        return f"http://127.0.0.1:{server.server_address[1]}"

    try:
        yield answering
    finally:
        server.shutdown()
        server.server_close()


def vector(value: str | None) -> bytes:
    result = [] if value is None else [{"metric": {}, "value": [1.8e9, value]}]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def failure(outcome: reconcile.Judgement | reconcile.CollectFailure) -> reconcile.CollectFailure:
    assert isinstance(outcome, reconcile.CollectFailure), outcome
    return outcome


def test_no_results_is_results_missing() -> None:
    outcome = failure(run_collect(FakeKube(), experiment("http://127.0.0.1:1")))
    assert (outcome.reason, outcome.transient) == ("ResultsMissing", False)
    assert "read the load Job's log" in outcome.message


def test_results_that_do_not_parse_are_results_corrupt() -> None:
    files = {**measured(), "requests.jsonl": '{"stage": "low"}\n'}
    outcome = failure(run_collect(stored(files), experiment("http://127.0.0.1:1")))
    assert (outcome.reason, outcome.transient) == ("ResultsCorrupt", False)
    assert "do not parse" in outcome.message


def test_no_prometheus_anywhere_is_prometheus_not_configured() -> None:
    outcome = failure(
        run_collect(stored(measured()), experiment(None), OperatorSettings(prometheus_url=None))
    )
    assert (outcome.reason, outcome.transient) == ("PrometheusNotConfigured", False)
    assert "spec.prometheus.url" in outcome.message


def test_the_operator_s_default_prometheus_is_used_when_the_spec_names_none(
    prometheus: Callable[[int, bytes], str],
) -> None:
    url = prometheus(200, vector(None))
    outcome = failure(run_collect(stored(measured()), experiment(None), OperatorSettings(prometheus_url=url)))
    assert outcome.reason == "PrometheusNoData"


def test_a_prometheus_that_does_not_answer_is_transient(prometheus: Callable[[int, bytes], str]) -> None:
    outcome = failure(run_collect(stored(measured()), experiment(prometheus(503, b"overloaded"))))
    assert (outcome.reason, outcome.transient) == ("PrometheusUnavailable", True)
    assert "did not answer" in outcome.message  # after prometheus-api-client's own retries (~6 s)


def test_a_prometheus_answering_nonsense_is_transient(prometheus: Callable[[int, bytes], str]) -> None:
    outcome = failure(run_collect(stored(measured()), experiment(prometheus(200, b'{"status": "success"}'))))
    assert (outcome.reason, outcome.transient) == ("PrometheusBadResponse", True)


def test_a_prometheus_that_scrapes_no_arm_is_no_data(prometheus: Callable[[int, bytes], str]) -> None:
    outcome = failure(run_collect(stored(measured()), experiment(prometheus(200, vector(None)))))
    assert (outcome.reason, outcome.transient) == ("PrometheusNoData", False)
    assert "specdecode.io/experiment=exp" in outcome.message


def test_a_run_the_load_generator_marked_invalid_is_invalid_measurement(
    prometheus: Callable[[int, bytes], str],
) -> None:
    files = measured({"valid": False, "reasons": ["schedule lag p99 40 ms > 5 ms"]})
    outcome = failure(run_collect(stored(files), experiment(prometheus(200, vector("1")))))
    assert (outcome.reason, outcome.transient) == ("InvalidMeasurement", False)
    assert "schedule lag p99 40 ms" in outcome.message


def test_a_valid_run_with_prometheus_data_is_judged(prometheus: Callable[[int, bytes], str]) -> None:
    """The control of the failures above: the same results and Prometheus give a verdict."""
    client = stored(measured())
    outcome = run_collect(client, experiment(prometheus(200, vector("1"))))
    assert isinstance(outcome, reconcile.Judgement), outcome
    assert outcome.verdict is status.Verdict.PROMOTE
    assert outcome.results_ref is not None and outcome.results_ref.config_map == "exp-report"
    # each stage carries its window's wall-clock start and end: the dashboard's stage markers (#18)
    assert outcome.stages and all(s.started_at and s.finished_at for s in outcome.stages)
    assert all(s.started_at is not None and s.started_at < str(s.finished_at) for s in outcome.stages)


def test_a_stage_gets_its_window_s_wall_clock_times_and_one_without_a_window_none() -> None:
    anchor = records.RunAnchor(monotonic=100.0, wall=1_796_173_200.0)  # 2026-12-02T01:00:00Z
    windows = [records.StageWindow(stage="low", start=0.25, end=61.0)]
    low, high = collect.with_times(
        [status.StageResult(name="low"), status.StageResult(name="high")], windows, anchor
    )
    assert (low.started_at, low.finished_at) == ("2026-12-02T01:00:00.250Z", "2026-12-02T01:01:01.000Z")
    assert (high.started_at, high.finished_at) == (None, None)
