"""A lean HTTP/1.1 client on asyncio: the load generator's timing instrument.

Why not httpx (the project's default client): the timestamp of a streamed event must be taken when
its bytes reach the machine, not when a coroutine further up a stack of async iterators gets
scheduled. On plain-HTTP Linux connections each socket read is stamped with the kernel's receive
time (SO_TIMESTAMPNS through `recvmsg`, `stamping.SocketTransport`); elsewhere `data_received` is the first
Python code that sees the bytes and stamps them with `time.monotonic()` before anything else. The
hot path only appends `(time, bytes)`; the chunked framing (`connection.Response.decode`), SSE splitting and
JSON parsing happen after the stream ends (`sse.py`). The measured difference against httpx is in
`benchmarks/README.md` ("Why the load generator has its own HTTP client").

Scope, on purpose: HTTP/1.1, `Content-Length` or chunked bodies (or close-delimited), keep-alive
with a LIFO pool per endpoint, optional TLS. No redirects, no proxies, no HTTP/2: the targets are
vLLM pods and Services.

One connection, its response framing and the failures are in `connection.py`; this module holds
what the load generator calls: the pool of keep-alive connections per origin and the exchange of
one request.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_module
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from specdecode.loadgen import connection, stamping


@dataclass(frozen=True)
class Origin:
    """Scheme, host and port of an endpoint, plus the path prefix of its base URL."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Origin:
        """`http://host:port/prefix` -> Origin."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        """The Host header value."""
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


class Pool:
    """Keep-alive connections to one origin, reused most-recently-used first.

    Not capped: the load decides how many streams are open (a cap would queue requests invisibly,
    loadgen-anchors (c)2); `prewarm` opens connections ahead of a stage so sends don't pay for them.
    """

    def __init__(
        self,
        origin: Origin,
        *,
        connect_timeout: float = 10.0,
        idle_timeout: float = 4.0,
        ssl_context: ssl_module.SSLContext | None = None,
        kernel_stamps: bool = True,
    ) -> None:
        self.origin = origin
        self.connect_timeout = connect_timeout
        #: drop idle connections older than this (servers close idle keep-alives: uvicorn after 5 s)
        self.idle_timeout = idle_timeout
        self._ssl = ssl_context if origin.scheme == "https" else None
        if origin.scheme == "https" and self._ssl is None:
            self._ssl = ssl_module.create_default_context()
        self._idle: list[connection.Connection] = []
        self._all: set[connection.Connection] = set()
        self.opened = 0
        """Connections opened so far."""
        self.kernel_timestamps = (
            kernel_stamps and self._ssl is None and stamping.kernel_timestamps_supported()
        )
        """Reads are stamped by the kernel (plain HTTP on Linux); else when the loop delivers them."""

    async def connect(self) -> connection.Connection:
        """Open a new connection."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.kernel_timestamps:
                    proto = await self._connect_socket(loop)
                else:
                    _, proto = await loop.create_connection(
                        connection.Connection, self.origin.host, self.origin.port, ssl=self._ssl
                    )
        except TimeoutError:
            raise connection.ConnectError(
                f"connect to {self.origin.host}:{self.origin.port} timed out"
            ) from None
        except OSError as exc:
            raise connection.ConnectError(f"connect to {self.origin.host}:{self.origin.port}: {exc}") from exc
        self.opened += 1
        self._all.add(proto)
        return proto

    async def _connect_socket(self, loop: asyncio.AbstractEventLoop) -> connection.Connection:
        infos = await loop.getaddrinfo(self.origin.host, self.origin.port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"cannot resolve {self.origin.host}")
        family, type_, proto_no, _, address = infos[0]
        sock = socket.socket(family, type_, proto_no)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, stamping.SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        conn = connection.Connection()
        conn.connection_made(cast(asyncio.Transport, stamping.SocketTransport(sock, conn, loop)))
        return conn

    def take_idle(self) -> connection.Connection | None:
        """The most recently used idle connection that is still usable, or None."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and now - conn.last_used < self.idle_timeout:
                return conn
            self._discard(conn)
        return None

    def release(self, conn: connection.Connection) -> None:
        """Return a connection after its response (closed ones are dropped)."""
        if conn.reusable:
            self._idle.append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: connection.Connection) -> None:
        conn.close()
        self._all.discard(conn)

    async def prewarm(self, n: int) -> None:
        """Have at least `n` idle connections (best effort: failures surface on the first request)."""
        self._idle = [c for c in self._idle if c.reusable]
        missing = n - len(self._idle)
        if missing <= 0:
            return
        results = await asyncio.gather(*(self.connect() for _ in range(missing)), return_exceptions=True)
        for r in results:
            if isinstance(r, connection.Connection):
                self._idle.insert(0, r)

    def close(self) -> None:
        """Close every connection."""
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()


def request_bytes(
    origin: Origin, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> bytes:
    """Serialise one HTTP/1.1 request."""
    lines = [f"{method} {origin.prefix}{path} HTTP/1.1", f"Host: {origin.host_header}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Exchange:
    """One request's timing and response, whatever happened."""

    sent: float = 0.0
    """monotonic, just before the request bytes were written."""
    connect_s: float | None = None
    """Time spent opening a new connection (None: reused a pooled one)."""
    response: connection.Response | None = None
    error: BaseException | None = None


