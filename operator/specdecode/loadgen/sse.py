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

import asyncio
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

_loads: Callable[[bytes], Any]
try:  # 2-3x faster than the standard library on stream chunks; optional
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _loads = json.loads


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
    events: list[tuple[float, bytes]] = []
    append = events.append
    buf = b""  # an unfinished event carried over from earlier pieces
    buf_at = 0.0  # arrival of its first non-blank byte
    for at, chunk in pieces:
        if buf:
            first_at = buf_at if buf.strip() else at
            data = buf + chunk
        else:
            first_at, data = at, chunk
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        parts = data.split(b"\n\n")
        tail = parts.pop()
        if parts:
            raw = parts[0]
            if raw and not raw.isspace():
                append((first_at, raw))
            for raw in parts[1:]:
                if raw and not raw.isspace():
                    append((at, raw))
            buf, buf_at = tail, at
        else:
            buf, buf_at = data, first_at
    if buf.strip():
        raise MalformedStreamError(f"stream ends inside an event: {buf[:60]!r}")
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


def _decode(datas: list[bytes]) -> list[Any]:
    """JSON-decode every event in one call (per-call overhead dominates for small chunks)."""
    try:
        return list(_loads(b"[" + b",".join(datas) + b"]"))
    except ValueError:
        for data in datas:  # find the culprit for the message
            try:
                json.loads(data)
            except ValueError:
                raise MalformedStreamError(f"event is not JSON: {data[:60]!r}") from None
        raise MalformedStreamError("events are not JSON") from None


def parse(events: list[tuple[float, bytes]]) -> Stream:
    """Parse stamped events; raises MalformedStreamError or StreamErrorEvent."""
    out = Stream()
    try:
        for _ in _steps(events, out, len(events) + 1):
            pass
    except _WRONG_SHAPE as exc:
        raise _wrong_shape(exc) from None
    return out


async def read(pieces: list[tuple[float, bytes]], *, step: int = 128) -> Stream:
    """`parse(split_events(pieces))`, yielding to the event loop every `step` events.

    A long stream takes milliseconds to parse; in slices, other streams' bytes are still stamped
    on time meanwhile.
    """
    out = Stream()
    try:
        for _ in _steps(split_events(pieces), out, step):
            await asyncio.sleep(0)
    except _WRONG_SHAPE as exc:
        raise _wrong_shape(exc) from None
    return out


# JSON events of the wrong shape (`{"choices": ["x"]}`, `"delta": "a"`, `"completion_tokens": "5"`,
# `"usage": [1]`) raise these in `_steps`: a malformed stream, like non-JSON data.
_WRONG_SHAPE = (AttributeError, TypeError, KeyError, IndexError)


def _wrong_shape(exc: Exception) -> MalformedStreamError:
    return MalformedStreamError(f"an event of an unexpected shape ({type(exc).__name__}: {str(exc)[:120]})")


#: The counts of vLLM's per-request `metrics.speculative_decoding` (facts §5.1): whole and >= 0.
_SPEC_COUNTS = ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens")
#: Its ratios: finite numbers.
_SPEC_RATIOS = ("mean_acceptance_length", "draft_acceptance_rate")


