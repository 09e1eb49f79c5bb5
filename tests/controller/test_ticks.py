"""When an experiment's tick runs (controller/ticks.py): an interval after the last one, at once when
its load Job ends (`handlers.wake_on_load_job`), never on a body older than the last tick's patch,
and never after kopf stopped the timer (a deleted experiment's finalizer waits for that)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import kopf

from specdecode import results
from specdecode.controller import handlers, kube, ticks
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import keys, manifests, validation
from tests.controller.fake_kube import FakeKube, Operator
from tests.controller.test_handlers import document, ready_pod, run

KEY = ("ns", "exp")


class Stopped:
    """kopf's `stopped` kwarg of a timer: false until kopf stops the timer, then awaitable."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self, seconds: float | None = None) -> None:
        await self.event.wait()


async def waited(schedule: ticks.Ticks, stopped: Stopped, phase: str | None = None) -> tuple[bool, float]:
    """(due's answer, seconds it took)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    due = await schedule.due(KEY, stopped, lambda: phase)
    return due, loop.time() - started


def test_a_first_tick_is_due_at_once_and_the_next_an_interval_later() -> None:
    async def scenario() -> list[tuple[bool, float]]:
        schedule, stopped = ticks.Ticks(0.3), Stopped()
        first = await waited(schedule, stopped)
        schedule.ticked(KEY, None)
        return [first, await waited(schedule, stopped)]

    (first_due, first), (second_due, second) = asyncio.run(scenario())
    assert first_due and second_due
    assert first < 0.05 and 0.25 < second < 1.0, (first, second)


def test_a_wake_up_makes_the_tick_due_at_once_and_only_once() -> None:
    async def scenario() -> tuple[float, bool, float]:
        schedule, stopped = ticks.Ticks(30.0), Stopped()
        schedule.ticked(KEY, None)
        asyncio.get_running_loop().call_later(0.1, schedule.wake, KEY)
        _, woken = await waited(schedule, stopped)
        left = schedule.woken(KEY)  # taken by this tick: the next waits again
        schedule.wake(KEY)  # during a tick: the next one is due as soon as it ends
        schedule.ticked(KEY, None)
        _, during = await waited(schedule, stopped)
        return woken, left, during

    woken, left, during = asyncio.run(scenario())
    assert not left
    assert 0.05 < woken < 1.0, woken
    assert during < 0.05, during


def test_without_a_wake_up_the_tick_waits_its_interval() -> None:
    async def scenario() -> bool:
        schedule, stopped = ticks.Ticks(30.0), Stopped()
        schedule.ticked(KEY, None)
        try:
            await asyncio.wait_for(schedule.due(KEY, stopped, lambda: None), 0.3)
        except TimeoutError:
            return False
        return True

    assert asyncio.run(scenario()) is False


def test_a_stopped_timer_is_not_due_and_stops_waiting_at_once() -> None:
    """A deleted experiment: kopf stops its timer and removes the finalizer once the handler returns,
    so the wait for the next tick (30 s here) must end with the stop."""

    async def scenario() -> tuple[bool, float]:
        schedule, stopped = ticks.Ticks(30.0), Stopped()
        schedule.ticked(KEY, None)
        asyncio.get_running_loop().call_later(0.1, stopped.event.set)
        return await waited(schedule, stopped)

    due, seconds = asyncio.run(scenario())
    assert due is False and seconds < 1.0, seconds


def test_a_woken_tick_waits_for_the_body_to_show_the_last_tick_s_phase() -> None:
    """kopf's body follows the watch: a tick woken right after another must not judge a body from
    before that tick's patch (it would collect and post the verdict twice)."""

    async def scenario() -> tuple[float, float]:
        schedule, stopped = ticks.Ticks(30.0), Stopped()
        body = {"phase": "Running"}
        schedule.ticked(KEY, "Completed")
        schedule.wake(KEY)
        asyncio.get_running_loop().call_later(0.3, body.update, {"phase": "Completed"})
        _, caught_up = await waited_on(schedule, stopped, body)
        schedule.ticked(KEY, "Completed")
        schedule.wake(KEY)
        _, at_once = await waited_on(schedule, stopped, body)
        return caught_up, at_once

    caught_up, at_once = asyncio.run(scenario())
    assert 0.25 < caught_up < 1.5, caught_up
    assert at_once < 0.05, at_once