Started = tuple[connection.Connection, "asyncio.Future[connection.Response]"]


def send_now(pool: Pool, payload: bytes, ex: Exchange) -> Started | None:
    """Write `payload` at once on an idle pooled connection (None when there is none).

    For the open-loop pacer: the request leaves in the pacer's own turn of the event loop, not one
    turn later in a new task. Pass the result to `exchange(started=...)` to read the response.
    """
    conn = pool.take_idle()
    if conn is None:
        return None
    ex.sent = time.monotonic()
    return conn, conn.start(payload)


async def exchange(
    pool: Pool, payload: bytes, *, limit_s: float, ex: Exchange | None = None, started: Started | None = None
) -> Exchange:
    """Send `payload` and read the whole response, within `limit_s` seconds.

    Never raises for network or protocol failures: they land in `Exchange.error` (and
    `TimeoutError` for the timeout). Cancellation propagates, closing the connection. The caller may
    pass `ex` to keep seeing the times if it is cancelled midway, and `started` when `send_now`
    already sent the request.
    """
    ex = ex if ex is not None else Exchange()
    attempts = 2  # a pooled connection the server closed meanwhile gets one retry on a fresh one
    while attempts:
        attempts -= 1
        conn: connection.Connection | None = None
        try:
            if started is not None:
                conn, fut = started
                started = None
                reused = True
            else:
                conn = pool.take_idle()
                reused = conn is not None
                if conn is None:
                    t0 = time.monotonic()
                    conn = await pool.connect()
                    ex.connect_s = time.monotonic() - t0
                ex.sent = time.monotonic()
                fut = conn.start(payload)
            async with asyncio.timeout(limit_s):
                ex.response = await fut
            ex.error = None
            pool.release(conn)
            return ex
        except connection.DisconnectError as exc:
            if conn is not None:
                pool.release(conn)
            resp = conn.snapshot() if conn is not None else None
            if reused and attempts and resp is not None and resp.headers_at is None:
                continue  # stale keep-alive: nothing was received, retry on a new connection
            ex.response, ex.error = resp, exc
            return ex
        except (connection.HttpError, TimeoutError) as exc:
            if conn is not None:
                ex.response = conn.snapshot() if conn._done is not None else None
                conn.close()
                pool.release(conn)
            ex.error = exc
            return ex
        except BaseException:
            if conn is not None:
                ex.response = conn.snapshot()
                conn.close()
                pool.release(conn)
            raise
    return ex  # pragma: no cover - the loop always returns


async def get(
    pool: Pool, path: str, *, limit_s: float = 10.0, headers: dict[str, str] | None = None
) -> connection.Response:
    """A plain GET (for /metrics, /health); raises connection.HttpError or TimeoutError."""
    payload = request_bytes(pool.origin, "GET", path, {"Accept": "*/*", **(headers or {})})
    ex = await exchange(pool, payload, limit_s=limit_s)
    if ex.error is not None:
        raise ex.error
    assert ex.response is not None
    return ex.response
