"""Both arms as local processes: the simulator, `vllm serve` on local GPUs, or servers given by URL.

Each arm runs exactly the command line the operator would render (`manifests.serve_args`), bound
to 127.0.0.1 on a free port instead of 0.0.0.0:8000. Each arm starts in its own session with a
token in its environment, so that stopping it stops everything it spawned, children that outlive
it or ignore SIGTERM included (`processes.py`). `Engines` stops all arms on exit, on failure, on
Ctrl-C and on SIGTERM or SIGHUP to the runner, and a stopped arm's log tail is kept for the error message.
An arm stopped on purpose (one GPU: control before treatment) is neither waited for nor "crashed".
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specdecode.experiment import manifests, releases, spec
from specdecode.local import processes

#: seconds an arm's processes get to exit after SIGTERM before SIGKILL (vLLM shuts its engine down in a few)
STOP_GRACE_S = 10.0


class EngineError(Exception):
    """An arm could not start or stopped serving; the message names the arm and the cause."""


@dataclass
class Arm:
    """One running arm."""

    arm: spec.Arm
    url: str
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    argv: list[str] = field(default_factory=list)
    group: processes.Group | None = None
    """Every process of the arm (None for servers given by URL)."""
    stopped: bool = False
    """Stopped on purpose by the runner: its exit is not a crash."""

    def exit_code(self) -> int | None:
        """None while running (or when not ours)."""
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of the arm's log, for error messages."""
        if self.log is None or not self.log.exists():
            return ""
        text = self.log.read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:])


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def local_argv(
    s: spec.ExperimentSpec, arm: spec.Arm, port: int, release: releases.Release | None = None
) -> list[str]:
    """The rendered command line (for `release`, else the spec's), bound to loopback on `port`."""
    argv = manifests.serve_args(s, arm, release)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    if argv[:2] == ["specdecode", "sim"]:
        argv = [sys.executable, "-m", "specdecode", *argv[1:]]
    return argv


def gpu_count() -> int:
    """GPUs visible through nvidia-smi (0 without one)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def local_vllm_version() -> str | None:
    """`vllm --version` of the vLLM on PATH (None when absent or unreadable)."""
    if shutil.which("vllm") is None:
        return None
    try:
        done = subprocess.run(["vllm", "--version"], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # vLLM prints the version on the last line (after any import-time log lines).
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[-1] if done.returncode == 0 and lines else None


def engine_kind(s: spec.ExperimentSpec) -> str:
    """`simulator`, or `vllm` when vLLM and a GPU are here; raises EngineError otherwise."""
    if s.engine.simulator is not None:
        return "simulator"
    if shutil.which("vllm") is None or gpu_count() == 0:
        raise EngineError(
            "this experiment runs vLLM (spec.engine.simulator is not set) but vLLM or a GPU is missing here; "
            "set spec.engine.simulator to run on the simulator, or pass --control-url and --treatment-url "
            "for servers already running"
        )
    return "vllm"


class Engines:
    """Starts, watches and stops the arms of one run (a context manager)."""

    def __init__(self, s: spec.ExperimentSpec, logs: Path, release: releases.Release | None = None) -> None:
        self.spec = s
        self.logs = logs
        self.release = release
        self.arms: dict[spec.Arm, Arm] = {}

    def __enter__(self) -> Engines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def attach(self, urls: Mapping[spec.Arm, str]) -> None:
        """Use servers that are already running."""
        for arm, url in urls.items():
            self.arms[arm] = Arm(arm, url.rstrip("/"))

    def start(self, arm: spec.Arm, *, gpus: str | None = None, log_name: str | None = None) -> Arm:
        """Start one arm's process (logging to `log_name`.log, default the arm's name); returns at
        once (see `wait_healthy`). An arm started again replaces the stopped one."""
        port = free_port()
        argv = local_argv(self.spec, arm, port, self.release)
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{log_name or arm.value}.log"
        env = dict(os.environ)
        env.update({e.name: e.value for e in self.spec.engine.env if e.value is not None})
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        token = f"{arm.value}-{uuid.uuid4().hex}"
        env[processes.MARKER] = token
        with log.open("wb") as sink:
            process = subprocess.Popen(
                argv,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        started = Arm(arm, f"http://127.0.0.1:{port}", process, log, argv, processes.Group(process, token))
        self.arms[arm] = started
        return started

    def wait_healthy(self, deadline_s: float, arms: Iterable[spec.Arm] | None = None) -> None:
        """Until the given arms (default: every arm not stopped) answer `/health` with 200.

        EngineError naming the arm otherwise: one that exited (with its log tail), or the deadline.
        """
        end = time.monotonic() + deadline_s
        wanted = list(arms) if arms is not None else [a for a, s in self.arms.items() if not s.stopped]
        pending = {arm: self.arms[arm] for arm in wanted}
        with httpx.Client(timeout=httpx.Timeout(2.0)) as client:
            while pending:
                for arm, state in list(pending.items()):
                    code = state.exit_code()
                    if code is not None:
                        raise EngineError(
                            f"{arm.value} arm exited with status {code} before it became healthy:\n{state.log_tail()}"
                        )
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"{state.url}/health").status_code == 200:
                            del pending[arm]
                            if state.group is not None:
                                state.group.remember()  # its engine processes exist by now
                if pending and time.monotonic() > end:
                    names = " and ".join(a.value for a in pending)
                    tails = "\n".join(f"[{a.value}] {s.log_tail(4)}" for a, s in pending.items())
                    raise EngineError(
                        f"{names} not healthy within spec.deadlines.deploy ({self.spec.deadlines.deploy}):\n{tails}"
                    )
                if pending:
                    time.sleep(0.1)

    def crashed(self) -> Arm | None:
        """The first arm whose process has exited without being stopped on purpose, if any."""
        return next((a for a in self.arms.values() if not a.stopped and a.exit_code() is not None), None)

    def stop(self, arm: spec.Arm) -> list[int]:
        """Stop every process of the arm (SIGTERM, STOP_GRACE_S, SIGKILL); the pids that survived, if any."""
        state = self.arms.get(arm)
        if state is None or state.group is None or state.stopped:
            return []
        state.stopped = True
        with _signals_deferred():
            return state.group.stop(grace_s=STOP_GRACE_S)

    def stop_all(self) -> list[int]:
        """Stop every process this run started, the arms at the same time; the pids that survived SIGKILL.

        The run is ending: a Ctrl-C or SIGTERM meanwhile is dropped (it would only turn a finished
        run into an interrupted one).
        """
        with (
            _signals_deferred(reraise=False),
            concurrent.futures.ThreadPoolExecutor(max(1, len(self.arms))) as pool,
        ):
            return [pid for left in pool.map(self.stop, list(self.arms)) for pid in left]


@contextlib.contextmanager
def _signals_deferred(*, reraise: bool = True) -> Iterator[None]:
    """Ctrl-C, SIGTERM or SIGHUP arriving while arms are stopped is acted on after the stop (`reraise`), not in the middle.

    Only the main thread may set handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig in previous:
        signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if reraise and caught:
            signal.raise_signal(caught[0])
