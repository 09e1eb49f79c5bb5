"""Server-side counters from each arm's `/metrics` at stage boundaries (vllm-0.33-facts §3).

A `Snapshot` sums every sample of a metric over its label sets (per `position` for the per-position
acceptance counter); the stage's `ArmServerMetrics` is the difference of the snapshots at its end
and its start, plus the largest `vllm:kv_cache_usage_perc` seen by the periodic scrapes in between.
Scrape the pod, not a load-balanced Service (loadgen-anchors (c)11): in a cluster the operator
reads Prometheus per pod instead, so this is optional.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specdecode.experiment import records, spec
from specdecode.loadgen import connection, http

log = logging.getLogger(__name__)

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
SUCCESS = "vllm:request_success_total"
GENERATION = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
_COUNTERS = (
    DRAFTS,
    DRAFT_TOKENS,
    ACCEPTED,
    SUCCESS,
    GENERATION,
    PROMPT,
    PREEMPTIONS,
    PREFIX_QUERIES,
    PREFIX_HITS,
)
_KEPT = frozenset((*_COUNTERS, KV_USAGE, ACCEPTED_PER_POS))


@dataclass
class Snapshot:
    """Sums of the metrics we keep, from one scrape."""

    values: dict[str, float] = field(default_factory=dict)
    per_position: dict[int, float] = field(default_factory=dict)
    unusable: set[str] = field(default_factory=set)
    """Metrics we keep that had a NaN or infinite sample: left out of `values` (unknown), logged."""


def parse(text: str) -> Snapshot:
    """Parse Prometheus text exposition; unknown metrics are ignored, and a metric we keep with a
    NaN or infinite sample is unknown (in `unusable`, not in `values`): a delta is never computed from it."""
    snap = Snapshot()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name not in _KEPT:
                continue
            if not math.isfinite(sample.value):
                snap.unusable.add(name)
            elif name == ACCEPTED_PER_POS:
                try:
                    pos = int(sample.labels.get("position", ""))
                except ValueError:
                    continue
                snap.per_position[pos] = snap.per_position.get(pos, 0.0) + sample.value
            else:
                snap.values[name] = snap.values.get(name, 0.0) + sample.value
    for name in snap.unusable:
        snap.values.pop(name, None)
    if ACCEPTED_PER_POS in snap.unusable:
        snap.per_position.clear()
    return snap


def delta(before: Snapshot | None, after: Snapshot | None, kv_max: float | None) -> records.ArmServerMetrics:
    """Counter deltas over a window (None where a scrape or the metric is missing)."""

    def d(name: str) -> float | None:
        if before is None or after is None or name not in after.values:
            return None
        change = after.values[name] - before.values.get(name, 0.0)
        return change if change >= 0 else None  # a counter that went down: the server restarted

    per_pos: list[float] = []
    if before is not None and after is not None and after.per_position:
        per_pos = [
            after.per_position.get(p, 0.0) - before.per_position.get(p, 0.0)
            for p in range(max(after.per_position) + 1)
        ]
    extra: dict[str, float] = {}
    for name, key in ((PROMPT, "prompt_tokens"), (PREEMPTIONS, "preemptions")):
        value = d(name)
        if value is not None:
            extra[key] = value
    return records.ArmServerMetrics(
        source="metrics",
        num_drafts=d(DRAFTS),
        num_draft_tokens=d(DRAFT_TOKENS),
        num_accepted_tokens=d(ACCEPTED),
        accepted_per_position=per_pos,
        kv_cache_usage_max=kv_max,
        requests_success=d(SUCCESS),
        generation_tokens=d(GENERATION),
        prefix_cache_queries=d(PREFIX_QUERIES),
        prefix_cache_hits=d(PREFIX_HITS),
        extra=extra,
    )


async def snapshot(pool: http.Pool, arm: spec.Arm) -> Snapshot | None:
    """One arm's `/metrics` now; None (logged) when it cannot be read."""
    try:
        resp = await http.get(pool, "/metrics", limit_s=10.0)
        if resp.status != 200:
            return None
        snap = parse(resp.body.decode("utf-8", "replace"))
    except (connection.HttpError, TimeoutError, ValueError) as exc:
        log.warning("scraping %s /metrics failed: %s", arm, exc)
        return None
    if snap.unusable:
        log.warning(
            "%s /metrics: %s not finite (NaN or infinite): read as unknown",
            arm,
            ", ".join(sorted(snap.unusable)),
        )
    return snap


async def snapshots(
    pools: Mapping[spec.Arm, http.Pool], arms: Sequence[spec.Arm]
) -> dict[spec.Arm, Snapshot | None]:
    """Every arm's `/metrics` at once."""
    snaps = await asyncio.gather(*(snapshot(pools[arm], arm) for arm in arms))
    return dict(zip(arms, snaps, strict=True))


def note_kv_usage(snaps: Mapping[spec.Arm, Snapshot | None], kv_max: dict[spec.Arm, float]) -> None:
    """Keep in `kv_max` each arm's highest `vllm:kv_cache_usage_perc` seen so far."""
    for arm, snap in snaps.items():
        value = snap.values.get(KV_USAGE) if snap else None
        if value is not None:
            kv_max[arm] = max(kv_max.get(arm, 0.0), value)


async def watch_kv_usage(
    pools: Mapping[spec.Arm, http.Pool],
    arms: Sequence[spec.Arm],
    interval_s: float,
    kv_max: dict[spec.Arm, float],
) -> None:
    """Until cancelled: scrape the arms every `interval_s` seconds, keeping the KV-cache peak (`note_kv_usage`)."""
    while True:
        await asyncio.sleep(interval_s)
        note_kv_usage(await snapshots(pools, arms), kv_max)
