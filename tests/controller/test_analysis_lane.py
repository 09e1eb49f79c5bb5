"""Analysis off the event loop (controller/collect.py, `in_analysis_lane`): parse, statistics and
report run in one thread of their own, one at a time, so one big experiment stalls neither kopf's
event loop nor the thread pool the other experiments' API calls run in."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from specdecode import results
from specdecode.controller import collect
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import reconcile, status, validation
from tests.controller.fake_kube import FakeKube
from tests.factories import experiment_document

JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "exp-load", "uid": "job-uid"}


def test_slow_analyses_run_one_at_a_time_and_leave_the_loop_and_the_api_threads_free() -> None:
    lock = threading.Lock()
    running = most = 0

    def slow_analysis(x: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.2)  # CPU-bound work holds its thread (and, in bursts, the GIL) this long
        with lock:
            running -= 1
        return x

    async def scenario() -> tuple[float, float, list[int]]:
        loop = asyncio.get_running_loop()
        # More finished experiments than the default pool has threads (min(32, cores + 4)).
        analyses = [asyncio.create_task(collect.in_analysis_lane(slow_analysis, i)) for i in range(40)]
        await asyncio.sleep(0.05)
        started = loop.time()
        await asyncio.to_thread(lambda: None)  # another experiment's API call (kube.py runs them so)
        api_call = loop.time() - started
        lags = []
        for _ in range(10):
            before = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - before - 0.01)
        for task in analyses:
            task.cancel()  # a cancelled tick: the lane drops the analyses not yet started
        done = [t.result() for t in analyses if t.done() and not t.cancelled()]
        return api_call, max(lags), done

    api_call, lag, done = asyncio.run(scenario())
    assert most == 1
    assert api_call < 0.15, f"an API call waited {api_call:.2f} s behind the analyses"
    assert lag < 0.1, f"the event loop lagged {lag:.2f} s"
    assert done == list(range(len(done)))


def test_the_results_are_parsed_in_the_analysis_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"requests.jsonl": "", "windows.json": "{}", "loadgen-summary.json": "{}"}
    client = FakeKube()
    for cm in results.build_config_maps(
        "exp-results", "exp", results.pack(files), owners=[JOB_OWNER], generation=1
    ):
        client.add(cm)
    threads: list[str] = []
    parse = results.parse

    def parse_and_note(found: Any) -> Any:
        threads.append(threading.current_thread().name)
        return parse(found)

    monkeypatch.setattr(results, "parse", parse_and_note)
    metadata = {"name": "exp", "namespace": "ns", "generation": 1}
    recs, _, windows, _ = asyncio.run(
        collect.read_results(client, metadata, OperatorSettings(), job_uid="job-uid")  # type: ignore[arg-type]
    )
    assert (recs, windows) == ([], [])
    assert len(threads) == 1 and threads[0].startswith("specdecode-analysis")


def test_at_most_two_experiments_are_collected_at_once_so_only_their_results_are_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fifty experiments finishing together must not each hold their parsed records while they
    wait for the analysis thread: collections, from reading the results to storing the report,
    run `COLLECTIONS` (2) at a time (benchmarks/README.md, "Many experiments")."""
    inside = most = 0

    async def slow_read(*_: Any, **__: Any) -> Any:
        """The first step of a collection (and of a salvage), slowed down: reading the results."""
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.02)  # reading results, asking Prometheus: the loop goes on meanwhile
        inside -= 1
        return reconcile.CollectFailure("NoResults", "none")

    async def unreadable(*args: Any, **kwargs: Any) -> Any:
        await slow_read()
        raise results.ResultsError("unreadable")

    monkeypatch.setattr(collect, "measured", slow_read)
    monkeypatch.setattr(collect, "read_results", unreadable)
    failed = status.ExperimentStatus(phase=status.Phase.FAILED)
    body = {"metadata": {"name": "exp", "namespace": "ns"}}

    async def scenario() -> list[Any]:
        kwargs: dict[str, Any] = {"job_uids": {}}
        calls = [collect.collect(FakeKube(), body, None, None, None, **kwargs) for _ in range(5)]  # type: ignore[arg-type]
        # (a salvage reads as many load pods' results as the spec's workload.loadPods says)
        spec = validation.parse_experiment(experiment_document())[0]
        calls += [collect.salvage(FakeKube(), body, spec, failed, None, job_uid=None) for _ in range(3)]  # type: ignore[arg-type]
        return list(await asyncio.gather(*calls))

    outcomes = asyncio.run(scenario())
    assert [o.reason for o in outcomes[:5]] == ["NoResults"] * 5
    assert outcomes[5:] == [failed] * 3  # a salvage that finds nothing leaves the status as it was
    assert collect.COLLECTIONS == most == 2
