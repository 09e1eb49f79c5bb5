"""The timing tests' real-time priority is never dropped silently (#23, audit §3, §7)."""

from __future__ import annotations

import os

import pytest

from tests.loadgen.conftest import realtime


def refuse(*args: object) -> None:
    raise PermissionError(1, "Operation not permitted")


def test_without_sched_fifo_a_timing_test_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    monkeypatch.setenv("CI", "true")
    refused = pytest.raises(pytest.fail.Exception, match=r"SCHED_FIFO refused.*CAP_SYS_NICE")
    with refused, realtime():
        pytest.fail("the body ran at normal priority")  # pragma: no cover


def test_without_sched_fifo_outside_ci_the_test_learns_it_ran_at_normal_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    monkeypatch.delenv("CI", raising=False)
    with realtime() as rt:
        assert rt is False
