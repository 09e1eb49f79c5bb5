"""Reading an OpenAI-compatible SSE stream after it has arrived (vllm-0.33-facts §5.1).

Runs off the hot path: `http.py` keeps `(arrival time, bytes)` pieces; here they are split into
events (`data: <json>\\n\\n`, comment lines `:` skipped, `[DONE]` last), each event stamped with
the arrival time of its **first byte** (so events that share a TCP read share a stamp, and an event
split over reads keeps its earliest time), then parsed.

Token counts come from the cumulative `usage.completion_tokens` that vLLM puts on every chunk
with `continuous_usage_stats`; never from counting chunks (one chunk carries 1 + accepted tokens
under speculative decoding). If a server ignores `continuous_usage_stats`, each content-bearing
event counts as one token and `token_source` says `chunks` (a labelled fallback, loadgen-anchors (e)3).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from typing import Any

_SEPARATOR = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class MalformedStreamError(ValueError):
    """The body is not an SSE stream of JSON chunks."""


class StreamErrorEvent(Exception):
    """The server reported an error inside the stream (`data: {"error": ...}`)."""


@dataclass
class Stream:
    """What a completed stream said."""

    token_events: list[tuple[float, int]] = field(default_factory=list)
    """(time, cumulative completion tokens) of each event that added tokens."""
    n_events: int = 0
    """All data events (token-bearing or not), `[DONE]` excluded."""
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    metrics: dict[str, Any] | None = None
    """The final usage chunk's `metrics` object (with `speculative_decoding` when on)."""
    done: bool = False
    """`data: [DONE]` arrived."""
    token_source: str = "usage"
    """`usage` (cumulative usage on every chunk) or `chunks` (fallback: one token per content event)."""


def split_events(pieces: list[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """Raw SSE events with the arrival time of each event's first byte."""
    if not pieces:
        return []
    starts: list[int] = []
    offset = 0
    for _, chunk in pieces:
        starts.append(offset)
        offset += len(chunk)
    body = b"".join(chunk for _, chunk in pieces)
    events: list[tuple[float, bytes]] = []
    pos = 0
    for match in _SEPARATOR.finditer(body):
        raw = body[pos : match.start()]
        if raw.strip():
            # skip leading blank bytes so the stamp is that of the event's first real byte
            lead = len(raw) - len(raw.lstrip())
            at = pieces[bisect.bisect_right(starts, pos + lead) - 1][0]
            events.append((at, raw))
        pos = match.end()
    tail = body[pos:]
    if tail.strip():
        raise MalformedStreamError(f"stream ends inside an event: {tail[:60]!r}")
    return events


def _data(raw: bytes) -> bytes | None:
    """The joined `data:` lines of one event; None for a comment-only event."""
    data: list[bytes] = []
    for line in raw.splitlines():
        if not line or line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if name == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
        elif name in (b"event", b"id", b"retry"):
            continue
        else:
            raise MalformedStreamError(f"not an SSE line: {line[:60]!r}")
    return b"\n".join(data) if data else None


def parse(events: list[tuple[float, bytes]]) -> Stream:
    """Parse stamped events; raises MalformedStreamError or StreamErrorEvent."""
    out = Stream()
    parts: list[str] = []
    last_tokens = 0
    usage_seen_on_content = False
    fallback_tokens = 0
    for at, raw in events:
        data = _data(raw)
        if data is None:
            continue
        if data.strip() == b"[DONE]":
            out.done = True
            continue
        if out.done:
            raise MalformedStreamError("data after [DONE]")
        try:
            chunk = json.loads(data)
        except ValueError:
            raise MalformedStreamError(f"event is not JSON: {data[:60]!r}") from None
        if not isinstance(chunk, dict):
            raise MalformedStreamError("event is not a JSON object")
        if "error" in chunk:
            err = chunk["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise StreamErrorEvent(str(message)[:200])
        out.n_events += 1
        content = ""
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if piece:
                content += piece
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
        if content:
            parts.append(content)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            tokens = usage.get("completion_tokens")
            if isinstance(tokens, int):
                if chunk.get("choices"):
                    usage_seen_on_content = True
                    if tokens > last_tokens:
                        out.token_events.append((at, tokens))
                        last_tokens = tokens
                out.completion_tokens = tokens
            if isinstance(usage.get("prompt_tokens"), int):
                out.prompt_tokens = usage["prompt_tokens"]
        elif content and not usage_seen_on_content:
            fallback_tokens += 1
            out.token_events.append((at, fallback_tokens))
        if isinstance(chunk.get("metrics"), dict):
            out.metrics = chunk["metrics"]
    if not usage_seen_on_content and fallback_tokens:
        # usage only on the final chunk (or none): the per-event counts are a chunk-count fallback
        out.token_source = "chunks"
        if out.completion_tokens is not None and out.token_events:
            t_last, _ = out.token_events[-1]
            out.token_events[-1] = (t_last, out.completion_tokens)
    out.text = "".join(parts)
    return out
