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
from specdecode.controller import collect, lane, reading
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
        reading.read_results(client, metadata, OperatorSettings(), job_uid="job-uid")  # type: ignore[arg-type]
    )
    assert (recs, windows) == ([], [])
    assert len(threads) == 1 and threads[0].startswith("specdecode-analysis")


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Collections and salvages whose first step (reading the results) is slowed down; returns
    [inside, most]: how many are inside at once, the most there were."""
    count = [0, 0]

    async def slow_read(*_: Any, **__: Any) -> Any:
        count[0] += 1
        count[1] = max(count[1], count[0])
        await asyncio.sleep(0.02)  # reading results, asking Prometheus: the loop goes on meanwhile
        count[0] -= 1
        return reconcile.CollectFailure("NoResults", "none")

    async def unreadable(*args: Any, **kwargs: Any) -> Any:
        await slow_read()
        raise results.ResultsError("unreadable")

    monkeypatch.setattr(collect, "measured", slow_read)
    monkeypatch.setattr(collect, "read_finished", unreadable)
    return count


BODY = {"metadata": {"name": "exp", "namespace": "ns"}}
FAILED = status.ExperimentStatus(phase=status.Phase.FAILED)


def test_experiments_of_unknown_size_are_collected_two_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty experiments finishing together must not each hold their parsed records while they
    wait for the analysis thread: collections, from reading the results to rendering the report,
    of results the operator cannot size run `COLLECTIONS` (2) at a time ("Many experiments")."""
    count = _counting(monkeypatch)

    async def scenario() -> list[Any]:
        calls = [collect.collect(FakeKube(), BODY, None, None, None, job_uids={}) for _ in range(5)]  # type: ignore[arg-type]
        return list(await asyncio.gather(*calls))

    assert [o.reason for o in asyncio.run(scenario())] == ["NoResults"] * 5
    assert collect.COLLECTIONS == count[1] == 2


def test_small_experiments_are_collected_up_to_eight_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 requests a stage plan well under a MiB of results: their collections' waits overlap, up
    to `MOST_COLLECTIONS`."""
    count = _counting(monkeypatch)
    small = validation.parse_experiment(experiment_document())[0]

    async def scenario() -> list[Any]:
        # (a salvage reads as many load pods' results as the spec's workload.loadPods says)
        calls = [collect.salvage(FakeKube(), BODY, small, FAILED, None, job_uid=None) for _ in range(12)]  # type: ignore[arg-type]
        return list(await asyncio.gather(*calls))

    assert asyncio.run(scenario()) == [FAILED] * 12  # a salvage that finds nothing leaves the status
    assert lane.MOST_COLLECTIONS == count[1] == 8


def test_a_collection_weighs_its_planned_results_and_waits_its_turn() -> None:
    """An experiment planning the default results limit weighs half the budget (two at a time); a
    big one first in line is not overtaken by small ones that would fit beside the running one."""
    small = validation.parse_experiment(experiment_document())[0]
    assert small is not None and lane.weight(small) == lane.MIN_WEIGHT
    document = experiment_document()
    document["spec"]["workload"]["requestsPerStage"] = 50_000  # 2 stages: ~57 MiB planned
    big = validation.parse_experiment(document)[0]
    assert big is not None and lane.weight(big) == lane.PARSED_BUDGET
    assert lane.weight(None) == lane.PARSED_BUDGET // 2
    order: list[str] = []

    async def scenario() -> None:
        slots = lane._Slots()
        await slots.hold(lane.PARSED_BUDGET // 2)  # one running

        async def one(name: str, weight: int) -> None:
            await slots.hold(weight)
            order.append(name)

        waiting = [
            asyncio.create_task(one("big", lane.PARSED_BUDGET)),
            asyncio.create_task(one("small", lane.MIN_WEIGHT)),
        ]
        await asyncio.sleep(0.01)
        assert order == []  # the small one fits, but the big one is first
        slots.release(lane.PARSED_BUDGET // 2)
        await asyncio.sleep(0.01)
        assert order == ["big"]
        slots.release(lane.PARSED_BUDGET)
        await asyncio.gather(*waiting)

    asyncio.run(scenario())
    assert order == ["big", "small"]
