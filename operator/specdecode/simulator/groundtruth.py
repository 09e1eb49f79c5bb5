"""Server-side ground truth: when each chunk of each request was written, and how many tokens it had.

One JSON object per finished request (JSONL with `--ground-truth FILE`, written every 0.2 s and
at exit; and at once at `GET /sim/ground_truth`):

    {"request_id": "chatcmpl-…", "x_request_id": "<client header or null>",
     "endpoint": "/v1/chat/completions",
     "stream": true, "status": "ok|error|aborted|disconnected|http_error", "http_status": 200,
     "arrival": <monotonic s>, "scheduled": <monotonic s or null>,
     "prompt_tokens": 256, "completion_tokens": 128,
     "finish_reason": "length", "wall_minus_monotonic": <time.time() - time.monotonic()>,
     "chunks": [[written_monotonic, tokens, step_boundary_monotonic], ...]}

Times are `time.monotonic()` seconds (CLOCK_MONOTONIC, shared by all processes of a Linux host),
so a client on the same host can subtract its own `time.monotonic()` stamps directly; add
`wall_minus_monotonic` for wall-clock time. `written` is taken just before the socket write (a
client may read the bytes before `write()` returns), so `client_ts - written >= 0` always holds;
`written - step_boundary` is the simulator's own lag. In memory a record keeps its chunks as a
flat `array('d')` (no per-chunk Python objects for the garbage collector to walk: with lists, full
collections over 10^7 chunk objects stalled the engine loop for tens of ms).
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import IO, Any


class GroundTruth:
    """Keeps the most recent records in memory and appends every record to an optional file."""

    def __init__(self, path: Path | None, *, keep: int = 200_000) -> None:
        self.records: deque[dict[str, Any]] = deque(maxlen=keep)
        self._file: IO[str] | None = path.open("a", encoding="utf-8") if path else None
        self._unwritten: list[dict[str, Any]] = []
        self.wall_minus_monotonic = time.time() - time.monotonic()

    def add(self, record: dict[str, Any]) -> None:
        """Store one finished request (cheap: called between chunk writes)."""
        record["wall_minus_monotonic"] = self.wall_minus_monotonic
        self.records.append(record)
        if self._file is not None:
            self._unwritten.append(record)

    def write_file(self) -> None:
        """Append the records added since the last call to the file (the server calls it every 0.2 s)."""
        if self._file is not None and self._unwritten:
            rows, self._unwritten = self._unwritten, []
            self._file.write("".join(self._dump(r) for r in rows))
            self._file.flush()

    @staticmethod
    def _dump(record: dict[str, Any]) -> str:
        flat = record["chunks"]
        chunks = [[flat[i], int(flat[i + 1]), flat[i + 2]] for i in range(0, len(flat), 3)]
        return json.dumps({**record, "chunks": chunks}, separators=(",", ":")) + "\n"

    def jsonl(self, request_id: str | None = None) -> bytes:
        """The records (or those whose request id or x-request-id is `request_id`) as JSONL."""
        rows = [
            r
            for r in self.records
            if request_id is None or request_id in (r["request_id"], r["x_request_id"])
        ]
        return "".join(self._dump(r) for r in rows).encode()

    def clear(self) -> None:
        """Forget the in-memory records (the file keeps them)."""
        self.records.clear()

    def close(self) -> None:
        """Write what is left and close the file."""
        self.write_file()
        if self._file is not None:
            self._file.close()
            self._file = None
