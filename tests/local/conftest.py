"""Fake engines on PATH: `vllm` (the simulator behind vLLM's command line) and `nvidia-smi`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specdecode.local import engines
from tests.loadgen.conftest import fake_server  # noqa: F401 (fakevllm.py servers given by URL)

FAKEBIN = Path(__file__).parent / "fakebin"


@dataclass
class FakeEngines:
    """The fakes' switches (environment variables of this test) and what they recorded."""

    bin: Path
    record: Path
    tag: str
    """In the argv of every fake EngineCore child of this test."""
    monkeypatch: pytest.MonkeyPatch

    def set(self, name: str, value: str) -> None:
        self.monkeypatch.setenv(name, value)

    def serves(self) -> list[dict[str, Any]]:
        """One entry per `vllm serve` started, in order."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def enginecores(self) -> list[int]:
        """Live fake EngineCore processes of this test (found by the tag in their argv)."""
        return processes_with(self.tag.encode())


def processes_with(needle: bytes) -> list[int]:
    """Live (non-zombie) processes whose argv contains `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in argv.split(b"\0") and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def alive_after(pids: list[int], seconds: float) -> list[int]:
    """Those of `pids` still alive after up to `seconds` (a stopped process takes a moment to exit)."""
    end = time.monotonic() + seconds
    while True:
        left = [pid for pid in pids if pid in processes_alive()]
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.05)


def processes_alive() -> set[int]:
    alive = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    alive.add(int(entry.name))
            except OSError:
                continue
    return alive


@contextlib.contextmanager
def running(path: Path, out: Path) -> Iterator[subprocess.Popen[str]]:
    """`specdecode run PATH --local` as its own process (to be signalled, or to have an arm killed).

    If the test leaves it running, it gets SIGTERM (so it stops its arms), and SIGKILL only after 30 s.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "specdecode", "run", str(path), "--local", "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


def wait_for_measured(out: Path, count: int, *, seconds: float = 60.0) -> int:
    """Until DIR/requests.jsonl holds `count` measured (not warm-up) requests; returns how many it holds."""
    requests = out / "requests.jsonl"
    deadline = time.monotonic() + seconds
    measured = 0
    while time.monotonic() < deadline:
        lines = requests.read_text().splitlines() if requests.exists() else []
        measured = sum('"warmup":false' in line for line in lines)
        if measured >= count:
            break
        time.sleep(0.1)
    return measured


@pytest.fixture
def fake_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeEngines:
    """`vllm` and `nvidia-smi` first on PATH (one GPU unless FAKE_NVIDIA_SMI_GPUS says otherwise)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("vllm", "vllm.py"), ("nvidia-smi", "nvidia_smi.py")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKEBIN / script}" "$@"\n')
        shim.chmod(0o755)
    fakes = FakeEngines(
        bin_dir, tmp_path / "serves.jsonl", f"fake-enginecore-{uuid.uuid4().hex}", monkeypatch
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(fakes.record))
    monkeypatch.setenv("FAKE_GPU_DIR", str(tmp_path / "gpus"))
    monkeypatch.setenv("FAKE_ENGINECORE_TAG", fakes.tag)
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "1")
    monkeypatch.setenv("FAKE_VLLM_SIM_ARGS", "--profile h200-8b-draft-tiny --decode-step-ms 3")
    # The fake EngineCore ignores SIGTERM, so each stop waits out the grace period (10 s is for real vLLM).
    monkeypatch.setattr(engines, "STOP_GRACE_S", 2.0)
    for name in (
        "FAKE_VLLM_VERSION",
        "FAKE_VLLM_ENGINECORE",
        "FAKE_VLLM_FAIL_AT_START",
        "FAKE_VLLM_DIE_AFTER",
    ):
        monkeypatch.delenv(name, raising=False)
    return fakes
