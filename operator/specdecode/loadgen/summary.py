"""Derived per-request metrics (design.md §5) and the run summary with its validity block.

Definitions (also written into `loadgen-summary.json` under `definitions`):
- TTFT = first token event - send; TTFT from intended = first token event - intended send.
- TPOT = (last token event - first token event) / (output tokens - 1), output tokens from usage.
- E2E = end of the response body - send.
- ITL per event: gap between consecutive token-bearing events (one sample per event).
- ITL per token: each event's gap divided by the tokens it carried, repeated once per token
  (token-weighted; comparable across arms under speculative decoding).
- Output throughput = output tokens of successful requests / the arm's own active time in the stage
  (its first send → its last response end), so a faster arm shows more than the slower one;
  warm-up excluded (it is its own stage).
- Schedule lag = send - intended (open loop).
Percentiles are over requests (linear interpolation between order statistics), successful
requests only; errors are counted by class.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from specdecode.experiment import pairing, records, spec, validity

if TYPE_CHECKING:
    from specdecode.loadgen.plan import Plan

DEFINITIONS = {
    "ttft_ms": "first token-bearing SSE event (first byte) - send, per request",
    "ttft_from_intended_ms": "first token-bearing SSE event - intended send (open loop; schedule lag counts)",
    "tpot_ms": "(last token event - first token event) / (usage.completion_tokens - 1), per request",
    "e2e_ms": "end of response body - send",
    "itl_event_ms": (
        "gap between consecutive token-bearing SSE events; one sample per event (vllm bench 'ITL')"
    ),
    "itl_token_ms": "event gap / tokens in the event, one sample per token (token-weighted)",
    "tokens_per_event": (
        "completion tokens carried by one token-bearing event (1 + accepted under spec decode)"
    ),
    "output_tokens_per_s": (
        "sum of usage.completion_tokens of successful requests / the arm's active time (first send"
        " → last response end of that arm in the stage)"
    ),
    "requests_per_s": "successful requests / the arm's active time",
    "schedule_lag_ms": "send - intended send (open loop)",
    "acceptance_length_proxy": (
        "client proxy of mean acceptance length: (output tokens - 1) / (token events - 1)"
    ),
    "clock": "time.monotonic(); record times are seconds after anchor.monotonic (anchor.wall: Unix time)",
    "send": "just before the request bytes are written to an open connection (connection setup excluded,"
    " reported as connect_ms)",
    "event time": (
        "arrival of the event's first byte: the kernel's receive time of the socket read that held it"
        " (SO_TIMESTAMPNS; validity.stamps = kernel), else the moment the event loop delivered the read"
        " (stamps = loop); always before any parsing"
    ),
}


def sha256(text: str) -> str:
    """Hex sha256 of a text (UTF-8)."""
    return hashlib.sha256(text.encode()).hexdigest()


def derive(rec: records.RequestRecord) -> records.RequestRecord:
    """Fill the derived millisecond fields of a record."""
    upd: dict[str, float | None] = {}
    if rec.intended is not None:
        upd["schedule_lag_ms"] = (rec.sent - rec.intended) * 1e3
    if rec.ok:
        if rec.first_token is not None:
            upd["ttft_ms"] = (rec.first_token - rec.sent) * 1e3
            if rec.intended is not None:
                upd["ttft_from_intended_ms"] = (rec.first_token - rec.intended) * 1e3
        if rec.end is not None:
            upd["e2e_ms"] = (rec.end - rec.sent) * 1e3
        n = rec.completion_tokens
        if n is not None and n > 1 and len(rec.events) >= 1 and rec.first_token is not None:
            upd["tpot_ms"] = (rec.events[-1][0] - rec.first_token) * 1e3 / (n - 1)
    return rec.model_copy(update=upd)


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def dist(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean, p50, p90, p99, max."""
    return {
        "n": len(values),
        "mean": sum(values) / len(values) if values else None,
        "p50": quantile(values, 0.5),
        "p90": quantile(values, 0.9),
        "p99": quantile(values, 0.99),
        "max": max(values) if values else None,
    }


