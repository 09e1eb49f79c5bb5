"""The analysis lane: the operator's one thread for CPU-heavy analysis, and the slots that bound how
many experiments are collected at once.

The CPU-heavy steps (parsing the records, the statistics, rendering the report) run in one analysis
thread of their own (`in_analysis_lane`), one experiment's step at a time: kopf's event loop keeps
ticking the other experiments, the default thread pool stays free for their API calls. However
many experiments finish together, at most `COLLECTIONS` are collected at once (`one_collection`,
from reading the results to storing the report): only their results are held in memory, not every
waiting experiment's parsed records at once, while one collection's waits (the API server,
Prometheus) overlap another's analysis (benchmarks/README.md, "Many experiments").
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")
_lane: ThreadPoolExecutor | None = None
_lane_lock = threading.Lock()
_collections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)
# Collections at once. Each holds one experiment's results (at the default results limit up to
# ~300 MiB parsed, benchmarks/README.md "Results size"): two stay within the operator's 1 GiB limit;
# one at a time left the analysis thread idle while a collection waited on the API server and
# Prometheus ("Many experiments").
COLLECTIONS = 2


def one_collection() -> asyncio.Semaphore:
    """The slot that one experiment's collection holds (`COLLECTIONS` per event loop)."""
    loop = asyncio.get_running_loop()
    slots = _collections.get(loop)
    if slots is None:
        slots = _collections[loop] = asyncio.Semaphore(COLLECTIONS)
    return slots


def one_at_a_time(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """`fn` holds a slot of `one_collection()` while it runs: at most `COLLECTIONS` experiments'
    parsed records in memory at a time."""

    @functools.wraps(fn)
    async def holding(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        async with one_collection():
            return await fn(*args, **kwargs)

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
