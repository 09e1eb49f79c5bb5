"""`collect()`'s failure reasons: what the operator says when results or Prometheus cannot give a
verdict (#23). Results live in an in-memory API (`fake_kube.FakeKube`); Prometheus is a loopback
HTTP server that answers what each test says."""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

from specdecode import results
from specdecode.controller import collect
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import (
    promql,
    recommendation,
    reconcile,
    records,
    rounds,
    search,
    spec,
    status,
    validation,
)
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
    recs, windows = synthetic.run(experiment(), n=300)
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
    """Answers every query with the class's `answer`: (HTTP status, body); a query of several
    (`promql.tagged`) gets the answer's series once per query, tagged with its key, as Prometheus
    answers it."""

    answer: tuple[int, bytes] = (200, b"")
    asked: ClassVar[list[str]] = []  # the queries, in the order they came

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
        type(self).asked.append(query)
        code, body = self.answer
        keys = re.findall(rf'"{promql.TAG}", "([^"]+)"', query)
        if code == 200 and keys and json.loads(body).get("data"):
            answer = json.loads(body)
            series = answer["data"]["result"]
            answer["data"]["result"] = [
                {**one, "metric": {**one["metric"], promql.TAG: key}} for key in keys for one in series
            ]
            body = json.dumps(answer).encode()
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
    """A record an older load image wrote (version 1) that does not parse, or a version-2 bundle
    without one of its columns."""
    files = {**measured(), "requests.jsonl": '{"stage": "low"}\n'}
    client = FakeKube()
    for cm in results.build_config_maps(
        "exp-results", "exp", results.pack_legacy(files), owners=[JOB_OWNER], generation=1
    ):
        client.add(cm)
    outcome = failure(run_collect(client, experiment("http://127.0.0.1:1")))
    assert (outcome.reason, outcome.transient) == ("ResultsCorrupt", False)
    assert "do not parse" in outcome.message

    with np.load(io.BytesIO(results.encode_files(measured()))) as archive:
        arrays = {name: archive[name] for name in archive.files if name != "sent"}
    packed = io.BytesIO()
    np.savez_compressed(packed, **arrays)
    client = FakeKube()
    for cm in results.build_config_maps(
        "exp-results", "exp", results.split(packed.getvalue()), owners=[JOB_OWNER], generation=1
    ):
        client.add(cm)
    outcome = failure(run_collect(client, experiment("http://127.0.0.1:1")))
    assert (outcome.reason, outcome.transient) == ("ResultsCorrupt", False)
    assert "the result bundle is corrupt: KeyError" in outcome.message


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


