"""Draft acceptance of a stage's treatment, estimated up to three ways (per request from the server,
Prometheus counter deltas, a client-side proxy), the preferred one reported and their agreement
checked within `ACCEPTANCE_TOLERANCE`. Pure; owns `status.stages[].acceptance`.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdecode.experiment.records import ArmServerMetrics, Request
from specdecode.experiment.status import (
    Acceptance,
)

#: the largest absolute difference between acceptance-rate estimates that still counts as agreement
ACCEPTANCE_TOLERANCE = 0.05


def acceptance(
    treatment: Sequence[Request], server: ArmServerMetrics | None, *, k: int | None
) -> Acceptance | None:
    """Draft acceptance of one stage's treatment (see `acceptance_counts`)."""
    return acceptance_counts(treatment, server, k=k)[0]


def acceptance_counts(
    treatment: Sequence[Request], server: ArmServerMetrics | None, *, k: int | None
) -> tuple[Acceptance | None, tuple[int, int]]:
    """Draft acceptance estimated up to three ways, the preferred one reported, agreement flagged.

    perRequest: the server's per-request `speculative_decoding` summed over successful requests
    (exactly this stage's measured requests; preferred). prometheus: the stage window's counter
    deltas of `vllm:spec_decode_*`. clientProxy: tokens per SSE event after the first, an estimate
    of the mean acceptance length (rate = (length - 1) / k); streams that coalesce steps inflate it.
    Also returns (accepted, drafted) token counts behind the reported rate, for its interval.
    """
    rates: dict[str, float] = {}
    lengths: dict[str, float] = {}
    positions: dict[str, list[float]] = {}
    counts: dict[str, tuple[int, int]] = {}

    accepted = drafted = steps = 0
    histogram: list[int] = []
    for r in treatment:
        sd = r.spec_decode
        if not r.ok or not sd:
            continue
        accepted += int(sd.get("num_accepted_draft_tokens") or 0)
        drafted += int(sd.get("num_draft_tokens") or 0)
        steps += int(sd.get("num_spec_steps") or 0)
        hist = sd.get("acceptance_histogram") or []
        if len(hist) > len(histogram):
            histogram.extend([0] * (len(hist) - len(histogram)))
        for j, count in enumerate(hist):
            histogram[j] += int(count)
        if k is None and sd.get("num_spec_tokens"):
            k = int(sd["num_spec_tokens"])
    if drafted > 0:
        rates["perRequest"] = accepted / drafted
        counts["perRequest"] = (accepted, drafted)
    if steps > 0:
        lengths["perRequest"] = 1.0 + accepted / steps
    if histogram and sum(histogram) > 0:
        total = sum(histogram)
        positions["perRequest"] = [sum(histogram[j + 1 :]) / total for j in range(len(histogram) - 1)]

    if server is not None and server.num_draft_tokens:
        acc = server.num_accepted_tokens or 0.0
        rates["prometheus"] = acc / server.num_draft_tokens
        counts["prometheus"] = (round(acc), round(server.num_draft_tokens))
        if server.num_drafts:
            lengths["prometheus"] = 1.0 + acc / server.num_drafts
            if server.accepted_per_position:
                positions["prometheus"] = [p / server.num_drafts for p in server.accepted_per_position]

    tokens = events = 0
    for r in treatment:
        if r.ok and r.token_events >= 2:
            tokens += r.stream_tokens
            events += r.token_events - 1
    if events > 0:
        lengths["clientProxy"] = tokens / events
        if k:
            rates["clientProxy"] = min(1.0, max(0.0, (lengths["clientProxy"] - 1.0) / k))

    if not rates and not lengths:
        return None, (0, 0)
    source = next(
        (s for s in ("perRequest", "prometheus", "clientProxy") if s in rates or s in lengths), None
    )
    result = Acceptance(source=source, sources=rates)
    if source is not None:
        result.rate = rates.get(source)
        result.mean_length = lengths.get(source)
        result.per_position = positions.get(source) or next(iter(positions.values()), [])
    if len(rates) >= 2:
        result.agreement = max(rates.values()) - min(rates.values()) <= ACCEPTANCE_TOLERANCE
    return result, counts.get(source or "", (0, 0))
