"""When an experiment's next reconcile tick is due: an interval after its last one, or at once when
something it waits for has happened (its load Job ended: `handlers.wake_on_load_job`).

kopf's timer sleeps its interval on an event that nothing outside it can set, so a load Job ending
just after a tick waited up to a whole interval for the next one (benchmarks/README.md, "Many
experiments"). The timer therefore runs with a short interval of its own (`POLL`) and its handler
first waits here: for the experiment's interval, for a wake-up, or for kopf stopping the timer
(the experiment deleted, the operator exiting), whichever comes first. kopf still runs one tick of
an experiment at a time, applies its status patch and backs off after a failure.

A tick woken right after the previous one could read a body from before that tick's status patch
(kopf's live body follows the watch): it first waits, at most an interval, until the body shows the
phase the previous tick wrote, so it never judges or posts the same outcome twice.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# The kopf timer's own interval: how soon after a tick the handler runs again to wait for the next.
POLL = 0.1
# How often a woken tick looks at the body again while it waits for the previous tick's patch.
CATCH_UP_POLL = 0.05

Key = tuple[str, str]  # (namespace, name)


class Stopped(Protocol):
    """kopf's `stopped` kwarg of a timer (a `kopf.DaemonStopped`): true, and awaitable, once kopf stops it."""

    def __bool__(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> Awaitable[Any]: ...


@dataclass
class _Experiment:
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    last_end: float | None = None  # when its last tick ended (None: it never ticked here)
    wrote: str | None = None  # the phase its last tick wrote


class Ticks:
    """Each experiment's tick schedule in this operator (one per process, in kopf's memo)."""

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._experiments: dict[Key, _Experiment] = {}

    def _of(self, key: Key) -> _Experiment:
        return self._experiments.setdefault(key, _Experiment())

    def wake(self, key: Key) -> None:
        """Tick `key` now (or as soon as its tick in progress ends)."""
        self._of(key).woken.set()

    def woken(self, key: Key) -> bool:
        """Whether a wake-up of `key` waits for its next tick."""
        found = self._experiments.get(key)
        return found is not None and found.woken.is_set()

    def forget(self, key: Key) -> None:
        """The experiment is gone: drop its schedule."""
        self._experiments.pop(key, None)

    def ticked(self, key: Key, phase: str | None) -> None:
        """`key`'s tick ended having written `phase` (the next one waits for the body to show it)."""
        found = self._of(key)
        found.last_end, found.wrote = self._clock(), phase

    async def due(self, key: Key, stopped: Stopped, phase: Callable[[], str | None]) -> bool:
        """Wait until `key`'s next tick is due; False when kopf stopped the timer meanwhile.
        A first tick is due at once. `phase`: the phase of the experiment's live body."""
        found = self._of(key)
        if found.last_end is not None:
            remaining = found.last_end + self.interval - self._clock()
            if remaining > 0 and not found.woken.is_set():
                await _first(remaining, found.woken.wait(), stopped.wait())
        if stopped:
            return False
        found.woken.clear()  # a wake-up from now on is for the tick after this one
        for _ in range(math.ceil(self.interval / CATCH_UP_POLL)):  # at most an interval
            if found.wrote is None or phase() == found.wrote or stopped:
                break
            await asyncio.sleep(CATCH_UP_POLL)
        return not stopped


async def _first(seconds: float, *waits: Awaitable[Any]) -> None:
    """Until the first of `waits` completes or `seconds` pass; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
