"""Stopping an arm stops all of it: children that ignore SIGTERM, leave the group, or outlive the leader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from specdecode.experiment import spec
from specdecode.local import engines, processes
from tests.factories import experiment_document
from tests.local.conftest import alive_after, processes_with
from tests.local.fakebin import vllm as fake_vllm

# The leader: starts one child, the fake vLLM's EngineCore (MODE: group | session | hidden), prints its
# pid, exits on SIGTERM.
LEADER = """
import os, signal, subprocess, sys, time
mode, tag = sys.argv[1], sys.argv[2]
env = dict(os.environ)
if mode == "hidden":
    env.pop("SPECDECODE_ARM_TOKEN")
child = subprocess.Popen([sys.executable, "-c", sys.argv[3], mode, tag], env=env)
print(child.pid, flush=True)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    time.sleep(1)
"""


def start(mode: str, tag: str) -> tuple[processes.Group, int]:
    token = f"test-{uuid.uuid4().hex}"
    process = subprocess.Popen(
        [sys.executable, "-c", LEADER, mode, tag, fake_vllm.ENGINECORE],
        stdout=subprocess.PIPE,
        env={**os.environ, processes.MARKER: token},
        start_new_session=True,
    )
    assert process.stdout is not None
    child = int(process.stdout.readline())
    process.stdout.close()
    time.sleep(0.2)  # the child's setsid
    return processes.Group(process, token), child


@pytest.fixture
def tag() -> str:
    return f"probe-{uuid.uuid4().hex}"


@pytest.mark.parametrize("mode", ["group", "session"])
def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tag: str, mode: str) -> None:
    group, child = start(mode, tag)
    began = time.monotonic()
    assert group.stop(grace_s=1.0) == []
    assert time.monotonic() - began >= 1.0  # it waited for the child, not only for the leader
    assert processes_with(tag.encode()) == []
    assert group.process.returncode == 0 and alive_after([child], 0.0) == []


def test_a_child_without_the_token_that_left_the_session_is_found_when_seen_before(tag: str) -> None:
    group, _ = start("hidden", tag)
    group.remember()  # as `wait_healthy` does once the arm answers
    os.kill(group.process.pid, signal.SIGTERM)
    group.process.wait(5)  # the leader is gone: the child is an orphan in its own session
    assert group.stop(grace_s=0.5) == []
    assert processes_with(tag.encode()) == []


def test_an_orphan_of_a_leader_that_crashed_is_still_stopped(tag: str) -> None:
    """The H200 failure: the API server died, its EngineCore kept the GPU."""
    group, child = start("session", tag)
    os.kill(group.process.pid, signal.SIGKILL)
    group.process.wait(5)
    assert alive_after([child], 0.0) == [child]
    assert group.stop(grace_s=0.5) == []
    assert processes_with(tag.encode()) == []


def test_processes_of_another_arm_are_left_alone(tag: str) -> None:
    other_tag = f"{tag}-other"
    group, _ = start("session", tag)
    other, other_child = start("session", other_tag)
    try:
        assert group.stop(grace_s=0.5) == []
        assert processes_with(tag.encode()) == []
        assert alive_after([other.process.pid, other_child], 0.0) == [other.process.pid, other_child]
    finally:
        assert other.stop(grace_s=0.5) == []


def test_members_are_named_by_pid_and_start_time(tag: str) -> None:
    group, child = start("group", tag)
    try:
        members = group.members()
        assert {group.process.pid, child} <= set(members)
        st = processes.stat(child)
        assert st is not None and members[child] == st.start
        assert not processes.alive(child, st.start + 1)  # the same pid with another start is another process
    finally:
        group.stop(grace_s=0.2)


def test_stop_without_proc_falls_back_to_the_process_group(
    tag: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    group, child = start("group", tag)
    monkeypatch.setattr(processes, "PROC", tmp_path)  # no /proc: as on macOS
    assert group.stop(grace_s=0.5) == []
    monkeypatch.undo()
    assert alive_after([child], 5.0) == []  # the group got SIGKILL after the grace period


def engines_with_one_arm(tag: str, tmp_path: Path) -> tuple[engines.Engines, int]:
    s = spec.ExperimentSpec.model_validate(experiment_document()["spec"])
    arms = engines.Engines(s, tmp_path)
    group, child = start("group", tag)
    arms.arms[spec.Arm.CONTROL] = engines.Arm(
        spec.Arm.CONTROL, "http://127.0.0.1:1", group.process, group=group
    )
    return arms, child


def interrupt_in(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_while_an_arm_is_stopped_takes_effect_once_it_is_stopped(
    tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, "STOP_GRACE_S", 1.0)
    arms, child = engines_with_one_arm(tag, tmp_path)
    timer = interrupt_in(0.2)  # during the grace period: the child ignores SIGTERM
    with pytest.raises(KeyboardInterrupt):
        arms.stop(spec.Arm.CONTROL)
    timer.join()
    assert processes_with(tag.encode()) == [] and alive_after([child], 0.0) == []


def test_ctrl_c_while_the_run_ends_does_not_interrupt_the_stop(
    tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, "STOP_GRACE_S", 1.0)
    arms, child = engines_with_one_arm(tag, tmp_path)
    timer = interrupt_in(0.2)
    assert arms.stop_all() == []  # no KeyboardInterrupt: the run is ending anyway
    timer.join()
    assert processes_with(tag.encode()) == [] and alive_after([child], 0.0) == []
