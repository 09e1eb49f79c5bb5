"""A lean HTTP/1.1 client on asyncio: the load generator's timing instrument.

Why not httpx (the project's default client): the timestamp of a streamed event must be taken when
its bytes reach the machine, not when a coroutine further up a stack of async iterators gets
scheduled. On plain-HTTP Linux connections each socket read is stamped with the kernel's receive
time (SO_TIMESTAMPNS through `recvmsg`, `stamping.SocketTransport`); elsewhere `data_received` is the first
Python code that sees the bytes and stamps them with `time.monotonic()` before anything else. The
hot path only appends `(time, bytes)`; the chunked framing (`Response.decode`), SSE splitting and
JSON parsing happen after the stream ends (`sse.py`). The measured difference against httpx is in
`benchmarks/README.md` ("Why the load generator has its own HTTP client").

Scope, on purpose: HTTP/1.1, `Content-Length` or chunked bodies (or close-delimited), keep-alive
with a LIFO pool per endpoint, optional TLS. No redirects, no proxies, no HTTP/2: the targets are
vLLM pods and Services.

Invariants:
- Body pieces are kept as `(monotonic time of arrival, bytes)`; a piece's time is the time of the
  `data_received` call that delivered its first byte.
- A connection serves one request at a time and goes back to the pool only after a complete
  response without `Connection: close`.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_module
import time
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

from specdecode.loadgen import stamping

(
    _HEAD,
    _BODY_LENGTH,
    _BODY_CHUNK_SIZE,
    _BODY_CHUNK_DATA,
    _BODY_CHUNK_CRLF,
    _BODY_TRAILER,
    _BODY_CLOSE,
    _DONE,
) = range(8)
_MAX_HEAD = 64 * 1024


class HttpError(Exception):
    """Base of this module's failures.

    HttpError
    ├── ConnectError      could not open a connection (refused, unreachable, DNS, connect timeout)
    ├── DisconnectError   the server closed the connection before the response was complete
    └── ProtocolError     the bytes are not HTTP/1.1 as we speak it
    """


class ConnectError(HttpError):
    """Could not open a connection."""


class DisconnectError(HttpError):
    """The connection closed before the response was complete."""


class ProtocolError(HttpError):
    """Malformed status line, headers or chunked framing."""


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


@dataclass
class Response:
    """What one request got back. Times are `time.monotonic()` seconds."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    headers_at: float | None = None
    """When the end of the response head arrived."""
    first_byte: float | None = None
    """When the first body byte arrived."""
    end: float | None = None
    """When the last body byte arrived (or the failure was seen)."""
    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    """The decoded body, as it arrived (after `decode()` for a chunked body)."""
    raw: list[tuple[float, bytes]] | None = None
    """A chunked body as it arrived, framing included, until `decode()`."""

    def decode(self) -> None:
        """Undo the chunked framing of `raw` into `pieces` (off the hot path).

        Raises ProtocolError for bad framing or a body that ends before its terminating chunk.
        """
        if self.raw is None:
            return
        raw, self.raw = self.raw, None
        dechunker = _Dechunker()
        complete = False
        for at, data in raw:
            if dechunker.feed(at, data):
                complete = True
                break
        self.pieces = dechunker.pieces
        if not complete:
            raise ProtocolError("chunked body ended before its last chunk")

    @property
    def body(self) -> bytes:
        """The whole decoded body."""
        self.decode()
        return b"".join(p for _, p in self.pieces)


