"""What the load generator measures and the verdict judges: one record per request and arm.

`requests.jsonl` holds one `RequestRecord` per line (design.md §4). Times are seconds on the
load generator's monotonic clock, relative to the run's anchor (`RunAnchor`), so records from
one run compare directly; derived latencies are milliseconds, as in status.

Pairing: request `index` of stage `stage` was sent to both arms with the same prompt at the same
intended time, so (stage, index, control) and (stage, index, treatment) form a pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from specdecode.experiment.spec import Arm


class Record(BaseModel):
    """Base: snake_case JSON, tolerant of fields added by newer versions."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)


class RunAnchor(Record):
    """Ties the monotonic clock of a run to wall-clock time."""

    monotonic: float
    """`time.monotonic()` at the anchor."""
    wall: float
    """`time.time()` at the same instant (Unix seconds)."""


class RequestRecord(Record):
    """One request to one arm."""

    stage: str
    """Stage name (`warmup` for warm-up requests)."""
    index: int
    """Position in the stage's prompt sequence; the pair key together with `stage`."""
    arm: Arm
    """`control` or `treatment`."""
    warmup: bool = False
    """Warm-up requests are excluded from the analysis."""
    prompt_id: str = ""
    """Stable identifier of the prompt (same in both arms)."""
    category: str | None = None
    """Prompt category (chat, code, summarisation, math, ...), when the dataset has one."""
    intended: float | None = None
    """Scheduled send time (open loop); null in closed loop."""
    sent: float
    """Actual send time."""
    first_byte: float | None = None
    """First byte of the response body."""
    first_token: float | None = None
    """First event carrying at least one completion token."""
    end: float | None = None
    """Last byte (or the failure)."""
    events: list[tuple[float, int]] = Field(default_factory=list)
    """Every SSE event carrying tokens: (time, cumulative completion tokens from usage).

    The time is the arrival of the event's first byte: the kernel's receive time of that socket
    read where available (plain HTTP on Linux), else when the client's event loop delivered it."""
    ok: bool = False
    """Completed with a 200 and a full stream."""
    http_status: int | None = None
    """HTTP status, when one arrived."""
    error_class: str | None = None
    """connect, timeout, http_4xx, http_5xx, stream_error, malformed_sse, disconnect, other."""
    error: str | None = None
    """One line describing the failure."""
    prompt_tokens: int | None = None
    """From the server's usage."""
    completion_tokens: int | None = None
    """From the server's usage."""
    text: str | None = None
    """The generated text (kept for the equivalence check)."""
    text_hash: str | None = None
    """sha256 of the generated text."""
    diverges_at: int | None = None
    """First character where this text differs from the other arm's (null when equal or unknown)."""
    spec_decode: dict[str, Any] | None = None
    """The server's per-request `metrics.speculative_decoding`, when present."""
    request_id: str = ""
    """The `x-request-id` header sent (joins with server logs and the simulator's ground truth)."""
    slot: int | None = None
    """Closed loop: the arm's worker slot that sent it (0..concurrency-1); null in open loop."""
    session: int | None = None
    """Multi-turn sessions: the session within the stage (same in both arms); null otherwise."""
    turn: int | None = None
    """Multi-turn sessions: the turn within the session, from 1; sent to an arm only after that arm's
    reply to the turn before finished."""
    headers: float | None = None
    """Response head received."""
    connect_ms: float | None = None
    """Time to open a new connection for this request; null when a pooled one was reused."""
    finish_reason: str | None = None
    """The server's finish_reason (`length` with ignore_eos and max_tokens)."""
    n_events: int = 0
    """Data events in the stream (token-bearing or not; `[DONE]` excluded)."""
    token_source: str = "usage"
    """Where `events` token counts come from: `usage` (cumulative, exact) or `chunks` (fallback)."""
    server_metrics: dict[str, Any] | None = None
    """The usage chunk's other `metrics` fields (server TTFT excluding queue, queue time, ...)."""

    # Derived (design.md §5), milliseconds; null when not defined for this request.
    ttft_ms: float | None = None
    """First token - send."""
    ttft_from_intended_ms: float | None = None
    """First token - intended send (open loop: the schedule lag counts)."""
    tpot_ms: float | None = None
    """(last token - first token) / (output tokens - 1)."""
    e2e_ms: float | None = None
    """End - send."""
    schedule_lag_ms: float | None = None
    """Send - intended (open loop)."""

    @property
    def token_events(self) -> int:
        """Token-bearing SSE events (`events`)."""
        return len(self.events)

    @property
    def stream_tokens(self) -> int:
        """Completion tokens from the first token-bearing event to the last (0 with fewer than two)."""
        return self.events[-1][1] - self.events[0][1] if len(self.events) >= 2 else 0


