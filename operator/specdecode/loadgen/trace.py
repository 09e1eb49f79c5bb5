"""Request traces replayed open loop (issue 17): parsing, the built-in `bursty` trace, send times.

A trace is JSONL, one request per line:

    {"timestamp": 0.0, "promptTokens": 512, "outputTokens": 128, "sessionId": "u1"}
    {"timestamp": 0.37, "prompt": "Summarise ...", "outputTokens": 64}

- `timestamp`: seconds, relative (any origin), non-decreasing from line to line;
- exactly one of `prompt` (text, sent as is after the nonce) or `promptTokens` (synthetic filler of
  about that many tokens, as the synthetic dataset makes it);
- `outputTokens`: the request's `max_tokens`;
- `sessionId` (optional): recorded in the request's prompt id (`<session>:<line>`).

Timing: the trace is a cycle of length `duration` = its span plus one mean gap, so its mean rate is
`len / duration` and a stage longer than the trace replays it again back to back. An open-loop stage
at `rate` replays it from the first record with every gap multiplied by `time_scale(rate)` =
trace rate / stage rate; both arms get those send times, request for request.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from specdecode.experiment import spec as spec_mod
from specdecode.loadgen import workload

FIELDS = ("timestamp", "prompt", "promptTokens", "outputTokens", "sessionId")

#: the built-in `bursty` trace: this many bursts, each of `BURST_SIZE` requests `BURST_GAP_S` apart
#: on average, separated by idle gaps drawn from `IDLE_S`
BURSTS = 16
BURST_SIZE = (4, 12)
BURST_GAP_S = 0.05
IDLE_S = (1.5, 4.0)


@dataclass(frozen=True)
class Record:
    """One request of a trace."""

    line: int
    timestamp: float
    output_tokens: int
    prompt: str | None = None
    prompt_tokens: int | None = None
    session_id: str | None = None

    @property
    def prompt_id(self) -> str:
        """`<session>:<line>`, or `trace:<line>` without a session."""
        return f"{self.session_id or 'trace'}:{self.line}"


@dataclass(frozen=True)
class Trace:
    """A parsed trace: at least two records, timestamps non-decreasing, spanning some time."""

    records: tuple[Record, ...]
    source: str

    @property
    def span(self) -> float:
        """Seconds from the first record to the last."""
        return self.records[-1].timestamp - self.records[0].timestamp

    @property
    def duration(self) -> float:
        """The cycle length: the span plus one mean gap (a replay longer than the trace repeats it)."""
        return self.span + self.span / (len(self.records) - 1)

    @property
    def rate(self) -> float:
        """Mean requests per second as recorded."""
        return len(self.records) / self.duration

    def time_scale(self, rate: float) -> float:
        """The factor on every gap that makes the replay's mean rate `rate`."""
        return self.rate / rate

    def offsets(self, n: int, *, rate: float) -> list[float]:
        """Send times of the first `n` requests of a replay at mean `rate`, seconds from the first."""
        scale = self.time_scale(rate)
        t0 = self.records[0].timestamp
        size = len(self.records)
        return [
            ((self.records[i % size].timestamp - t0) + (i // size) * self.duration) * scale for i in range(n)
        ]

    def describe(self) -> dict[str, object]:
        """For the summary's plan description."""
        return {
            "source": self.source,
            "records": len(self.records),
            "durationSeconds": round(self.duration, 6),
            "rate": round(self.rate, 6),
        }


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def read_trace(text: str, *, source: str) -> Trace:
    """Parse a JSONL trace; errors name the line and the field (`workload.DatasetError`)."""
    records: list[Record] = []
    for n, obj in workload.json_lines(text, source=source):
        where = f"{source}:{n}"
        unknown = sorted(set(obj) - set(FIELDS))
        if unknown:
            raise workload.DatasetError(
                f"{where}: unknown field {unknown[0]!r} (a trace record has {', '.join(FIELDS)})"
            )
        ts = obj.get("timestamp")
        if ts is None:
            raise workload.DatasetError(f"{where}: 'timestamp' is missing (seconds, relative)")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise workload.DatasetError(f"{where}: 'timestamp' must be a number of seconds, got {ts!r}")
        if records and ts < records[-1].timestamp:
            raise workload.DatasetError(
                f"{where}: 'timestamp' {ts:g} is before line {records[-1].line}'s {records[-1].timestamp:g};"
                " timestamps must be non-decreasing"
            )
        prompt, tokens = obj.get("prompt"), obj.get("promptTokens")
        if (prompt is None) == (tokens is None):
            raise workload.DatasetError(f"{where}: needs exactly one of 'prompt' or 'promptTokens'")
        if prompt is not None and not (isinstance(prompt, str) and prompt):
            raise workload.DatasetError(f"{where}: 'prompt' must be a non-empty string")
        if tokens is not None and not _whole(tokens):
            raise workload.DatasetError(
                f"{where}: 'promptTokens' must be a whole number >= 1, got {tokens!r}"
            )
        output = obj.get("outputTokens")
        if output is None:
            raise workload.DatasetError(f"{where}: 'outputTokens' is missing (the request's max_tokens)")
        if not _whole(output):
            raise workload.DatasetError(
                f"{where}: 'outputTokens' must be a whole number >= 1, got {output!r}"
            )
        session = obj.get("sessionId")
        if session is not None and not isinstance(session, str | int):
            raise workload.DatasetError(f"{where}: 'sessionId' must be a string, got {session!r}")
        records.append(
            Record(
                line=n,
                timestamp=float(ts),
                output_tokens=output,
                prompt=prompt,
                prompt_tokens=tokens,
                session_id=str(session) if session is not None else None,
            )
        )
    if len(records) < 2:
        raise workload.DatasetError(f"{source}: a trace needs at least two records (it has {len(records)})")
    trace = Trace(tuple(records), source)
    if trace.span <= 0:
        raise workload.DatasetError(
            f"{source}: every 'timestamp' is {records[0].timestamp:g}; a trace must span time"
        )
    return trace


def bursty(seed: int) -> Trace:
    """The built-in `bursty` trace: `BURSTS` bursts and idle gaps, deterministic in `seed`."""
    rng = random.Random(f"{seed}:trace:bursty")  # str seeds hash with sha512: stable across runs
    records: list[Record] = []
    t = 0.0
    for burst in range(BURSTS):
        if burst:
            t += rng.uniform(*IDLE_S)
        for i in range(rng.randint(*BURST_SIZE)):
            if i:
                t += rng.expovariate(1.0 / BURST_GAP_S)
            records.append(
                Record(
                    line=len(records) + 1,
                    timestamp=round(t, 6),
                    prompt_tokens=min(2048, max(16, round(rng.lognormvariate(math.log(256), 0.6)))),
                    output_tokens=min(256, max(16, round(rng.lognormvariate(math.log(64), 0.5)))),
                    session_id=f"burst{burst}",
                )
            )
    return Trace(tuple(records), "builtin:bursty")


def load(
    dataset: spec_mod.TraceDataset, base_dir: Path, *, seed: int, dataset_file: Path | None = None
) -> Trace:
    """The trace of a trace dataset (`dataset_file` overrides, e.g. the mounted ConfigMap key)."""
    if dataset.builtin is not None and dataset_file is None:
        return bursty(seed)
    text, source = workload.dataset_text(dataset.path, base_dir, dataset_file, what="trace")
    return read_trace(text, source=source)


def request(
    record: Record, *, model: str, sampling: spec_mod.Sampling, seed: int, salt: str, stage: str, index: int
) -> workload.PreparedRequest:
    """One trace request: nonce + the record's prompt (or filler of its length); `max_tokens` = `outputTokens`."""
    prefix = workload.nonce(salt, stage, index)
    if record.prompt is not None:
        text = record.prompt
    else:
        assert record.prompt_tokens is not None
        text = workload.synthetic_text(seed, stage, index, record.prompt_tokens - 4)  # the nonce is ~4 tokens
    rseed = workload.request_seed(seed, stage, index)
    payload = workload.body(
        model=model, sampling=sampling, seed=rseed, prompt=prefix + text, max_tokens=record.output_tokens
    )
    return workload.PreparedRequest(index, record.prompt_id, None, workload.COMPLETIONS, payload, rseed)
