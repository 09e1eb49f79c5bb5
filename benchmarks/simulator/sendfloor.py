"""The floor under the simulator's write burst: N bare `transport.write` calls on loopback TCP.

One uvloop process holds N server-side connections; a reader process (another CPU) drains them.
Each round writes 300 bytes to every connection in one loop, as the engine does at a step
boundary, and times the loop. No HTTP, no JSON, no engine: whatever this takes on a machine, no
single-threaded server can write N chunks faster there.

    .venv/bin/python benchmarks/simulator/sendfloor.py 500
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

import uvloop


async def reader(port: int, n: int) -> None:
    conns = []
    for _ in range(n):
        conns.append(await asyncio.open_connection("127.0.0.1", port))

    async def drain(r: asyncio.StreamReader) -> None:
        while await r.read(65536):
            pass

    await asyncio.gather(*(drain(r) for r, _ in conns))


async def writer(n: int, rounds: int) -> list[float]:
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
        uvloop.run(reader(int(sys.argv[sys.argv.index("--reader") + 1]), n))
        return
    bursts = sorted(uvloop.run(writer(n, 100)))
    print(
        f"{n} writes: burst p50 {statistics.median(bursts):.3f} ms, min {bursts[0]:.3f} ms, "
        f"p90 {bursts[89]:.3f} ms; load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