@dataclass(slots=True, eq=False)
class PackedRequest:
    """A request record read back from packed columns: slotted, without the stream's events
    (`token_events`, `stream_tokens` stand for them), the server's other metrics, or the text
    (kept for mismatched pairs and a sample only). About 0.7 KB where a `RequestRecord` with its
    events takes ~35 KB (benchmarks/README.md, "Results at scale"). Fields are documented on
    `RequestRecord`."""

    stage: str
    index: int
    arm: Arm
    warmup: bool
    prompt_id: str
    category: str | None
    intended: float | None
    sent: float
    first_byte: float | None
    first_token: float | None
    end: float | None
    ok: bool
    http_status: int | None
    error_class: str | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    text: str | None
    text_hash: str | None
    diverges_at: int | None
    spec_decode: dict[str, Any] | None
    request_id: str
    slot: int | None
    session: int | None
    turn: int | None
    headers: float | None
    connect_ms: float | None
    finish_reason: str | None
    n_events: int
    token_source: str
    ttft_ms: float | None
    ttft_from_intended_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    schedule_lag_ms: float | None
    token_events: int
    stream_tokens: int


Request = RequestRecord | PackedRequest
"""What the analysis and the report read of a request record: a `RequestRecord` parsed from
`requests.jsonl`, or a `PackedRequest` read back from the packed results (results.py), which keeps
of the stream only `token_events` and `stream_tokens`, and the text only where it is needed."""


def _finite_or_unknown(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


Reading = Annotated[float | None, AfterValidator(_finite_or_unknown)]
"""A server-side reading: a NaN or infinite one (an engine's garbage, a windows.json written from one)
is unknown (None)."""


class ArmServerMetrics(Record):
    """Server-side measurements of one arm over one stage window (counter deltas, gauges)."""

    source: str = "metrics"
    """`metrics` (read from /metrics directly) or `prometheus`."""
    num_drafts: Reading = None
    """Δ vllm:spec_decode_num_drafts_total."""
    num_draft_tokens: Reading = None
    """Δ vllm:spec_decode_num_draft_tokens_total."""
    num_accepted_tokens: Reading = None
    """Δ vllm:spec_decode_num_accepted_tokens_total."""
    accepted_per_position: list[float] = Field(default_factory=list)
    """Δ vllm:spec_decode_num_accepted_tokens_per_pos_total by position."""
    kv_cache_usage_max: Reading = None
    """Highest vllm:kv_cache_usage_perc seen (fraction)."""
    requests_success: Reading = None
    """Δ vllm:request_success_total (all reasons)."""
    generation_tokens: Reading = None
    """Δ vllm:generation_tokens_total."""
    prefix_cache_queries: Reading = None
    """Δ vllm:prefix_cache_queries_total: prompt tokens looked up in the prefix cache."""
    prefix_cache_hits: Reading = None
    """Δ vllm:prefix_cache_hits_total: prompt tokens served from the prefix cache."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Anything else worth keeping (per pod breakdowns, histogram means)."""

    @field_validator("accepted_per_position")
    @classmethod
    def _finite_positions(cls, value: list[float]) -> list[float]:
        """Positions are read only whole: one NaN or infinite count drops the per-position breakdown."""
        return value if all(math.isfinite(v) for v in value) else []

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Hits / queries of the prefix cache over the window; None without lookups (caching off)."""
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


class StageWindow(Record):
    """When a stage ran, and what the servers said about it."""

    stage: str
    """Stage name."""
    start: float
    """Monotonic start (first intended send)."""
    end: float
    """Monotonic end (last response done)."""
    stopped_early: bool = False
    """Sequential analysis ended it before its request bound."""
    server: dict[Arm, ArmServerMetrics] = Field(default_factory=dict)
    """Per arm (`control`, `treatment`)."""
