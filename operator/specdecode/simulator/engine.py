"""The real-time engine loop: runs the scheduler against absolute step deadlines.

Invariants:
- one loop owns the scheduler; requests join the waiting queue and are admitted at the next boundary;
- step n ends at `anchor + Σ durations` (absolute deadlines): a late wake-up shortens the next wait
  instead of shifting every later step, so lateness never accumulates; the anchor resets only when
  the engine goes idle;
- a step's chunks are rendered while waiting for its deadline and written right at it, before the
  step's metrics are updated; asyncio's
  timers have millisecond granularity, so the loop wakes `wake_margin_s` early and spins to the
  deadline on `time.monotonic()`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from specdecode.simulator.scheduler import Scheduler, Sequence

log = logging.getLogger(__name__)


class Engine:
    """Owns the scheduler and the step loop."""

    def __init__(self, scheduler: Scheduler, *, wake_margin_s: float = 0.0015) -> None:
        self.scheduler = scheduler
        self.wake_margin_s = wake_margin_s
        self._wake = asyncio.Event()
        self._stopping = False

    def submit(self, seq: Sequence) -> None:
        """Queue a request after the API-server overhead; wakes the loop when idle."""
        overhead = self.scheduler.params.request_overhead_ms / 1000.0
        if overhead > 0:
            asyncio.get_running_loop().call_at(
                asyncio.get_running_loop().time() + overhead - (time.monotonic() - seq.arrival),
                self._enqueue,
                seq,
            )
        else:
            self._enqueue(seq)

    def _enqueue(self, seq: Sequence) -> None:
        if seq.aborted:
            return
        self.scheduler.add(seq)
        self._wake.set()

    def stop(self) -> None:
        """Ask the loop to end after the current step."""
        self._stopping = True
        self._wake.set()

    async def _sleep_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic() - self.wake_margin_s
        if delay > 0:
            await asyncio.sleep(delay)
        while time.monotonic() < deadline:
            pass

    async def run(self) -> None:
        """The loop; returns after `stop()`."""
        sched = self.scheduler
        anchor: float | None = None
        while not self._stopping:
            if not sched.has_work():
                anchor = None
                self._wake.clear()
                await self._wake.wait()
                continue
            if anchor is None:
                anchor = time.monotonic()
            step = sched.plan(anchor)
            if step is None:
                anchor = None
                # Only aborted requests were queued; wait for new work.
                await asyncio.sleep(0)
                continue
            for em in step.emissions:
                sink = em.seq.sink
                if sink is not None:
                    sink.prepare(em)
            deadline = anchor + step.duration_s
            await self._sleep_until(deadline)
            # Write first, account after: metrics and state updates do not delay the chunks.
            for em in step.emissions:
                sink = em.seq.sink
                if sink is not None:
                    sink.flush(em, deadline)
            sched.complete(step, deadline)
            anchor = deadline
