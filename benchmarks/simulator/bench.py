"""How many concurrent streams one simulator process serves on one core within a 2 ms p99 lag.

Starts `specdecode sim` pinned to one CPU (taskset), with a 50 ms step and one token per chunk,
so N streams produce N x 20 chunks/s; drives N closed-loop streaming clients from this process
(pinned to other CPUs when there are any); then reads the server's ground truth and reports, per N,
the chunk rate and the lag between each chunk's scheduled step boundary and its write.

    .venv/bin/python benchmarks/simulator/bench.py --streams 100 250 500 750 1000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def client(port: int, stop_at: float, max_tokens: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(
        {"model": "m", "prompt": "bench", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    ).encode()
    req = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    done = 0
    while time.monotonic() < stop_at:
        writer.write(req)
        buf = b""
        while not buf.endswith(b"0\r\n\r\n"):
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("server closed")
            buf = buf[-16:] + data
        done += 1
    writer.close()
    return done


async def drive(port: int, streams: int, seconds: float, max_tokens: int) -> None:
    stop_at = time.monotonic() + seconds
    # Stagger the starts over one step so the first admission is not one giant prefill.
    tasks = [asyncio.create_task(client(port, stop_at, max_tokens)) for _ in range(streams)]
    await asyncio.gather(*tasks)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_one(
    streams: int, seconds: float, step_ms: float, server_cpu: str | None, nice: int
) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "specdecode.simulator", "m", "--host", "127.0.0.1", "--port", str(port),
            "--decode-step-ms", str(step_ms), "--batch-token-ms", "0", "--prefill-token-ms", "0",
            "--max-num-seqs", "100000", "--max-num-batched-tokens", "10000000",
            "--max-model-len", "100000"]  # fmt: skip
    if server_cpu is not None and shutil.which("taskset"):
        argv = ["taskset", "-c", server_cpu, *argv]
    if nice:
        argv = ["nice", "-n", str(nice), *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        max_tokens = int(2000 / step_ms)  # ~2 s per request
        t0 = time.monotonic()
        cpu0 = cpu_seconds(proc.pid)
        asyncio.run(drive(port, streams, seconds, max_tokens))
        cpu1 = cpu_seconds(proc.pid)
        t1 = time.monotonic()
        with urllib.request.urlopen(url + "/sim/ground_truth", timeout=60) as resp:
            records = [json.loads(line) for line in resp.read().splitlines()]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    # Measure over the steady window: skip the first second (connection setup, first prefill).
    lo, hi = t0 + 1.0, t1
    lags = [(w - b) * 1000 for r in records for w, _, b in r["chunks"] if lo <= b <= hi]
    # Per step boundary: the first write's lag is the wake-up lateness (scheduling, other processes);
    # last minus first is the write burst (the server's own cost for that many streams).
    by_step: dict[float, list[float]] = {}
    for r in records:
        for w, _, b in r["chunks"]:
            if lo <= b <= hi:
                by_step.setdefault(b, []).append(w)
    wake = [(min(ws) - b) * 1000 for b, ws in by_step.items()]
    burst = [(max(ws) - min(ws)) * 1000 for ws in by_step.values()]
    return {
        "streams": streams,
        "chunks_per_s": len(lags) / (hi - lo),
        "lag_p50_ms": statistics.median(lags),
        "lag_p99_ms": pct(lags, 0.99),
        "lag_max_ms": max(lags),
        "wake_p50_ms": statistics.median(wake),
        "burst_p50_ms": statistics.median(burst),
        "server_cpu": (cpu1 - cpu0) / (t1 - t0),
        "cpu_us_per_chunk": (cpu1 - cpu0) / max(1, len(lags) * (t1 - t0) / (hi - lo)) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[100, 250, 500, 750, 1000])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--server-cpu", default="0", help="CPU list for the simulator (taskset); '' for none")
    ap.add_argument(
        "--nice", type=int, default=0, help="niceness of the simulator (negative: ahead of other jobs)"
    )
    ap.add_argument("--client-cpu", default=None, help="CPU list for this client process")
    args = ap.parse_args()
    if args.client_cpu:
        os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    print(f"# {stamp}; load average before: {os.getloadavg()}; cpus: {os.cpu_count()}")
    print(
        "| streams | chunks/s | lag p50 ms | lag p99 ms | lag max ms | wake p50 ms | burst p50 ms "
        "| server CPU (cores) | CPU µs/chunk |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.streams:
        r = run_one(n, args.seconds, args.step_ms, args.server_cpu or None, args.nice)
        print(
            f"| {r['streams']} | {r['chunks_per_s']:.0f} | {r['lag_p50_ms']:.3f} | {r['lag_p99_ms']:.3f} "
            f"| {r['lag_max_ms']:.3f} | {r['wake_p50_ms']:.3f} | {r['burst_p50_ms']:.3f} "
            f"| {r['server_cpu']:.2f} | {r['cpu_us_per_chunk']:.1f} |",
            flush=True,
        )
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
