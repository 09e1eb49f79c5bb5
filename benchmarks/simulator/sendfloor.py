"""The floor under the simulator's write burst: N bare `transport.write` calls on loopback TCP.

One uvloop process holds N server-side connections; a reader process (another CPU) drains them.
Each round writes 300 bytes to every connection in one loop, as the engine does at a step
boundary, and times the loop. No HTTP, no JSON, no engine: whatever this takes on a machine, no
single-threaded server can write N chunks faster there.

    .venv/bin/python benchmarks/simulator/sendfloor.py 500
    .venv/bin/python benchmarks/simulator/sendfloor.py 500 --idle-reader   # reader reads only at the end

`--idle-reader` separates the kernel's own cost of a loopback TCP send from the contention with a
reader draining the same sockets at the same time (socket locks, wake-ups across CPUs).
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import sys
import time

import uvloop


def quiet_reader(port: int, n: int, idle_s: float) -> None:
    """Connect, read nothing for `idle_s` (no epoll registration, so no wake-ups), then drain."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    time.sleep(idle_s)
    for s in socks:
        while s.recv(1 << 20):
            pass


async def reader(port: int, n: int) -> None:
    conns = []
    for _ in range(n):
        conns.append(await asyncio.open_connection("127.0.0.1", port))

    async def drain(r: asyncio.StreamReader) -> None:
        while await r.read(65536):
            pass

    await asyncio.gather(*(drain(r) for r, _ in conns))


async def writer(n: int, rounds: int, idle_reader: bool) -> list[float]:
    loop = asyncio.get_running_loop()
    transports: list[asyncio.Transport] = []
    all_connected = asyncio.Event()

    class Keep(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transports.append(transport)  # type: ignore[arg-type]
            if len(transports) == n:
                all_connected.set()

    server = await loop.create_server(Keep, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    cpus = sorted(os.sched_getaffinity(0))
    argv = [sys.executable, __file__, str(n), "--reader", str(port)]
    if idle_reader:
        argv += ["--idle-s", str(rounds * 0.06 + 2.0)]
    if len(cpus) > 1:
        argv = ["taskset", "-c", str(cpus[-1]), *argv]
    proc = await asyncio.create_subprocess_exec(*argv)
    await all_connected.wait()
    data = b"x" * 300
    bursts = []
    for _ in range(rounds):
        t = time.perf_counter()
        for tr in transports:
            tr.write(data)
        bursts.append((time.perf_counter() - t) * 1000)
        await asyncio.sleep(0.05)
    for tr in transports:
        tr.close()
    server.close()
    await proc.wait()
    return bursts


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    if "--reader" in sys.argv:
        idle = float(sys.argv[sys.argv.index("--idle-s") + 1]) if "--idle-s" in sys.argv else 0.0
        port = int(sys.argv[sys.argv.index("--reader") + 1])
        if idle:
            quiet_reader(port, n, idle)
        else:
            uvloop.run(reader(port, n))
        return
    idle_reader = "--idle-reader" in sys.argv
    bursts = sorted(uvloop.run(writer(n, 100, idle_reader)))
    print(
        f"{n} writes{' (idle reader)' if idle_reader else ''}: burst p50 {statistics.median(bursts):.3f} ms, min {bursts[0]:.3f} ms, "
        f"p90 {bursts[89]:.3f} ms; load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
