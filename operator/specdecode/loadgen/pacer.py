"""Waking the open-loop pacer at an exact `time.monotonic()` instant.

Event-loop timers are not precise enough for a schedule-lag budget of a millisecond: uvloop (libuv)
keeps its clock and its timers in whole milliseconds and wakes up to ~2 ms late when the loop is
busy; asyncio's epoll selector rounds its timeout up to the next millisecond (loadgen-anchors
(c)4). On Linux the pacer therefore arms a `timerfd` on CLOCK_MONOTONIC (the clock behind
`time.monotonic()`) at an absolute deadline and waits for it to become readable in the event loop:
the loop's `epoll_wait` returns when the kernel's high-resolution timer fires. The last
`SPIN_S` is covered by yielding to the loop and re-reading the clock. Elsewhere it falls back to
`asyncio.sleep` plus a longer poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import time

#: with a timerfd: arm it this long before the target and poll the rest (covers the loop's own turn)
SPIN_S = 0.0002
#: without one: sleep on the loop's timer until this long before the target, then poll
FALLBACK_SPIN_S = 0.003

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not hasattr(os, "eventfd"):  # a cheap "is this Linux" (eventfd and timerfd came together)
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create  # noqa: B018 - probe the symbol
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


class Pacer:
    """Sleeps until absolute `time.monotonic()` instants; one per event loop. Use as a context manager."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = -1
        self._waiter: asyncio.Future[None] | None = None
        self._libc = _libc()
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self._loop.add_reader(fd, self._fired)

    @property
    def precise(self) -> bool:
        """A timerfd is in use."""
        return self._fd >= 0

    def __enter__(self) -> Pacer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the timerfd."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self._fd, 8)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _arm(self, at: float) -> None:
        assert self._libc is not None
        sec = int(at)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, int((at - sec) * 1e9)))
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    async def sleep_until(self, target: float) -> None:
        """Return as soon after `target` (a `time.monotonic()` value) as the loop allows."""
        spin = SPIN_S if self.precise else FALLBACK_SPIN_S
        wake = target - spin
        if wake > time.monotonic():
            if self.precise:
                self._waiter = self._loop.create_future()
                self._arm(wake)
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            else:
                await asyncio.sleep(wake - time.monotonic())
        while time.monotonic() < target:  # noqa: ASYNC110 - a deliberate sub-millisecond poll
            await asyncio.sleep(0)
