"""Kernel receive timestamps for the load generator's HTTP client (`http.py`).

On plain-HTTP Linux connections the client reads its sockets with `recvmsg` and SO_TIMESTAMPNS, so
each read carries the kernel's receive time of its newest bytes rather than the moment the event
loop got round to the socket (`SocketTransport`). `kernel_timestamps_supported` says whether this
machine can; elsewhere the client stamps reads in `data_received` (asyncio's own transports).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from typing import Protocol


class Receiver(Protocol):
    """What the transport delivers to: `connection.Connection`."""

    def received(self, now: float, data: bytes) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


# Linux's SO_TIMESTAMPNS (the same number serves as the control message type); Python < 3.14
# does not name it.
SO_TIMESTAMPNS = int(getattr(socket, "SO_TIMESTAMPNS", 35))
CMSG_SPACE_TIMESPEC = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
_READ_SIZE = 262144
_TIMESPEC = struct.Struct("@qq")  # struct timespec on 64-bit Linux


class SocketTransport:
    """The part of a transport `connection.Connection` uses, over a socket the loop watches with add_reader.

    Reads use `recvmsg` with SO_TIMESTAMPNS: each read carries the kernel's receive time of its
    newest bytes, so a stamp no longer depends on how soon the event loop got round to the socket
    (with hundreds of streams whose chunks land in the same instant, that is milliseconds for the
    last one). A read holds one chunk unless the loop fell a whole engine step behind, and then the
    kernel stamp is still no later than the moment of reading.
    """

    def __init__(self, sock: socket.socket, proto: Receiver, loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._proto = proto
        self._loop = loop
        self._fd = sock.fileno()
        self._out = b""
        self._closing = False
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        sock = self._sock
        while True:
            try:
                data, anc, _, _ = sock.recvmsg(_READ_SIZE, CMSG_SPACE_TIMESPEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._lost(exc)
                return
            now = time.monotonic()
            if not data:
                self._lost(None)
                return
            at = now
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = _TIMESPEC.unpack_from(cdata)
                    # CLOCK_REALTIME -> CLOCK_MONOTONIC with the offset of this instant
                    at = min(now, sec + nsec * 1e-9 - (time.time() - now))
            self._proto.received(at, data)
            if len(data) < _READ_SIZE or self._closing:
                return

    def _lost(self, exc: Exception | None) -> None:
        if not self._closing:
            self.close()
            self._proto.connection_lost(exc)

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        if self._out:
            self._out += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lost(exc)
            return
        if sent < len(data):
            self._out = data[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        self._out = self._out[sent:]
        if not self._out:
            self._loop.remove_writer(self._fd)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if self._out:
            self._loop.remove_writer(self._fd)
        self._sock.close()


def kernel_timestamps_supported() -> bool:
    """SO_TIMESTAMPNS is available (Linux)."""
    if not sys.platform.startswith("linux") or not CMSG_SPACE_TIMESPEC or struct.calcsize("P") != 8:
        return False
    with socket.socket() as probe:
        try:
            probe.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            return False
    return True
