"""Fake vLLM servers in their own processes on loopback (`fakevllm.py`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import e2e_skips

FAKE = Path(__file__).with_name("fakevllm.py")


class FakeServer:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(FAKE), "--port", "0", "--realtime", *args], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def truth(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/truth", timeout=10) as resp:
            data: dict[str, Any] = json.load(resp)
        return data

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextlib.contextmanager
def realtime() -> Iterator[bool]:
    """Run this thread under SCHED_FIFO (when permitted) for timing measurements.

    The timing tests compare the client's stamps with the server's to the sub-millisecond; on a
    shared CI machine with more runnable processes than cores, the OS scheduler alone delays a
    normal-priority process by milliseconds. The fake servers start the same way (`--realtime`).
    Yields whether it took effect; the timing tests put that into each attempt's figures. In CI
    (`CI=true`) a refusal fails the test: its limits were set under real-time priority, and a CI
    runner without it would run them silently at normal priority (#23).
    """
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, PermissionError, OSError) as exc:
        if e2e_skips.in_ci():
            pytest.fail(
                f"SCHED_FIFO refused ({type(exc).__name__}): this timing test's limits assume real-time "
                "priority; give the CI job CAP_SYS_NICE (or run it as root)"
            )
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, before[0], before[1])


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    started: list[FakeServer] = []

    def start(*args: str) -> FakeServer:
        server = FakeServer(*args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
