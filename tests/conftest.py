"""Shared fixtures, and the suite-wide check that no test leaves a process behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.factories import experiment_document

#: environment variable carried by every process the test session starts (value: the session's token)
MARKER = "SPECDECODE_TEST_RUN"


@pytest.fixture
def document() -> dict[str, Any]:
    return experiment_document()


def _stat(pid: str) -> list[str] | None:
    try:
        return (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def leftovers(token: str, root: int, before: set[int]) -> dict[int, str]:
    """Live processes (pid -> command line) carrying MARKER=token, or descended from `root` and not in `before`.

    Zombies are not counted: they hold no memory and their parent reaps them.
    """
    stats = {int(p.name): st for p in Path("/proc").iterdir() if p.name.isdigit() and (st := _stat(p.name))}
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(int(st[1]), []).append(pid)
    descendants, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            descendants.add(child)
            todo.append(child)
    found = {}
    for pid, st in stats.items():
        if pid == root or st[0] in ("Z", "X"):
            continue
        proc = Path("/proc") / str(pid)
        try:
            marked = f"{MARKER}={token}".encode() in (proc / "environ").read_bytes().split(b"\0")
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if marked or (pid in descendants and pid not in before):
            found[pid] = argv
    return found


def wait_for_leftovers(token: str, root: int, before: set[int], *, seconds: float) -> dict[int, str]:
    """`leftovers`, after giving processes being stopped up to `seconds` to exit."""
    end = time.monotonic() + seconds
    while True:
        found = leftovers(token, root, before)
        if not found or time.monotonic() >= end:
            return found
        time.sleep(0.1)


def _become_subreaper() -> None:
    """Orphans of the suite's processes are reparented to pytest, not to init, so that a process that
    dropped the marker from its environment and left its session is still found as a descendant
    (prctl(2) PR_SET_CHILD_SUBREAPER; Linux only, best effort)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """No run of the test suite leaves a process behind (set up first, so checked after every other teardown)."""
    if not Path("/proc/self/stat").exists():  # not Linux: nothing to scan
        yield
        return
    token = uuid.uuid4().hex
    os.environ[MARKER] = token
    _become_subreaper()
    before = set(leftovers(token, os.getpid(), set()))
    yield
    found = wait_for_leftovers(token, os.getpid(), before, seconds=10.0)
    del os.environ[MARKER]
    if found:
        lines = "\n".join(f"  {pid}: {argv}" for pid, argv in sorted(found.items()))
        pytest.fail(f"the test session left {len(found)} process(es) behind:\n{lines}", pytrace=False)