class _Dechunker:
    """Chunked transfer coding -> payload pieces stamped with the arrival of their first byte."""

    def __init__(self) -> None:
        self.pieces: list[tuple[float, bytes]] = []
        self._buf = bytearray()
        self._state = _BODY_CHUNK_SIZE
        self._remaining = 0

    def feed(self, now: float, data: bytes) -> bool:
        """Consume bytes; True once the terminating chunk (and trailers) arrived."""
        buf = self._buf
        buf += data
        pos = 0
        done = False
        while True:
            if self._state == _BODY_CHUNK_DATA:
                if pos >= len(buf):
                    break
                take = min(self._remaining, len(buf) - pos)
                self.pieces.append((now, bytes(buf[pos : pos + take])))
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _BODY_CHUNK_CRLF
            elif self._state == _BODY_CHUNK_CRLF:
                if len(buf) - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                pos += 2
                self._state = _BODY_CHUNK_SIZE
            elif self._state == _BODY_CHUNK_SIZE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if len(buf) - pos > 1024:
                        raise ProtocolError("chunk size line too long")
                    break
                line = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {line[:20]!r}") from None
                pos = eol + 2
                if size == 0:
                    self._state = _BODY_TRAILER
                else:
                    self._remaining = size
                    self._state = _BODY_CHUNK_DATA
            elif self._state == _BODY_TRAILER:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                empty = eol == pos
                pos = eol + 2
                if empty:
                    self._state = _DONE
                    done = True
                    break
            else:
                break
        del buf[:pos]
        return done


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses the response head and body framing as bytes arrive.

    A chunked body (every streamed response) is kept raw on the hot path: each read costs a clock
    read, an append and a look at its last bytes. With hundreds of streams whose chunks arrive in
    the same instant, that per-read cost is what delays the stamps of the streams read after this
    one; the framing is undone later (`Response.decode`).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.last_used = time.monotonic()
        self._buf = bytearray()
        self._state = _DONE
        self._remaining = 0
        self._response = Response()
        self._done: asyncio.Future[Response] | None = None
        self._keep_alive = True
        self._raw: list[tuple[float, bytes]] | None = None
        self._tail = b""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports don't subclass it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._raw = None
        if self._done is None or self._done.done():
            return
        now = time.monotonic()
        self._response.end = now
        if self._state == _BODY_CLOSE:
            self._state = _DONE
            self._done.set_result(self._response)
        else:
            self._done.set_exception(DisconnectError(f"connection closed mid-response ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        self.received(time.monotonic(), data)  # first thing: the arrival time of these bytes

    def received(self, now: float, data: bytes) -> None:
        """Bytes that arrived at `now` (monotonic seconds)."""
        raw = self._raw
        if raw is not None:  # the hot path: a chunked body
            if not raw:
                self._response.first_byte = now
            raw.append((now, data))
            tail = (self._tail + data)[-7:] if len(data) < 7 else data[-7:]
            self._tail = tail
            if tail == b"\r\n0\r\n\r\n":  # the terminating chunk (SSE payloads end in \n\n)
                self._finish(now)
            return
        if self._done is None or self._done.done():
            return  # bytes outside a request (or after a failure): ignore
        try:
            self._feed(now, data)
        except ProtocolError as exc:
            self._response.end = now
            self._keep_alive = False
            self._done.set_exception(exc)
            if self.transport is not None:
                self.transport.close()

    # request lifecycle
    def start(self, payload: bytes) -> asyncio.Future[Response]:
        """Write one request; the future resolves with the complete response."""
        assert self.transport is not None
        self._buf.clear()
        self._state = _HEAD
        self._raw = None
        self._tail = b""
        self._response = Response()
        self._keep_alive = True
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self._done

    def snapshot(self) -> Response:
        """The response as far as it arrived (for failures and cancellation)."""
        return self._response

    @property
    def reusable(self) -> bool:
        """Can serve another request."""
        return not self.closed and self._keep_alive and self._state == _DONE

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # framing
    def _feed(self, now: float, data: bytes) -> None:
        resp = self._response
        if self._state == _HEAD:
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    raise ProtocolError("response head too large")
                return
            self._parse_head(bytes(self._buf[:end]))
            resp.headers_at = now
            data = bytes(self._buf[end + 4 :])
            self._buf.clear()
            if self._state == _DONE:
                self._finish(now)
                return
            if self._state == _BODY_CHUNK_SIZE:
                self._raw = resp.raw = []
                self._tail = b"\r\n"  # so that a body of just "0\r\n\r\n" is recognised
                if data:
                    self.data_received_at(now, data)
                return
            if not data:
                return
        if self._state == _BODY_LENGTH:
            take = data[: self._remaining]
            self._piece(now, take)
            self._remaining -= len(take)
            if self._remaining == 0:
                self._finish(now)
            return
        if self._state == _BODY_CLOSE:
            self._piece(now, data)

    def data_received_at(self, now: float, data: bytes) -> None:
        """Append chunked bytes that arrived at `now` (the rest of the read that held the head)."""
        assert self._raw is not None
        if self._response.first_byte is None:
            self._response.first_byte = now
        self._raw.append((now, data))
        tail = (self._tail + data)[-7:]
        self._tail = tail
        if tail == b"\r\n0\r\n\r\n":
            self._finish(now)

    def _piece(self, now: float, data: bytes) -> None:
        if not data:
            return
        if self._response.first_byte is None:
            self._response.first_byte = now
        self._response.pieces.append((now, data))

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ProtocolError(f"bad status line {lines[0][:60]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise ProtocolError(f"bad status code {parts[1][:10]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:60]!r}")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        self._response.status = status
        self._response.headers = headers
        if headers.get("connection", "").lower() == "close" or parts[0] == b"HTTP/1.0":
            self._keep_alive = False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _BODY_CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self._remaining = int(headers["content-length"])
            except ValueError:
                raise ProtocolError("bad content-length") from None
            self._state = _BODY_LENGTH if self._remaining > 0 else _DONE
        elif status in (204, 304) or 100 <= status < 200:
            self._state = _DONE
        else:
            self._keep_alive = False
            self._state = _BODY_CLOSE

    def _finish(self, now: float) -> None:
        self._state = _DONE
        self._raw = None
        self._response.end = now
        self.last_used = now
        assert self._done is not None
        if not self._done.done():
            self._done.set_result(self._response)


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
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self.opened = 0
        """Connections opened so far."""
        self.kernel_timestamps = (
            kernel_stamps and self._ssl is None and stamping.kernel_timestamps_supported()
        )
        """Reads are stamped by the kernel (plain HTTP on Linux); else when the loop delivers them."""

    async def connect(self) -> _Connection:
        """Open a new connection."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.kernel_timestamps:
                    proto = await self._connect_socket(loop)
                else:
                    _, proto = await loop.create_connection(
                        _Connection, self.origin.host, self.origin.port, ssl=self._ssl
                    )
        except TimeoutError:
            raise ConnectError(f"connect to {self.origin.host}:{self.origin.port} timed out") from None
        except OSError as exc:
            raise ConnectError(f"connect to {self.origin.host}:{self.origin.port}: {exc}") from exc
        self.opened += 1
        self._all.add(proto)
        return proto

    async def _connect_socket(self, loop: asyncio.AbstractEventLoop) -> _Connection:
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
        conn = _Connection()
        conn.connection_made(cast(asyncio.Transport, stamping.SocketTransport(sock, conn, loop)))
        return conn

    def take_idle(self) -> _Connection | None:
        """The most recently used idle connection that is still usable, or None."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and now - conn.last_used < self.idle_timeout:
                return conn
            self._discard(conn)
        return None

    def release(self, conn: _Connection) -> None:
        """Return a connection after its response (closed ones are dropped)."""
        if conn.reusable:
            self._idle.append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: _Connection) -> None:
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
            if isinstance(r, _Connection):
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
    response: Response | None = None
    error: BaseException | None = None


Started = tuple[_Connection, "asyncio.Future[Response]"]


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
        conn: _Connection | None = None
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
        except DisconnectError as exc:
            if conn is not None:
                pool.release(conn)
            resp = conn.snapshot() if conn is not None else None
            if reused and attempts and resp is not None and resp.headers_at is None:
                continue  # stale keep-alive: nothing was received, retry on a new connection
            ex.response, ex.error = resp, exc
            return ex
        except (HttpError, TimeoutError) as exc:
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
) -> Response:
    """A plain GET (for /metrics, /health); raises HttpError or TimeoutError."""
    payload = request_bytes(pool.origin, "GET", path, {"Accept": "*/*", **(headers or {})})
    ex = await exchange(pool, payload, limit_s=limit_s)
    if ex.error is not None:
        raise ex.error
    assert ex.response is not None
    return ex.response
