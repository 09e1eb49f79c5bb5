"""Shared fixtures, and the suite-wide check that no test leaves a process behind."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import e2e_skips
from tests.factories import experiment_document

#: environment variable carried by every process the test session starts (value: the session's token)
MARKER = "SPECDECODE_TEST_RUN"


#: an empty kubeconfig, $KUBECONFIG for the whole session (see pytest_configure)
EMPTY_KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n"


def pytest_configure(config: pytest.Config) -> None:
    # Nothing the tests start reaches the developer's cluster by accident (#23): kubectl, helm or a
    # Kubernetes client that is not handed the test cluster's kubeconfig finds an empty one (not
    # ~/.kube/config, as with KUBECONFIG unset). The e2e tests use their own control plane, or the
    # opt-in $SPECDECODE_E2E_KUBECONFIG (tests/e2e/README.md).
    empty = Path(tempfile.mkdtemp(prefix="specdecode-kubeconfig-")) / "config"
    empty.write_text(EMPTY_KUBECONFIG)
    empty.chmod(0o600)  # helm warns about a group- or world-readable kubeconfig
    os.environ["KUBECONFIG"] = str(empty)
    # The ctrl-c tests press ctrl-c as a terminal does. A suite started in the background of a
    # non-interactive shell (`make test &` in a script, CI wrappers) inherits SIGINT ignored, and an
    # ignored signal stays ignored across exec: every process the tests start would shrug ctrl-c off
    # and those tests fail for the launcher's reason, not the product's. A handled SIGINT is reset to
    # the default in each child, so the children get a terminal's SIGINT again.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    e2e_skips.register(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    empty = Path(os.environ.get("KUBECONFIG", ""))
    if empty.name == "config" and empty.parent.name.startswith("specdecode-kubeconfig-"):
        shutil.rmtree(empty.parent, ignore_errors=True)


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


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """No run of the test suite leaves a process behind (set up first, so checked after every other teardown).

    Found: every process with this session's MARKER in its environment (inherited by all that tests
    start, also after setsid and reparenting), and pytest's own new descendants. Not found: a process
    that both clears its environment and is orphaned (pytest is not made a child subreaper: orphans of
    daemonising e2e components would then stay zombies under pytest, and `kill(pid, 0)` would call them
    alive).
    """
    if not Path("/proc/self/stat").exists():  # not Linux: nothing to scan
        yield
        return
    token = uuid.uuid4().hex
    os.environ[MARKER] = token
    before = set(leftovers(token, os.getpid(), set()))
    yield
    found = wait_for_leftovers(token, os.getpid(), before, seconds=10.0)
    os.environ.pop(MARKER, None)
    if found:
        lines = "\n".join(f"  {pid}: {argv}" for pid, argv in sorted(found.items()))
        pytest.fail(f"the test session left {len(found)} process(es) behind:\n{lines}", pytrace=False)
