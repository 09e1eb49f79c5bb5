"""Recording one request: a finished exchange and its parsed stream -> the `RequestRecord` the load Job writes.

`record` fills every field of the record (times relative to the run's anchor, the error class, the
stream's tokens, text and server metrics) and derives the rest (`summary.derive`); the runner pairs
the records of both arms (`diverges_at`) and writes them. Parsing a stream (`parse`) runs off the
hot path, in the runner's parser task, after the response ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pydantic

from specdecode.experiment import records, spec
from specdecode.loadgen import connection, http, sse, summary
from specdecode.loadgen.plan import StagePlan


def diverges_at(a: str | None, b: str | None) -> int | None:
    """First character where two texts differ; None when equal or unknown."""
    if a is None or b is None or a == b:
        return None
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def error_class(ex: http.Exchange, stream_error: BaseException | None) -> str | None:
    """The record's error class (records.RequestRecord.error_class)."""
    err = ex.error
    if err is None and stream_error is None:
        resp = ex.response
        if resp is not None and resp.status >= 400:
            return "http_4xx" if resp.status < 500 else "http_5xx"
        return None
    if isinstance(err, connection.ConnectError):
        return "connect"
    if isinstance(err, TimeoutError):
        return "timeout"
    if isinstance(err, connection.DisconnectError):
        return "disconnect"
    if isinstance(err, connection.ProtocolError):
        return "malformed_http"
    if isinstance(stream_error, connection.ProtocolError):
        return "malformed_http"
    if isinstance(stream_error, sse.StreamErrorEvent):
        return "stream_error"
    if isinstance(stream_error, sse.MalformedStreamError):
        return "malformed_sse"
    return "other"


async def parse(ex: http.Exchange) -> sse.Stream | BaseException | None:
    """The stream of a 200 response, read in slices that yield to the event loop (`sse.read`); the
    failure to parse it; None for a failed exchange or another status."""
    resp = ex.response
    if ex.error is None and resp is not None and resp.status == 200:
        try:
            resp.decode()
            return await sse.read(resp.pieces)  # in slices
        except (connection.ProtocolError, sse.MalformedStreamError, sse.StreamErrorEvent) as exc:
            return exc
    return None


def parse_now(ex: http.Exchange) -> sse.Stream | BaseException | None:
    """`parse` at once (on interruption, when the loop cannot wait for the slices)."""
    resp = ex.response
    if ex.error is None and resp is not None and resp.status == 200:
        try:
            resp.decode()
            return sse.parse(sse.split_events(resp.pieces))
        except (connection.ProtocolError, sse.MalformedStreamError, sse.StreamErrorEvent) as exc:
            return exc
    return None


def record(
    sp: StagePlan,
    anchor: float,
    i: int,
    arm: spec.Arm,
    rid: str,
    ex: http.Exchange,
    intended: float | None,
    slot: int | None,
    parsed_or_error: sse.Stream | BaseException | None,
    *,
    cancelled: bool = False,
) -> records.RequestRecord:
    """The record of request `i` of stage `sp` on `arm`, its times relative to the run's `anchor`
    (monotonic seconds), with its derived fields (`summary.derive`)."""

    def rel(t: float | None) -> float | None:
        return None if t is None else t - anchor

    stream_error: BaseException | None = None
    parsed: sse.Stream | None = None
    if isinstance(parsed_or_error, sse.Stream):
        parsed = parsed_or_error
        if not parsed.done:
            stream_error = sse.MalformedStreamError("stream ended without [DONE]")
    elif parsed_or_error is not None:
        stream_error = parsed_or_error
    timing = _timing(sp, i, arm, rid, ex, intended, slot, rel)
    fields = {**timing, **_outcome(ex, stream_error, parsed is not None, cancelled)}
    if parsed is not None:
        fields.update(_stream_fields(parsed, anchor))
    try:
        rec = records.RequestRecord(**fields)
    except pydantic.ValidationError as exc:
        # Engine data no check above foresaw: the request is a counted error that says why, never a
        # record dropped (its pair would never be judged) or one that fails when the run is stored.
        rec = records.RequestRecord(
            **timing,
            ok=False,
            error_class="malformed_sse",
            error=f"an event of an unexpected shape ({_first_error(exc)})"[:300],
        )
    return summary.derive(rec)


def _timing(
    sp: StagePlan,
    i: int,
    arm: spec.Arm,
    rid: str,
    ex: http.Exchange,
    intended: float | None,
    slot: int | None,
    rel: Callable[[float | None], float | None],
) -> dict[str, Any]:
    """What a record holds whatever the engine answered: the request, its pairing and its times."""
    req = sp.requests[i]
    resp = ex.response
    fields: dict[str, Any] = dict(
        stage=sp.name,
        index=sp.index_of(i),
        arm=arm,
        warmup=sp.warmup,
        prompt_id=req.prompt_id,
        category=req.category,
        intended=rel(intended),
        sent=rel(ex.sent) if ex.sent else rel(time.monotonic()),
        request_id=rid,
        slot=slot,
        session=req.session,
        turn=req.turn,
        connect_ms=None if ex.connect_s is None else ex.connect_s * 1e3,
    )
    if resp is not None:
        fields.update(
            http_status=resp.status or None,
            headers=rel(resp.headers_at),
            first_byte=rel(resp.first_byte),
            end=rel(resp.end),
        )
    if fields.get("end") is None:
        fields["end"] = rel(time.monotonic())
    return fields


def _outcome(
    ex: http.Exchange, stream_error: BaseException | None, parsed: bool, cancelled: bool
) -> dict[str, Any]:
    """ok, the error class and the one-line error."""
    if cancelled:
        return dict(ok=False, error_class="cancelled", error="run interrupted")
    cls = error_class(ex, stream_error)
    fields: dict[str, Any] = dict(error_class=cls, ok=cls is None and parsed)
    if cls is not None:
        resp = ex.response
        detail = ex.error or stream_error
        if detail is None and resp is not None:
            detail_text = resp.body[:200].decode("utf-8", "replace").replace("\n", " ")
            fields["error"] = f"HTTP {resp.status}: {detail_text}"
        else:
            fields["error"] = f"{type(detail).__name__}: {detail}"[:300]
    return fields


def _stream_fields(parsed: sse.Stream, anchor: float) -> dict[str, Any]:
    """What the stream said: its token events, text, counts and the server's per-request metrics."""
    events = [(t - anchor, n) for t, n in parsed.token_events]
    metrics = dict(parsed.metrics) if parsed.metrics else None
    spec_decode = metrics.pop("speculative_decoding", None) if metrics else None
    return dict(
        events=events,
        first_token=events[0][0] if events else None,
        text=parsed.text,
        text_hash=summary.sha256(parsed.text),
        prompt_tokens=parsed.prompt_tokens,
        completion_tokens=parsed.completion_tokens,
        finish_reason=parsed.finish_reason,
        n_events=parsed.n_events,
        token_source=parsed.token_source,
        spec_decode=spec_decode if isinstance(spec_decode, dict) else None,
        server_metrics=metrics or None,
    )


def _first_error(exc: pydantic.ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}"
