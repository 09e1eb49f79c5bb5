"""A small HTTP/1.1 server on asyncio + httptools: just what vLLM's clients use.

Why not uvicorn + ASGI: with ASGI every stream's chunk goes through its own task (`await send`),
so one engine step that emits to 500 streams costs 500 task wake-ups plus ASGI message dicts
(tens of µs each, i.e. ~10 ms of lag for the last stream). Here the engine writes each step's
pre-rendered chunks straight to the sockets in one loop, about 1 µs of Python per chunk on top of
the kernel's loopback send (3-7 µs on the 2-vCPU VM we measured on; `benchmarks/simulator/sendfloor.py`
measures that floor). See benchmarks/README.md for the lag this gives per number of streams.

Supported: keep-alive, pipelined requests (answered in order), `Content-Length` bodies, chunked
responses for SSE. Not supported (not needed by OpenAI clients, Prometheus or the load generator):
request bodies with chunked transfer encoding trailers, `Expect: 100-continue` (answered anyway), TLS.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Protocol, cast

import httptools

REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


@dataclass(slots=True)
class Request:
    """One parsed request."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class Handler(Protocol):
    """The application: answers a request on a connection (now or later)."""

    def handle(self, request: Request, conn: Connection) -> None:
        """Start answering `request`; must end with `conn.respond` or `conn.end_stream`."""


_date_cache: tuple[int, bytes] = (0, b"")


def _date() -> bytes:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True).encode())
    return _date_cache[1]


class Connection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.on_lost: Callable[[], None] | None = None
        """Called once if the connection drops while a response is in progress."""
        self._busy = False
        self._keep_alive = True
        self._pending: deque[Request] = deque()
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    # ------------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail_and_close()
        except httptools.HttpParserError:
            self._fail_and_close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        cb, self.on_lost = self.on_lost, None
        if cb is not None:
            cb()

    # ------------------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        url = httptools.parse_url(self._url)
        method = self.parser.get_method().decode()
        req = Request(
            method=method,
            path=(url.path or b"/").decode("latin-1"),
            query=(url.query or b"").decode("latin-1"),
            headers=self._headers,
            body=b"".join(self._body),
            keep_alive=self.parser.should_keep_alive(),
        )
        if self._busy:
            self._pending.append(req)
        else:
            self._dispatch(req)

    # ---------------------------------------------------------------------------------- writing
    def _dispatch(self, req: Request) -> None:
        self._busy = True
        self._keep_alive = req.keep_alive
        self.handler.handle(req, self)

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        lines = [
            b"HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\n"
            % (status, REASONS.get(status, b"OK"), _date())
        ]
        lines.extend(b"%s: %s\r\n" % kv for kv in headers)
        if not self._keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Send a whole response."""
        hs = [(b"content-length", b"%d" % len(body)), (b"content-type", content_type), *(headers or [])]
        if self.transport is not None and not self.closed:
            self.transport.write(self._head(status, hs) + body)
        self._done()

    def start_stream(self, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Send the head of a chunked `text/event-stream` response."""
        hs = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"transfer-encoding", b"chunked"),
            *(headers or []),
        ]
        if self.transport is not None and not self.closed:
            self.transport.write(self._head(200, hs))

    def write(self, data: bytes) -> None:
        """Write bytes that are already chunk-framed (see `frame`)."""
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def end_stream(self) -> None:
        """The stream's last bytes (incl. the terminating chunk) have been written."""
        self._done()

    def abort(self) -> None:
        """Drop the connection without finishing the response (mid-stream disconnect fault)."""
        self.on_lost = None
        if self.transport is not None:
            self.transport.abort()
        self.closed = True

    def _done(self) -> None:
        self._busy = False
        self.on_lost = None
        if not self._keep_alive:
            if self.transport is not None:
                self.transport.close()
            self.closed = True
            return
        if self._pending and not self.closed:
            self._dispatch(self._pending.popleft())

    def _fail_and_close(self) -> None:
        if self.transport is not None and not self.closed:
            body = b'{"detail":"Invalid HTTP request"}'
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (len(body), body)
            )
            self.transport.close()
        self.closed = True


def frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
