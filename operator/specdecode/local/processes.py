"""Every process of one arm, found and stopped: the leader, its group, its session and its offspring.

Why more than `killpg`: vLLM's API server starts an EngineCore process that holds the GPU memory.
On SIGTERM to the group the API server exits within seconds while the EngineCore may stay (it was
seen keeping 122 GiB of an H200 after a failed run, so every later run failed at start-up). A
child may also ignore SIGTERM, or leave the group and the session (`setsid`, `setpgid`).

So an arm's members are, on Linux (read from /proc, no extra dependency):
- every process whose session id or process group id is the leader's pid (the leader is started
  with `start_new_session=True`, so both equal its pid);
- every descendant of the leader or of another member, by parent pid;
- every process whose environment carries the arm's token (`MARKER=<token>`, set when the arm is
  started and inherited by all it spawns, including children that left the session and whose
  parent already exited, so they were reparented to init);
- every member seen at an earlier scan (`Group.remember`), if it is still the same process.

A process is named by (pid, start time), so a pid reused by an unrelated process is never
signalled. `stop` sends SIGTERM to all members, waits up to the grace period for all of them (not
only the leader), then SIGKILLs whatever remains (scanning again, as a dying process may still
fork) and waits, bounded, until they are gone; a zombie counts as gone (it holds no memory) and is
reaped when it is our child.

Elsewhere (no /proc): the leader's process group only: SIGTERM, the grace period for the leader,
then SIGKILL to the group whether or not the leader is gone; children that left the group escape.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: environment variable that marks every process of an arm (value: the arm's token)
MARKER = "SPECDECODE_ARM_TOKEN"
PROC = Path("/proc")


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/PID/stat used here."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start: int
    """Start time in clock ticks since boot: with the pid, the identity of a process."""


def stat(pid: int) -> Stat | None:
    """The process's stat, or None when it does not exist (or /proc is unreadable)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ".
    fields = raw.rsplit(")", 1)[1].split()
    return Stat(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))


def all_stats() -> list[Stat]:
    """Every process on the machine (those that vanish while reading are skipped)."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            st = stat(int(entry.name))
            if st is not None:
                found.append(st)
    return found


def has_marker(pid: int, token: str) -> bool:
    """Whether the process's environment holds MARKER=token (False when unreadable)."""
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={token}".encode() in environ.split(b"\0")


def supported() -> bool:
    """Whether processes can be found through /proc (Linux)."""
    return (PROC / "self" / "stat").exists()


def alive(pid: int, start: int) -> bool:
    """The process (pid, start) exists and is not a zombie."""
    st = stat(pid)
    return st is not None and st.start == start and st.state not in ("Z", "X")


@dataclass
class Group:
    """The processes of one arm: a leader started in its own session, and a token in their env."""

    process: subprocess.Popen[bytes]
    token: str
    known: dict[int, int] = field(default_factory=dict)
    """pid -> start time of every member seen so far (the leader included)."""

    def members(self) -> dict[int, int]:
        """The live members now (pid -> start time), remembered for later scans."""
        leader = self.process.pid
        # Until we reap the leader its pid cannot be reused, so its session and group are its own.
        ours = self.process.returncode is None
        stats = {st.pid: st for st in all_stats() if st.state not in ("Z", "X") and st.pid != os.getpid()}
        found = {
            pid: st.start
            for pid, st in stats.items()
            if (ours and leader in (st.session, st.pgrp)) or has_marker(pid, self.token)
        }
        found.update(
            {pid: start for pid, start in self.known.items() if pid in stats and stats[pid].start == start}
        )
        if ours and leader in stats:
            found[leader] = stats[leader].start
        children: dict[int, list[int]] = {}
        for st in stats.values():
            children.setdefault(st.ppid, []).append(st.pid)
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found[child] = stats[child].start
                    todo.append(child)
        self.known.update(found)
        return found

    def remember(self) -> None:
        """Scan now, so that members whose parent exits later are still known at `stop`."""
        if supported():
            self.members()

    def stop(self, *, grace_s: float = 10.0, kill_wait_s: float = 5.0) -> list[int]:
        """Stop every member; returns the pids that were still there after SIGKILL (normally none)."""
        if not supported():
            return self._stop_group_only(grace_s, kill_wait_s)
        members = self.members()
        self._signal(members, signal.SIGTERM)
        if self.process.returncode is None:  # not reaped yet, so its pid (the group id) is not reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while members and time.monotonic() < end:
            time.sleep(0.05)
            self._reap()
            members = self.members()
        for _ in range(3):  # a member may fork while dying: kill, scan again
            if not members:
                break
            self._signal(members, signal.SIGKILL)
            time.sleep(0.02)
            self._reap()
            members = self.members()
        end = time.monotonic() + kill_wait_s
        while members and time.monotonic() < end:
            time.sleep(0.05)
            self._reap()
            members = {pid: start for pid, start in members.items() if alive(pid, start)}
        self._reap()
        return sorted(members)

    def _signal(self, members: dict[int, int], sig: int) -> None:
        for pid, start in members.items():
            if alive(pid, start):  # not a pid reused since the scan
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def _reap(self) -> None:
        """Collect the leader's exit status (others are not our children unless reparented to us)."""
        self.process.poll()
        for pid in list(self.known):
            if pid != self.process.pid:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)

    def _stop_group_only(self, grace_s: float, kill_wait_s: float) -> list[int]:
        """SIGTERM the group, wait for the leader, then SIGKILL the group (members may outlive the leader)."""
        process = self.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(kill_wait_s)
        return [] if process.poll() is not None else [process.pid]
