"""The analysis lane: the operator's one thread for CPU-heavy analysis, and the slots that bound how
many experiments are collected at once.

The CPU-heavy steps (parsing the records, the statistics, rendering the report) run in one analysis
thread of their own (`in_analysis_lane`), one experiment's step at a time: kopf's event loop keeps
ticking the other experiments, the default thread pool stays free for their API calls. However
many experiments finish together, only as many are collected at once (`one_at_a_time`, from reading
the results to rendering the report) as fit in `PARSED_BUDGET` by their planned results, and at most
`MOST_COLLECTIONS`: only their results are held in memory, not every waiting experiment's parsed
records at once, while one collection's waits (the API server, Prometheus) overlap another's
analysis (benchmarks/README.md, "Many experiments"). Experiments of the default results limit are
collected two at a time, as before; small ones up to eight.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from specdecode import results
from specdecode.experiment import spec, status

_P = ParamSpec("_P")
_T = TypeVar("_T")
_lane: ThreadPoolExecutor | None = None
_lane_lock = threading.Lock()
# What the collections at once may hold of parsed records: two experiments at the default results
# limit (~300 MiB parsed each, benchmarks/README.md "Results size"), within the operator's 1 GiB.
PARSED_BUDGET = 600 * 1024 * 1024
# The weight of a collection whose size is unknown: two at a time, as before the weights.
COLLECTIONS = 2
# Collections at once however small: each asks Prometheus 18 queries and the API server a few calls.
MOST_COLLECTIONS = 8
# Parsed bytes per planned byte (`results.planned_bytes`, 300 B a record, a lower bound within 2x):
# ~1.6 KB a parsed record (benchmarks/README.md, "Results at scale"), doubled for that bound.
PARSED_PER_PLANNED = 12
# The least a collection weighs (the report's rendering, Prometheus' answers).
MIN_WEIGHT = 16 * 1024 * 1024


class _Slots:
    """A budget shared in order of arrival: a collection starts when it is first in line and its
    weight fits (a big one is not overtaken for ever by small ones)."""

    def __init__(self) -> None:
        self.free = PARSED_BUDGET
        self.running = 0
        self.waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def hold(self, weight: int) -> None:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((weight, granted))
        self._grant()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(weight)  # granted as it was cancelled
            else:
                self.waiting.remove((weight, granted))
                self._grant()
            raise

    def release(self, weight: int) -> None:
        self.free += weight
        self.running -= 1
        self._grant()

    def _grant(self) -> None:
        while self.waiting and self.running < MOST_COLLECTIONS and self.waiting[0][0] <= self.free:
            weight, granted = self.waiting.popleft()
            if granted.done():
                continue
            self.free -= weight
            self.running += 1
            granted.set_result(None)


_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slots] = weakref.WeakKeyDictionary()


def weight(experiment: spec.ExperimentSpec | None, current: status.ExperimentStatus | None = None) -> int:
    """What one collection of `experiment` may hold of parsed records: its planned results, once
    for the stages and once for each round measured since (the fold reads them all); an unknown
    experiment weighs `PARSED_BUDGET / COLLECTIONS`."""
    if experiment is None:
        return PARSED_BUDGET // COLLECTIONS
    runs = 1 + (len(current.rounds) if current is not None else 0)
    planned = PARSED_PER_PLANNED * results.planned_bytes(experiment) * runs
    return min(PARSED_BUDGET, max(MIN_WEIGHT, planned))


def one_at_a_time(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """`fn` (called with `experiment` and, if it has one, `current`) holds its weight of the
    collections' budget while it runs: the parsed records in memory at once stay bounded."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    async def holding(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        bound = signature.bind_partial(*args, **kwargs).arguments
        mine = weight(bound.get("experiment"), bound.get("current"))
        loop = asyncio.get_running_loop()
        slots = _slots.get(loop)
        if slots is None:
            slots = _slots[loop] = _Slots()
        await slots.hold(mine)
        try:
            return await fn(*args, **kwargs)
        finally:
            slots.release(mine)

    return holding


async def in_analysis_lane(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run `fn` in the operator's single analysis thread (created on first use, shared by every
    experiment), off the event loop and out of the default pool that the API calls use."""
    global _lane
    with _lane_lock:
        if _lane is None:
            _lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdecode-analysis")
        lane = _lane
    return await asyncio.get_running_loop().run_in_executor(lane, functools.partial(fn, *args, **kwargs))