async def waited_on(schedule: ticks.Ticks, stopped: Stopped, body: dict[str, Any]) -> tuple[bool, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    due = await schedule.due(KEY, stopped, lambda: body.get("phase"))
    return due, loop.time() - started


def load_job(client: FakeKube) -> dict[str, Any]:
    return client.named(kube.JOB, "exp-load")


def test_the_end_of_the_load_job_is_judged_at_once_not_an_interval_later(
    operator_events: list[tuple[str, str]],
) -> None:
    """The reconcile timer as kopf runs it (the handler, its patch applied, `ticks.POLL` apart) with a
    30 s interval: the load Job's end, seen by `wake_on_load_job`, brings the tick that judges the
    results within a second."""
    client = FakeKube()
    operator = Operator(client, document(), settings=OperatorSettings(interval=30.0))
    operator.body["metadata"]["namespace"] = "ns"
    run(operator, 2)  # Deploying: the children exist
    for arm in ("control", "treatment"):
        client.add(ready_pod(arm, "stages"))
    operator.body["status"].update(phase="Running", phaseStartedAt=datetime.now(UTC).isoformat())
    built = manifests.build_load_job("exp", validation.parse_experiment(document())[0], manifests.Settings())
    built["metadata"]["annotations"] = {keys.GENERATION_ANNOTATION: "1"}
    client.add(built)
    forged = results.pack_legacy({"requests.jsonl": "FORGED", "windows.json": "{}"})
    for cm in results.build_config_maps("exp-results", "exp", forged, generation=1):
        client.add(cm)

    async def timer(stopped: Stopped) -> None:
        while not stopped:
            patch = kopf.Patch()
            await handlers.reconcile_experiment(
                body=kopf.Body(operator.body),
                patch=patch,
                memo=operator.memo,
                logger=_Logger(),
                stopped=stopped,
            )
            operator._apply(patch.get("status") or {})
            await asyncio.sleep(ticks.POLL)

    async def scenario() -> tuple[str, float]:
        stopped = Stopped()
        task = asyncio.create_task(timer(stopped))
        await asyncio.sleep(0.5)  # the first tick: the load is running
        assert operator.body["status"]["phase"] == "Running", operator.body["status"]
        ended = load_job(client)
        ended["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        ended["metadata"]["namespace"] = "ns"  # the API server's; FakeKube keeps one namespace
        loop = asyncio.get_running_loop()
        started = loop.time()
        await handlers.wake_on_load_job(body=kopf.Body(ended), memo=operator.memo)
        for _ in range(250):  # 5 s at most
            if operator.body["status"]["phase"] != "Running":
                break
            await asyncio.sleep(0.02)
        seconds = loop.time() - started
        stopped.event.set()
        await asyncio.wait_for(task, 2.0)
        return operator.body["status"]["phase"], seconds

    phase, seconds = asyncio.run(scenario())
    assert phase == "Failed" and seconds < 1.0, (phase, seconds)  # ResultsUntrusted: judged at once


def test_only_a_load_job_that_ended_wakes_its_experiment() -> None:
    memo = kopf.Memo(ticks=ticks.Ticks(5.0))
    labels = {keys.LABEL_EXPERIMENT: "exp", keys.LABEL_COMPONENT: "load"}

    def job(conditions: list[dict[str, str]]) -> kopf.Body:
        meta = {"name": "exp-load", "namespace": "ns", "labels": labels}
        return kopf.Body({"metadata": meta, "status": {"conditions": conditions}})

    asyncio.run(handlers.wake_on_load_job(body=job([]), memo=memo))
    asyncio.run(handlers.wake_on_load_job(body=job([{"type": "Complete", "status": "False"}]), memo=memo))
    assert not memo.ticks.woken(KEY)
    asyncio.run(handlers.wake_on_load_job(body=job([{"type": "Failed", "status": "True"}]), memo=memo))
    assert memo.ticks.woken(KEY)
    other = ticks.Ticks(5.0)
    asyncio.run(
        handlers.wake_on_load_job(
            body=job([{"type": "Complete", "status": "True"}]), memo=kopf.Memo(ticks=other)
        )
    )
    assert other.woken(KEY) and not other.woken(("ns", "other"))


class _Logger:
    def info(self, message: str) -> None:
        pass

    def warning(self, message: str) -> None:
        pass