def _kind(value: object) -> str:
    """A JSON value's type in words, for an error message."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), f"the {type(value).__name__} {value!r}"[:60]
    )


def _wrong_type(what: str) -> MalformedStreamError:
    return MalformedStreamError(f"an event of an unexpected shape: {what}")


def _whole(value: object) -> bool:
    return type(value) is int and value >= 0


def _count(usage: dict[str, Any], key: str) -> int | None:
    """`usage[key]`: a whole count >= 0, or None when absent; anything else is a malformed stream."""
    value = usage.get(key)
    if value is None or _whole(value):
        return value
    raise _wrong_type(f"usage.{key} is {_kind(value)}, not a whole count")


def _checked_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The final chunk's `metrics`, its `speculative_decoding` checked: counts whole and >= 0, ratios
    finite, the histogram whole counts. A wrong type is a malformed stream (a counted error that says
    which field), never a record whose numbers fail later, when the run is judged or stored."""
    sd = metrics.get("speculative_decoding")
    if sd is None:
        return metrics
    where = "metrics.speculative_decoding"
    if not isinstance(sd, dict):
        raise _wrong_type(f"{where} is {_kind(sd)}, not an object")
    for key in _SPEC_COUNTS:
        if sd.get(key) is not None and not _whole(sd[key]):
            raise _wrong_type(f"{where}.{key} is {_kind(sd[key])}, not a whole count")
    for key in _SPEC_RATIOS:
        value = sd.get(key)
        if value is not None and not (type(value) in (int, float) and math.isfinite(value)):
            raise _wrong_type(f"{where}.{key} is {_kind(value)}, not a finite number")
    hist = sd.get("acceptance_histogram")
    if hist is not None and not (isinstance(hist, list) and all(_whole(c) for c in hist)):
        raise _wrong_type(f"{where}.acceptance_histogram is not an array of whole counts")
    return metrics


def _steps(events: list[tuple[float, bytes]], out: Stream, step: int) -> Iterator[None]:
    """The parser, as a generator that pauses every `step` events."""
    times: list[float] = []
    datas: list[bytes] = []
    for at, raw in events:
        if raw.startswith(b"data: ") and b"\n" not in raw:
            data: bytes | None = raw[6:]  # the common case: one data line
        else:
            data = _data(raw)
        if data is None:
            continue
        if data.strip() == b"[DONE]":
            out.done = True
            continue
        if out.done:
            raise MalformedStreamError("data after [DONE]")
        times.append(at)
        datas.append(data)
    parts: list[str] = []
    token_events = out.token_events
    last_tokens = 0
    usage_seen_on_content = False
    fallback_tokens = 0
    decoded: list[Any] = []
    for k in range(0, len(datas), step):
        decoded += _decode(datas[k : k + step])
        yield
    for n, (at, chunk) in enumerate(zip(times, decoded, strict=True), start=1):
        if n % step == 0:
            yield
        if type(chunk) is not dict:
            raise MalformedStreamError("event is not a JSON object")
        choices = chunk.get("choices")
        if choices:
            # one choice: requests never set n > 1
            choice = choices[0]
            piece = choice.get("text")
            if piece is None:
                delta = choice.get("delta")
                piece = delta.get("content") if delta else None
            if piece:
                parts.append(piece)
            finish = choice.get("finish_reason")
            if finish:
                if not isinstance(finish, str):
                    raise _wrong_type(f"finish_reason is {_kind(finish)}, not a string")
                out.finish_reason = finish
        elif "error" in chunk:
            err = chunk["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise StreamErrorEvent(str(message)[:200])
        else:
            piece = None
        usage = chunk.get("usage")
        if usage:
            tokens = _count(usage, "completion_tokens")
            if tokens is not None:
                if choices:
                    usage_seen_on_content = True
                    if tokens > last_tokens:
                        token_events.append((at, tokens))
                        last_tokens = tokens
                out.completion_tokens = tokens
            if "prompt_tokens" in usage:
                out.prompt_tokens = _count(usage, "prompt_tokens")
        elif piece and not usage_seen_on_content:
            fallback_tokens += 1
            token_events.append((at, fallback_tokens))
        if "metrics" in chunk and isinstance(chunk["metrics"], dict):
            out.metrics = _checked_metrics(chunk["metrics"])
    out.n_events = len(datas)
    if not usage_seen_on_content and fallback_tokens:
        # usage only on the final chunk (or none): the per-event counts are a chunk-count fallback
        out.token_source = "chunks"
        if out.completion_tokens is not None and out.token_events:
            t_last, _ = out.token_events[-1]
            out.token_events[-1] = (t_last, out.completion_tokens)
    out.text = "".join(parts)
