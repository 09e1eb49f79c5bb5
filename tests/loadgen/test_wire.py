"""The load generator's wire pieces below a request: the kernel-stamped socket transport (`stamping.py`)
and the connection pool's prewarming (`http.py`), against real loopback sockets, no server process."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from specdecode.loadgen import http, stamping

pytestmark = pytest.mark.skipif(
    not stamping.kernel_timestamps_supported(), reason="SO_TIMESTAMPNS is Linux-only"
)


class _Received:
    def __init__(self) -> None:
        self.chunks: list[tuple[float, bytes]] = []
        self.arrived = asyncio.Event()

    def received(self, at: float, data: bytes) -> None:
        self.chunks.append((at, data))
        self.arrived.set()

    def connection_lost(self, exc: Exception | None) -> None:
        pass


def test_a_read_is_stamped_when_the_kernel_received_it_not_when_the_loop_got_to_it() -> None:
    """Bytes that waited 200 ms in the socket buffer carry the kernel's arrival time: about 200 ms
    before the read. Dropping the kernel's control message (e.g. matching the wrong level) would stamp
    them with the read's own time, and every TTFT would grow by the loop's lag."""

    async def main() -> tuple[float, float]:
        with socket.create_server(("127.0.0.1", 0)) as server:
            client = socket.create_connection(server.getsockname())
            peer, _ = server.accept()
        client.setblocking(False)
        client.setsockopt(socket.SOL_SOCKET, stamping.SO_TIMESTAMPNS, 1)
        # the first socket to ask for receive stamps turns them on system-wide through deferred kernel
        # work (net_enable_timestamp); until it ran, arrivals are stamped when read
        time.sleep(0.1)  # noqa: ASYNC251
        loop = asyncio.get_running_loop()
        got = _Received()
        transport = stamping.SocketTransport(client, got, loop)
        try:
            sent_at = time.monotonic()
            peer.sendall(b"data: hello\n\n")
            time.sleep(0.2)  # noqa: ASYNC251 -- on purpose: the loop is blocked, the bytes wait in the kernel
            read_after = time.monotonic()
            await asyncio.wait_for(got.arrived.wait(), 5.0)
        finally:
            transport.close()
            peer.close()
        assert got.chunks[0][1] == b"data: hello\n\n"
        at = got.chunks[0][0]
        assert at <= read_after
        return at - sent_at, read_after - at

    after_send, before_read = asyncio.run(main())
    assert -0.05 < after_send < 0.05  # within the clocks' conversion of when it was sent
    assert before_read > 0.15  # not the moment the loop read it


def test_prewarm_opens_the_missing_idle_connections_and_no_more() -> None:
    """A stage starts on warm connections: prewarm(3) leaves three idle ones the server accepted; asking
    again for three opens none (a pool that skipped prewarming would pay each connect in the first
    requests' TTFT)."""

    async def main() -> tuple[int, int, int, int]:
        accepted: list[asyncio.StreamWriter] = []

        async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = http.Pool(http.Origin.parse(f"http://127.0.0.1:{port}"))
        try:
            await pool.prewarm(3)
            first = pool.opened
            await pool.prewarm(3)
            second = pool.opened
            await asyncio.sleep(0.05)
            return first, second, len(accepted), len(pool._idle)
        finally:
            pool.close()
            for writer in accepted:
                writer.close()
            server.close()
            await server.wait_closed()

    first, second, accepted, idle = asyncio.run(main())
    assert (first, second, accepted, idle) == (3, 3, 3, 3)


def test_a_request_that_times_out_closes_its_connection() -> None:
    """A server that never answers: the exchange ends in TimeoutError and the connection is closed
    (the server sees its end), not left open and pooled (mutation benchmark survivors in http: the
    close skipped on an error, `close` leaving the socket open)."""

    async def main() -> tuple[BaseException | None, bytes, int]:
        ends: asyncio.Queue[bytes] = asyncio.Queue()
        writers: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            await reader.readuntil(b"\r\n\r\n")
            await ends.put(await reader.read())  # b"" once the client closed

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = http.Pool(http.Origin.parse(f"http://127.0.0.1:{port}"))
        try:
            payload = http.request_bytes(pool.origin, "GET", "/health", {})
            ex = await http.exchange(pool, payload, limit_s=0.2)
            end = await asyncio.wait_for(ends.get(), 5.0)
            return ex.error, end, len(pool._idle)
        finally:
            pool.close()
            for writer in writers:
                writer.close()
            server.close()
            await server.wait_closed()

    error, end, idle = asyncio.run(main())
    assert isinstance(error, TimeoutError)
    assert end == b"" and idle == 0


def test_a_write_larger_than_the_socket_buffer_is_sent_whole() -> None:
    """8 MiB written at once leave in pieces as the peer reads: all of them, in order (mutation
    benchmark survivor in stamping: the writer stopped while bytes were still queued)."""
    payload = bytes(range(256)) * (32 * 1024)

    async def main() -> bytes:
        with socket.create_server(("127.0.0.1", 0)) as server:
            client = socket.create_connection(server.getsockname())
            peer, _ = server.accept()
        client.setblocking(False)
        loop = asyncio.get_running_loop()
        transport = stamping.SocketTransport(client, _Received(), loop)
        try:
            transport.write(payload)
            reader, writer = await asyncio.open_connection(sock=peer)
            got = await asyncio.wait_for(reader.readexactly(len(payload)), 10.0)
            writer.close()
            return got
        finally:
            transport.close()

    assert asyncio.run(main()) == payload