def test_a_collection_asks_prometheus_once_per_stage_for_the_vllm_figures_and_once_for_the_gpus(
    prometheus: Callable[[int, bytes], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both arms' queries of a stage in one request each (`promql.tagged`): a request costs the
    operator a few ms of CPU, and fifty collections at once queue behind each other
    (benchmarks/README.md, "Many experiments"); ~30 one-query requests a stage before."""
    monkeypatch.setattr(_Prometheus, "asked", [])
    spec_ = experiment(prometheus(200, vector("1")))
    outcome = run_collect(stored(measured()), spec_)
    assert isinstance(outcome, reconcile.Judgement), outcome
    stages = len(spec_.workload.stages)
    gpu = [q for q in _Prometheus.asked if "DCGM_" in q]
    vllm = [q for q in _Prometheus.asked if "DCGM_" not in q]
    assert (len(vllm), len(gpu)) == (stages, stages)
    for query in vllm:  # each names both arms and every figure of each
        for arm in spec.Arm:
            assert f'"{promql.TAG}", "{arm.value}.up"' in query
        assert f'"{promql.TAG}", "treatment.num_accepted_tokens"' in query
        assert f'"{promql.TAG}", "control.num_accepted_tokens"' not in query


def test_a_stage_gets_its_window_s_wall_clock_times_and_one_without_a_window_none() -> None:
    anchor = records.RunAnchor(monotonic=100.0, wall=1_796_173_200.0)  # 2026-12-02T01:00:00Z
    windows = [records.StageWindow(stage="low", start=0.25, end=61.0)]
    low, high = collect.with_times(
        [status.StageResult(name="low"), status.StageResult(name="high")], windows, anchor
    )
    assert (low.started_at, low.finished_at) == ("2026-12-02T01:00:00.250Z", "2026-12-02T01:01:01.000Z")
    assert (high.started_at, high.finished_at) == (None, None)


# --------------------------------------------------------------------- rounds after the stages


def measured_with(speedup: float, seed: int) -> dict[str, str]:
    recs, windows = synthetic.run(experiment(), n=300, speedup=speedup, seed=seed)
    return {
        "requests.jsonl": "".join(r.model_dump_json() + "\n" for r in recs),
        "windows.json": json.dumps(
            {"anchor": {"monotonic": 0.0, "wall": 1.8e9}, "windows": [w.model_dump() for w in windows]}
        ),
        "loadgen-summary.json": json.dumps({"validity": {"valid": True}}),
    }


def store_round(client: FakeKube, round_name: str, files: dict[str, str]) -> str:
    """`files` as the round's own load Job writes them; returns that Job's uid."""
    uid = f"job-uid-{round_name.lower()}"
    owner = {**JOB_OWNER, "name": f"exp-load-{round_name.lower()}", "uid": uid}
    for cm in results.build_config_maps(
        f"exp-results-{round_name.lower()}", "exp", results.pack(files), owners=[owner], generation=1
    ):
        client.add(cm)
    return uid


def apart() -> status.Environment:
    hosts = status.ArmHosts(control=status.Host(node="gpu-a"), treatment=status.Host(node="gpu-b"))
    return status.Environment(arms=hosts, host_differences=["node"])


def together() -> status.Environment:
    """Both arms on node gpu-a, each on its own GPUs."""
    host = status.Host(node="gpu-a")
    return status.Environment(arms=status.ArmHosts(control=host, treatment=host))


def with_analysis(url: str, **analysis: Any) -> spec.ExperimentSpec:
    doc = experiment_document(analysis=analysis)
    doc["spec"]["prometheus"] = {"url": url}
    return validation.parse_experiment(doc)[0]


def collect_in(
    client: FakeKube, s: spec.ExperimentSpec, current: status.ExperimentStatus, uids: dict[str | None, str]
) -> reconcile.Judgement:
    outcome = asyncio.run(collect.collect(client, BODY, s, current, OperatorSettings(), job_uids=uids))
    assert isinstance(outcome, reconcile.Judgement), outcome
    return outcome


def test_arms_apart_owe_the_crossover_round_before_any_verdict_or_report(
    prometheus: Callable[[int, bytes], str],
) -> None:
    client = stored(measured())
    s = with_analysis(prometheus(200, vector("1")), crossover="IfApart")
    owed = collect_in(client, s, status.ExperimentStatus(environment=apart()), {None: JOB_UID})
    assert owed.next_round is not None and owed.next_round.name == "Crossover"
    assert owed.next_round.nodes == status.CrossoverPlacement(control="gpu-b", treatment="gpu-a")
    assert owed.stages and owed.results_ref is None
    assert "exp-report" not in [name for (_, name) in client.store]  # stored with the verdict only
    together = collect_in(
        stored(measured()), s, status.ExperimentStatus(environment=status.Environment()), {None: JOB_UID}
    )
    assert together.next_round is None and together.crossover is not None
    assert together.crossover.reason == "NotApart"


def test_a_measured_swapped_round_is_folded_into_the_verdict(prometheus: Callable[[int, bytes], str]) -> None:
    client = stored(measured())
    uid = store_round(client, "Crossover", measured_with(1.3, seed=1))
    s = with_analysis(prometheus(200, vector("1")), crossover="IfApart")
    swapped = status.Round(
        name="Crossover",
        nodes=status.CrossoverPlacement(control="gpu-b", treatment="gpu-a"),
        outcome="Measured",
    )
    current = status.ExperimentStatus(environment=apart(), rounds=[swapped])
    judged = collect_in(client, s, current, {None: JOB_UID, "Crossover": uid})
    assert judged.next_round is None and judged.crossover is not None
    assert judged.crossover.ran and sorted(judged.crossover.effects) == sorted(
        st.name for st in judged.stages
    )
    assert judged.crossover.rounds == [
        status.CrossoverPlacement(control="gpu-a", treatment="gpu-b"),
        status.CrossoverPlacement(control="gpu-b", treatment="gpu-a"),
    ]
    assert all(st.placement is not None and st.placement.swapped is not None for st in judged.stages)
    assert judged.results_ref is not None  # the report comes with the verdict


def test_a_swapped_round_that_failed_withholds_every_pass(prometheus: Callable[[int, bytes], str]) -> None:
    s = with_analysis(prometheus(200, vector("1")), crossover="IfApart")
    failed = status.Round(
        name="Crossover", outcome="Failed", message="Unschedulable: 0/2 nodes are available"
    )
    current = status.ExperimentStatus(environment=apart(), rounds=[failed])
    judged = collect_in(stored(measured()), s, current, {None: JOB_UID})
    assert judged.crossover is not None and (judged.crossover.ran, judged.crossover.reason) == (
        False,
        "SwappedRoundFailed",
    )
    assert "Unschedulable: 0/2 nodes are available" in (judged.crossover.message or "")
    assert judged.verdict is not status.Verdict.PROMOTE
    assert all(st.verdict is not status.StageVerdict.PASS for st in judged.stages)


def test_the_confirmation_round_is_owed_for_a_schedule_and_confirms_it_once_measured(
    prometheus: Callable[[int, bytes], str],
) -> None:
    s = with_analysis(prometheus(200, vector("1")), confirm=True)
    first = collect_in(
        stored(measured()), s, status.ExperimentStatus(environment=together()), {None: JOB_UID}
    )
    owed = first.next_round
    assert owed is not None and owed.name == "Confirmation" and owed.schedule
    assert owed.nodes == status.CrossoverPlacement(treatment="gpu-a")  # the control keeps serving
    client = stored(measured())
    uid = store_round(client, "Confirmation", measured_with(1.3, seed=2))
    done = owed.model_copy(update={"outcome": "Measured"})
    judged = collect_in(
        client,
        s,
        status.ExperimentStatus(environment=together(), rounds=[done]),
        {None: JOB_UID, "Confirmation": uid},
    )
    rec = judged.recommendation
    assert judged.next_round is None and rec is not None
    assert (rec.confirmation_reason, rec.confirmed) == ("Confirmed", True)
    assert [c.name for c in rec.confirmation] == [
        st.name for st in judged.stages if st.batch_size is not None
    ]


# ------------------------------------------------------------------- the break-even search's probes


def searching(url: str, **analysis: Any) -> spec.ExperimentSpec:
    doc = experiment_document(analysis=analysis)
    wanted = {"goal": "breakEven", "concurrency": {"from": 1, "to": 16}, "maxProbes": 3}
    doc["spec"]["workload"]["search"] = wanted
    doc["spec"]["prometheus"] = {"url": url}
    return validation.parse_experiment(doc)[0]


def store_probe(client: FakeKube, s: spec.ExperimentSpec, round_: status.Round, speedup: float) -> str:
    """The probe's records as its own load Job writes them (its one stage, no warm-up)."""
    stage = rounds.probe_stage(s, round_)
    assert stage is not None
    recs, windows = synthetic.run(search.probe_spec(s, stage), n=300, speedup=speedup, seed=round_.probe or 0)
    files = {
        "requests.jsonl": "".join(r.model_dump_json() + "\n" for r in recs),
        "windows.json": json.dumps(
            {"anchor": {"monotonic": 0.0, "wall": 1.8e9}, "windows": [w.model_dump() for w in windows]}
        ),
        "loadgen-summary.json": json.dumps({"validity": {"valid": True}}),
    }
    return store_round(client, round_.name, files)


def measured_probe(s: spec.ExperimentSpec, index: int, load: float) -> status.Round:
    assert s.workload.search is not None
    return rounds.probe_round(s.workload.search, index, load).model_copy(update={"outcome": "Measured"})


def test_a_search_owes_its_first_probe_before_the_crossover_and_any_verdict(
    prometheus: Callable[[int, bytes], str],
) -> None:
    s = searching(prometheus(200, vector("1")), crossover="IfApart")
    client = stored(measured())
    owed = collect_in(client, s, status.ExperimentStatus(environment=apart()), {None: JOB_UID})
    assert owed.next_round is not None
    assert (owed.next_round.name, owed.next_round.probe, owed.next_round.load) == ("search1-c1", 1, 1)
    assert owed.search == status.SearchResult(axis="concurrency", ran=False)
    assert owed.crossover is None and owed.results_ref is None  # the crossover comes after the search
    assert "exp-report" not in [name for (_, name) in client.store]


def test_measured_probes_are_judged_and_the_next_one_follows_from_them(
    prometheus: Callable[[int, bytes], str],
) -> None:
    s = searching(prometheus(200, vector("1")))
    client = stored(measured())
    first, second = measured_probe(s, 1, 1), measured_probe(s, 2, 16)
    uids = {
        None: JOB_UID,
        first.name: store_probe(client, s, first, 1.3),
        second.name: store_probe(client, s, second, 0.8),
    }
    owed = collect_in(client, s, status.ExperimentStatus(rounds=[first, second]), uids)
    assert owed.next_round is not None and (owed.next_round.name, owed.next_round.load) == ("search3-c4", 4)
    assert owed.search is not None
    assert [(p.name, p.verdict) for p in owed.search.probes] == [
        ("search1-c1", status.StageVerdict.PASS),
        ("search2-c16", status.StageVerdict.FAIL),
    ]
    assert (owed.search.break_even, owed.search.first_failing, owed.search.reason) == (1, 16, None)


def test_the_search_s_end_comes_with_the_verdict_and_a_recommendation_resting_on_the_probes(
    prometheus: Callable[[int, bytes], str],
) -> None:
    s = searching(prometheus(200, vector("1")))
    client = stored(measured())
    probes = [measured_probe(s, 1, 1), measured_probe(s, 2, 16), measured_probe(s, 3, 4)]
    uids: dict[str | None, str] = {None: JOB_UID}
    for probe, speedup in zip(probes, (1.3, 0.8, 1.3), strict=True):
        uids[probe.name] = store_probe(client, s, probe, speedup)
    judged = collect_in(client, s, status.ExperimentStatus(rounds=probes), uids)
    found = judged.search
    assert judged.next_round is None and found is not None
    assert (found.reason, found.break_even, found.first_failing) == ("MaxProbes", 4, 16)
    assert judged.recommendation == recommendation.recommend(
        s, [*judged.stages, *found.probes]
    )  # as run --local
    assert judged.results_ref is not None  # the report comes with the verdict


def test_a_probe_that_failed_stops_the_search_and_the_verdict_comes(
    prometheus: Callable[[int, bytes], str],
) -> None:
    s = searching(prometheus(200, vector("1")))
    client = stored(measured())
    first = measured_probe(s, 1, 1)
    lost = measured_probe(s, 2, 16).model_copy(
        update={"outcome": "Failed", "message": "LoadJobFailed: exit 1"}
    )
    uids = {None: JOB_UID, first.name: store_probe(client, s, first, 1.3)}
    judged = collect_in(client, s, status.ExperimentStatus(rounds=[first, lost]), uids)
    found = judged.search
    assert judged.next_round is None and judged.verdict is not None and found is not None
    assert (found.reason, found.message) == ("ProbeFailed", "probe search2-c16 failed: LoadJobFailed: exit 1")
    assert [p.name for p in found.probes] == ["search1-c1"]


def test_a_probe_round_whose_fields_an_old_crd_pruned_fails_instead_of_running_again(
    prometheus: Callable[[int, bytes], str],
) -> None:
    s = searching(prometheus(200, vector("1")))
    pruned = status.Round(name="search1-c1", outcome="Measured")  # no probe, no load
    outcome = asyncio.run(
        collect.collect(
            stored(measured()),
            BODY,
            s,
            status.ExperimentStatus(rounds=[pruned]),
            OperatorSettings(),
            job_uids={None: JOB_UID},
        )
    )
    assert isinstance(outcome, reconcile.CollectFailure) and not outcome.transient
    assert outcome.reason == "CrdOutdated" and "search1-c1" in outcome.message


def test_a_run_with_only_warm_up_requests_is_no_data_not_invalid_measurement(
    prometheus: Callable[[int, bytes], str],
) -> None:
    """The analysis' own reason passes through: nothing measured is NoData (the load never ran past its
    warm-up), not the InvalidMeasurement of a run the load generator judged."""
    recs, _ = synthetic.run(experiment(), n=300)
    files = measured()
    files["requests.jsonl"] = "".join(
        r.model_copy(update={"warmup": True}).model_dump_json() + "\n" for r in recs
    )
    outcome = failure(run_collect(stored(files), experiment(prometheus(200, vector("1")))))
    assert (outcome.reason, outcome.transient) == ("NoData", False)
    assert "no measured requests" in outcome.message


def two_pods(
    files: dict[str, str],
    *,
    invalid_pod: int | None = None,
    missing_pod: int | None = None,
    unfinished: dict[int, str] | None = None,
) -> FakeKube:
    """`files` sent by two load pods: each pod's shard (index mod 2) in its own bundle, as each pod
    of the Indexed Job stores it, on a clock 0.25 s apart. `unfinished`: pod -> a stage it did not
    finish (it stopped there: its bundle, stored after every stage it finished, holds none of that
    stage's records and no window of it)."""
    client = FakeKube()
    lines = files["requests.jsonl"].splitlines()
    for k in range(2):
        if k == missing_pod:
            continue
        stopped = (unfinished or {}).get(k)
        windows = json.loads(files["windows.json"])
        windows["windows"] = [w for w in windows["windows"] if w["stage"] != stopped]
        shard = [
            line
            for line in lines
            if json.loads(line)["index"] % 2 == k and json.loads(line)["stage"] != stopped
        ]
        validity = {
            "valid": k != invalid_pod,
            "reasons": ["schedule lag p99 9 ms > budget 5 ms"] * (k == invalid_pod),
        }
        anchor = {"monotonic": 0.0, "wall": windows["anchor"]["wall"] + 0.25 * k}
        pod_files = {
            "requests.jsonl": "".join(line + "\n" for line in shard),
            "windows.json": json.dumps({**windows, "anchor": anchor}),
            "loadgen-summary.json": json.dumps({"validity": validity}),
        }
        for cm in results.build_config_maps(
            "exp-results", "exp", results.pack(pod_files), owners=[JOB_OWNER], generation=1, pod=(k, 2)
        ):
            client.add(cm)
    return client


def two_pod_experiment(url: str) -> spec.ExperimentSpec:
    return experiment(url).model_copy(
        update={"workload": experiment(url).workload.model_copy(update={"load_pods": 2})}
    )


def test_two_load_pods_results_are_merged_and_judged_as_one_pod_s(
    prometheus: Callable[[int, bytes], str],
) -> None:
    url = prometheus(200, vector("1"))
    one = run_collect(stored(measured()), experiment(url))
    two = run_collect(two_pods(measured()), two_pod_experiment(url))
    assert isinstance(one, reconcile.Judgement) and isinstance(two, reconcile.Judgement), two
    assert two.verdict is one.verdict is status.Verdict.PROMOTE
    assert [(s.name, s.verdict, s.control.requests) for s in two.stages] == [
        (s.name, s.verdict, s.control.requests) for s in one.stages
    ]
    assert two.validity is not None and two.validity.pods is not None
    assert [p.wire()["pod"] for p in two.validity.pods] == [0, 1]


def test_a_load_pod_behind_schedule_or_without_results_fails_the_run_naming_it(
    prometheus: Callable[[int, bytes], str],
) -> None:
    url = prometheus(200, vector("1"))
    invalid = failure(run_collect(two_pods(measured(), invalid_pod=1), two_pod_experiment(url)))
    assert invalid.reason == "InvalidMeasurement" and "load pod 1: schedule lag p99 9 ms" in invalid.message
    missing = failure(run_collect(two_pods(measured(), missing_pod=0), two_pod_experiment(url)))
    assert missing.reason == "ResultsMissing" and "load pod 0 of 2 stored no results" in missing.message


def salvaged(client: FakeKube, url: str) -> status.ExperimentStatus:
    """The failure of a two-pod load, with what `collect.salvage` keeps of it."""
    failed = status.ExperimentStatus(
        phase=status.Phase.FAILED, reason="LoadJobFailed", message="the load Job failed"
    )
    return asyncio.run(
        collect.salvage(client, BODY, two_pod_experiment(url), failed, OperatorSettings(), job_uid=JOB_UID)
    )


def test_a_failed_two_pod_load_keeps_the_stages_both_pods_finished_and_names_the_partial_one(
    prometheus: Callable[[int, bytes], str],
) -> None:
    url = prometheus(200, vector("1"))
    whole = salvaged(two_pods(measured()), url)
    assert [s.name for s in whole.stages] == ["low", "c16"]
    kept = salvaged(two_pods(measured(), unfinished={1: "c16"}), url)
    assert [s.name for s in kept.stages] == ["low"]
    message = kept.message or ""
    assert "the 1 of 2 stage(s) measured before that (low) are kept in status.stages" in message
    assert "stage c16: load pod 1 did not finish it" in message
    # the stage kept is the stage as both pods measured it, not one pod's half
    assert kept.stages[0].control.requests == whole.stages[0].control.requests


def test_a_load_pod_that_stored_nothing_leaves_no_stage_finished_by_both_and_is_named(
    prometheus: Callable[[int, bytes], str],
) -> None:
    kept = salvaged(two_pods(measured(), missing_pod=1), prometheus(200, vector("1")))
    assert kept.stages == []
    message = kept.message or ""
    assert message.startswith("the load Job failed; not kept, as only some load pods finished them")
    assert "stage low: load pod 1 did not finish it; stage c16: load pod 1 did not finish it" in message
