"""The suite-wide leak check (tests/conftest.py) sees a process left behind, and forgets it once gone."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import MARKER, leftovers, wait_for_leftovers


def test_a_process_that_left_the_session_and_the_tree_is_still_found_by_its_marker() -> None:
    token = os.environ[MARKER]
    before = set(leftovers(token, os.getpid(), set()))
    # detached: its own session, and its parent (the shell) exits at once, so it is not our descendant
    shell = subprocess.run(
        [
            "sh",
            "-c",
            f"setsid {sys.executable} -c 'import time; time.sleep(60)' leak-probe >/dev/null 2>&1 & echo $!",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(shell.stdout.strip())
    try:
        found = leftovers(token, os.getpid(), before)
        assert pid in found and "leak-probe" in found[pid]
    finally:
        os.kill(pid, 9)
    assert pid not in wait_for_leftovers(token, os.getpid(), before, seconds=5.0)