def _itl(recs: Sequence[records.RequestRecord]) -> tuple[list[float], list[float], list[float]]:
    per_event: list[float] = []
    per_token: list[float] = []
    tokens_per_event: list[float] = []
    for r in recs:
        prev_t, prev_n = None, 0
        for t, n in r.events:
            k = n - prev_n
            tokens_per_event.append(float(k))
            if prev_t is not None and k > 0:
                gap = (t - prev_t) * 1e3
                per_event.append(gap)
                per_token.extend([gap / k] * k)
            prev_t, prev_n = t, n
    return per_event, per_token, tokens_per_event


def arm_summary(
    recs: Sequence[records.RequestRecord],
    control: dict[tuple[str, int], records.RequestRecord] | None,
) -> dict[str, Any]:
    """Statistics of one arm in one stage."""
    ok = [r for r in recs if r.ok]
    active_s = pairing.active_seconds(recs)
    errors = Counter(r.error_class or "other" for r in recs if not r.ok)
    per_event, per_token, tpe = _itl(ok)
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    proxies = [((r.completion_tokens or 0) - 1) / (len(r.events) - 1) for r in ok if len(r.events) > 1]
    out: dict[str, Any] = {
        "requests": len(recs),
        "ok": len(ok),
        "errors": dict(errors),
        "ttft_ms": dist([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "ttft_from_intended_ms": dist(
            [r.ttft_from_intended_ms for r in ok if r.ttft_from_intended_ms is not None]
        ),
        "tpot_ms": dist([r.tpot_ms for r in ok if r.tpot_ms is not None]),
        "e2e_ms": dist([r.e2e_ms for r in ok if r.e2e_ms is not None]),
        "itl_event_ms": dist(per_event),
        "itl_token_ms": dist(per_token),
        "tokens_per_event": dist(tpe),
        "schedule_lag_ms": dist([r.schedule_lag_ms for r in recs if r.schedule_lag_ms is not None]),
        "output_tokens": out_tokens,
        "active_s": active_s,
        "output_tokens_per_s": out_tokens / active_s if active_s > 0 else None,
        "requests_per_s": len(ok) / active_s if active_s > 0 else None,
        "acceptance_length_proxy": dist(proxies),
        "token_source_chunks": sum(1 for r in ok if r.token_source != "usage"),
    }
    decoded = [r.spec_decode for r in ok if r.spec_decode]
    if decoded:
        out["spec_decode"] = {
            "requests": len(decoded),
            "mean_acceptance_length": dist(
                [
                    float(s["mean_acceptance_length"])
                    for s in decoded
                    if isinstance(s.get("mean_acceptance_length"), int | float)
                ]
            ),
            "draft_acceptance_rate": dist(
                [
                    float(s["draft_acceptance_rate"])
                    for s in decoded
                    if isinstance(s.get("draft_acceptance_rate"), int | float)
                ]
            ),
        }
    if control is not None:
        pairs = [(r, control.get((r.stage, r.index))) for r in ok]
        both = [(r, c) for r, c in pairs if c is not None and c.ok]
        if both:
            out["output_match"] = sum(1 for r, c in both if r.text_hash == c.text_hash) / len(both)
            out["output_match_pairs"] = len(both)
    return out


def build(
    plan: Plan,
    recs: Sequence[records.RequestRecord],
    windows: Sequence[records.StageWindow],
    anchor: records.RunAnchor,
    *,
    loop_lags_ms: Sequence[float],
    cpu_percent: float,
    interrupted: bool,
    connections: Mapping[spec.Arm, int],
    stamps: str = "loop",
) -> dict[str, Any]:
    """The `loadgen-summary.json` document."""
    stages: list[dict[str, Any]] = []
    control_arm = spec.Arm.CONTROL
    control = {(r.stage, r.index): r for r in recs if r.arm == control_arm}
    arms = [arm for arm in spec.Arm if any(r.arm == arm for r in recs)]
    plans = {sp.name: sp for sp in plan.stages}
    for w in windows:
        stage_recs = [r for r in recs if r.stage == w.stage]
        sp = plans.get(w.stage)
        entry: dict[str, Any] = {
            "stage": w.stage,
            "warmup": bool(sp and sp.warmup),
            "rate": sp.rate if sp else None,
            "concurrency": sp.concurrency if sp else None,
            "planned_requests": len(sp.requests) if sp else None,
            "window_s": w.end - w.start,
            "stopped_early": w.stopped_early,
            "arms": {
                arm: arm_summary(
                    [r for r in stage_recs if r.arm == arm], control if arm != spec.Arm.CONTROL else None
                )
                for arm in arms
            },
        }
        if w.server:
            entry["server"] = {arm: m.model_dump() for arm, m in w.server.items()}
        stages.append(entry)
    return {
        "anchor": anchor.model_dump(),
        "plan": {
            "seed": plan.seed,
            "salt": plan.salt,
            **plan.description,
            "stages": [
                {
                    "name": sp.name,
                    "rate": sp.rate,
                    "concurrency": sp.concurrency,
                    "requests": len(sp.requests),
                    "warmup": sp.warmup,
                }
                for sp in plan.stages
            ],
        },
        "interrupted": interrupted,
        "stages": stages,
        "validity": judge(
            plan,
            recs,
            loop_lags_ms=loop_lags_ms,
            cpu_percent=cpu_percent,
            interrupted=interrupted,
            connections=connections,
            stamps=stamps,
        ).wire(),
        "definitions": DEFINITIONS,
    }


def judge(
    plan: Plan,
    recs: Sequence[records.RequestRecord],
    *,
    loop_lags_ms: Sequence[float],
    cpu_percent: float,
    interrupted: bool,
    connections: Mapping[spec.Arm, int],
    stamps: str = "loop",
) -> validity.Validity:
    """The run's validity block: the client's own overhead against the plan's budgets."""
    measured = [r for r in recs if not r.warmup]
    lags = [r.schedule_lag_ms for r in measured if r.schedule_lag_ms is not None]
    ttfts = [r.ttft_ms for r in measured if r.ttft_ms is not None]
    b = plan.budgets
    ttft_p50 = quantile(ttfts, 0.5)
    lag_budget = max(b.schedule_lag_p99_ms, b.schedule_lag_ttft_fraction * ttft_p50 if ttft_p50 else 0.0)
    lag_p99 = quantile(lags, 0.99)
    loop_p99 = quantile(loop_lags_ms, 0.99)
    reasons: list[str] = []
    if lag_p99 is not None and lag_p99 > lag_budget:
        reasons.append(f"schedule lag p99 {lag_p99:.2f} ms > budget {lag_budget:.2f} ms")
    # A late event loop delays the stamps only when the loop takes them; with kernel receive
    # stamps it delays sends, which open loop counts as schedule lag and closed loop as a later send.
    if stamps == "loop" and loop_p99 is not None and loop_p99 > b.loop_lag_p99_ms:
        reasons.append(f"event-loop lag p99 {loop_p99:.2f} ms > budget {b.loop_lag_p99_ms:.2f} ms")
    if cpu_percent > b.cpu_percent:
        reasons.append(f"client CPU {cpu_percent:.0f}% > budget {b.cpu_percent:.0f}%")
    if interrupted:
        reasons.append(validity.INTERRUPTED)
    return validity.Validity(
        valid=not reasons,
        reasons=reasons,
        schedule_lag_ms=validity.Distribution.model_validate(dist(lags)),
        schedule_lag_budget_ms=lag_budget,
        loop_lag_ms=validity.Distribution.model_validate(dist(list(loop_lags_ms))),
        loop_lag_budget_ms=b.loop_lag_p99_ms,
        client_cpu_percent=cpu_percent,
        client_cpu_budget_percent=b.cpu_percent,
        connections_opened=dict(connections),
        stamps=stamps,
    )
