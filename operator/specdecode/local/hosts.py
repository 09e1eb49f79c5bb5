"""Where an arm of `run --local` runs: this machine's facts, as `status.Host` (issue 22).

Pure parsers of `nvidia-smi` and `/proc/cpuinfo` output, and one thin function that runs them
(`this_host`). Without nvidia-smi (the simulator on a laptop) the GPU facts stay unknown.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specdecode.experiment import status

#: `nvidia-smi --query-gpu=...`: one CSV line per GPU, in this order.
GPU_QUERY = "index,name,uuid,driver_version"
_CUDA = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)")
_MODEL_NAME = re.compile(r"^model name\s*:\s*(.+?)\s*$", re.MULTILINE)

Run = Callable[[Sequence[str]], str | None]
"""Runs a command and returns its stdout, or None when it cannot run or fails."""


@dataclass(frozen=True)
class Gpu:
    """One line of the GPU query."""

    index: str
    name: str
    uuid: str
    driver_version: str


def parse_gpus(csv: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader` -> GPUs."""
    gpus = []
    for line in csv.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and all(fields):
            gpus.append(Gpu(*fields))
    return gpus


def select(gpus: Sequence[Gpu], visible: str | None) -> list[Gpu]:
    """The GPUs a process with this `CUDA_VISIBLE_DEVICES` sees (indices or UUIDs; None: all)."""
    if visible is None:
        return list(gpus)
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    by_key = {g.index: g for g in gpus} | {g.uuid: g for g in gpus}
    return [by_key[w] for w in wanted if w in by_key]


def parse_cuda_version(header: str) -> str | None:
    """The `CUDA Version: 12.9` of nvidia-smi's banner (the newest CUDA the driver supports)."""
    match = _CUDA.search(header)
    return match.group(1) if match else None


def parse_cpu_model(cpuinfo: str) -> str | None:
    """The first `model name` of /proc/cpuinfo (x86; other architectures leave it unknown)."""
    match = _MODEL_NAME.search(cpuinfo)
    return match.group(1) if match else None


def host_of(
    *,
    node: str,
    gpu_csv: str | None,
    smi_banner: str | None,
    cpuinfo: str | None,
    cpu_count: int | None,
    visible: str | None,
) -> status.Host:
    """The host facts from the raw outputs (any of them may be missing)."""
    gpus = select(parse_gpus(gpu_csv or ""), visible)
    products = sorted({g.name for g in gpus})
    drivers = sorted({g.driver_version for g in gpus})
    return status.Host(
        node=node,
        gpu_product=", ".join(products) or None,
        gpu_uuids=[g.uuid for g in gpus] or None,
        driver_version=", ".join(drivers) or None,
        cuda_version=parse_cuda_version(smi_banner or "") if gpus else None,
        cpu_model=parse_cpu_model(cpuinfo or ""),
        cpu_count=cpu_count,
    )


def this_host(gpus: str | None, *, run: Run | None = None) -> status.Host:
    """This machine, for an arm given `CUDA_VISIBLE_DEVICES=gpus` (None: it uses no GPU, as the simulator)."""
    run = run or _run
    query = ["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader"]
    gpu_csv = run(query) if gpus is not None else None
    try:
        cpuinfo: str | None = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = None
    return host_of(
        node=socket.gethostname(),
        gpu_csv=gpu_csv,
        smi_banner=run(["nvidia-smi"]) if gpu_csv else None,
        cpuinfo=cpuinfo,
        cpu_count=os.cpu_count(),
        visible=gpus,
    )


def _run(argv: Sequence[str]) -> str | None:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
