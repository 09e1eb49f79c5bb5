"""One keep-alive HTTP/1.1 connection of the load generator's client (`http.py`), and the client's failures.

`Connection` is an asyncio protocol that parses a response's head and body framing as its bytes
arrive and stamps each read: on plain-HTTP Linux connections with the kernel's receive time
(`stamping.SocketTransport` calls `received`), elsewhere in `data_received` before anything else.
The hot path only appends `(time, bytes)`; the chunked framing is undone after the stream ends
(`Response.decode`), the SSE splitting and JSON parsing later still (`sse.py`).

Invariants:
- Body pieces are kept as `(monotonic time of arrival, bytes)`; a piece's time is the time of the
  `data_received` call that delivered its first byte.
- A connection serves one request at a time and goes back to the pool only after a complete
  response without `Connection: close`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import cast

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


class Connection(asyncio.Protocol):
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
