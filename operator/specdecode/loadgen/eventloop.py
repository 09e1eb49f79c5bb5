"""The load generator's event loop: which one it runs on, keeping it on time, measuring how late it runs.

Every stamp and every send of the load generator happens on one event loop (uvloop's where
installed: `loop_factory`); a turn of the loop that runs long delays them all. `SendGate` spreads a
burst of closed-loop sends over several turns; `tick_lags` measures the loop's lag, which the run's
validity reads (`summary.py`).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

#: the loop-lag ticker's period
TICK_S = 0.010
#: closed loop: sends released per event-loop iteration (see `SendGate.turn`)
SENDS_PER_ITERATION = 8


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when installed (for `asyncio.Runner(loop_factory=...)`), else None."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def tick_lags(lags: list[float]) -> None:
    """Until cancelled: wake every TICK_S and append how late each wake-up was (ms), the event loop's lag
    (the run's validity reads it)."""
    expected = time.monotonic() + TICK_S
    while True:
        await asyncio.sleep(max(0.0, expected - time.monotonic()))
        now = time.monotonic()
        lags.append((now - expected) * 1e3)
        expected = max(expected + TICK_S, now)


class SendGate:
    """The closed loop's send slots, released a few per event-loop iteration."""

    def __init__(self) -> None:
        self._send_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._dispatching = False

    def turn(self) -> asyncio.Future[None]:
        """Wait for a send slot: at most SENDS_PER_ITERATION closed-loop sends per loop iteration.

        When a cohort of streams ends in the same engine step, hundreds of slots want to send at
        once; sending them all in one loop iteration would hold up the reading (and stamping) of
        every other stream for milliseconds. Released in FIFO order, a few per iteration.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._send_waiters.append(fut)
        if not self._dispatching:
            self._dispatching = True
            loop.call_soon(self._release_sends)
        return fut

    def _release_sends(self) -> None:
        waiters = self._send_waiters
        released = 0
        while waiters and released < SENDS_PER_ITERATION:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                released += 1
        if waiters:
            asyncio.get_running_loop().call_soon(self._release_sends)
        else:
            self._dispatching = False
