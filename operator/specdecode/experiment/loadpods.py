"""Load beyond one core: one paired schedule sent by N load pods, and their results made one again.

`spec.workload.loadPods: N` renders the load Job as an Indexed Job of N pods (manifests.py). Every
pod plans the same schedule (the same prompts, seeds and intended send times, `loadgen/plan.py`) and
sends only its shard of it: request `index` of every stage goes to pod `index % N`
(`in_shard`), to both arms at once as one pod does, so each pair stays paired and the union of
the shards is exactly the one-pod plan. A closed-loop stage's concurrency is shared out the same way
(`concurrency_share`): the pods together keep the stage's concurrency in flight per arm.

Each pod stores its own bundle (`results.pod_prefix`); the operator reads all N and `merge`s them
before analysis: the records on one clock, each stage's window from the earliest start to the latest
end, and one validity block that is valid only when every pod's was, each reason naming its pod.

Left to one pod by validation: a multi-turn dataset (a session's turns go in order through one
client) and a closed-loop stage of fewer concurrent requests than pods. Sequential stopping is not
asked in the pods of an N > 1 Job (a pod would decide on its shard alone and stop without the
others); each stage runs to its bound and the analysis still judges at its planned looks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from specdecode.experiment import records

Measured = tuple[list[records.Request], records.RunAnchor, list[records.StageWindow], dict[str, Any]]
"""One pod's results as `results.parse` reads them: records, anchor, windows, summary."""

_TIMES = ("intended", "sent", "first_byte", "first_token", "end", "headers")
"""The record's times on its run's clock (relative to its anchor)."""


def in_shard(index: int, pod: int, pods: int) -> bool:
    """Whether pod `pod` of `pods` sends request `index` of a stage (to both arms)."""
    return index % pods == pod


def concurrency_share(concurrency: int, pod: int, pods: int) -> int:
    """Pod `pod`'s part of a closed-loop stage's concurrency: the shares add up to `concurrency`."""
    return concurrency // pods + (pod < concurrency % pods)


def merge(pods: Sequence[Measured]) -> Measured:
    """The results of every pod of one load Job (in pod order) as the results of one load.

    Times move onto the clock of the pod anchored first (by wall clock: each pod's monotonic clock is
    its own, the wall clocks of one cluster agree to NTP's milliseconds, far below a stage). A
    stage's window runs from its earliest start to its latest end over the pods and stopped early if
    any pod's did; its direct `/metrics` scrape is the one of the pod whose window was longest (the
    counters are the server's, so that pod's delta covers the most of the merged window; the
    operator reads Prometheus over the merged window anyway). Records are ordered by when their
    pair completed, as one pod writes them.
    """
    if len(pods) == 1:
        return pods[0]
    if not pods:
        raise ValueError("no load pod's results to merge")
    first = min(range(len(pods)), key=lambda k: pods[k][1].wall)
    anchor = pods[first][1]
    recs: list[records.Request] = []
    windows: dict[str, list[records.StageWindow]] = {}
    for pod_recs, pod_anchor, pod_windows, _ in pods:
        shift = pod_anchor.wall - anchor.wall
        recs += [_shifted(r, shift) for r in pod_recs]
        for w in pod_windows:
            moved = w.model_copy(update={"start": w.start + shift, "end": w.end + shift})
            windows.setdefault(w.stage, []).append(moved)
    done: dict[tuple[str, int], float] = {}
    for r in recs:
        key = (r.stage, r.index)
        done[key] = max(done.get(key, -math.inf), r.end if r.end is not None else math.inf)
    recs.sort(key=lambda r: done[(r.stage, r.index)])
    merged_windows = [_merged_window(ws) for ws in windows.values()]
    return recs, anchor, merged_windows, merged_summary([summary for *_, summary in pods])


def finished_by_all(
    pods: Sequence[Measured | None], stages: Sequence[str]
) -> tuple[list[Measured], list[str]]:
    """What a load of N pods that failed finished: each pod's results (in pod order; None: that pod
    stored nothing) cut to the `stages` (in their order) that every pod finished, ready to `merge`,
    and why each stage that only some pods finished is left out. Each pod stores its bundle after
    every stage it finishes, so a stage's window in a pod's bundle means that pod finished its shard
    of it; a stage only some pods finished is a partial schedule (its pairs are not the planned
    ones) and is not kept. No stage finished by every pod: no results.
    """
    done = [set() if pod is None else {w.stage for w in pod[2]} for pod in pods]
    common = {stage for stage in stages if all(stage in d for d in done)}
    unkept = []
    for stage in stages:
        behind = [str(k) for k, d in enumerate(done) if stage not in d]
        if behind and len(behind) < len(pods):
            which = f"load pod {behind[0]}" if len(behind) == 1 else f"load pods {', '.join(behind)}"
            unkept.append(f"stage {stage}: {which} did not finish it")
    if not common:
        return [], unkept
    dropped = set(stages) - common
    kept: list[Measured] = [
        (
            [r for r in recs if r.stage not in dropped],
            anchor,
            [w for w in windows if w.stage not in dropped],
            summary,
        )
        for recs, anchor, windows, summary in (pod for pod in pods if pod is not None)
    ]
    return kept, unkept


def _shifted(rec: records.Request, shift: float) -> records.Request:
    if not shift:
        return rec
    update: dict[str, Any] = {k: v + shift for k in _TIMES if (v := getattr(rec, k)) is not None}
    if isinstance(rec, records.PackedRequest):  # packed results keep no events
        return dataclasses.replace(rec, **update)
    update["events"] = [(t + shift, n) for t, n in rec.events]
    return rec.model_copy(update=update)


def _merged_window(ws: Sequence[records.StageWindow]) -> records.StageWindow:
    longest = max(ws, key=lambda w: w.end - w.start)
    return records.StageWindow(
        stage=ws[0].stage,
        start=min(w.start for w in ws),
        end=max(w.end for w in ws),
        stopped_early=any(w.stopped_early for w in ws),
        server=longest.server,
    )


def merged_summary(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The loadgen summaries of every pod (in pod order) as one: pod 0's document with one validity
    block for all (valid only when each pod's was; each reason prefixed with its pod) that keeps
    every pod's own block under `pods`, and each pod's per-stage summaries under `podStages`."""
    blocks = [dict(s.get("validity") or {}) for s in summaries]
    invalid = [k for k, block in enumerate(blocks) if not bool(block.get("valid", True))]
    reasons = [
        f"load pod {k}: {reason}"
        for k, block in enumerate(blocks)
        for reason in block.get("reasons") or (["marked invalid"] if k in invalid else [])
    ]
    validity: dict[str, Any] = {
        "valid": not invalid,
        "reasons": reasons,
        "invalid_pods": invalid,
        "pods": [{"pod": k, **block} for k, block in enumerate(blocks)],
    }
    return {
        **dict(summaries[0]),
        "interrupted": any(bool(s.get("interrupted")) for s in summaries),
        "loadPods": len(summaries),
        "podStages": [s.get("stages") or [] for s in summaries],
        "stages": [],
        "validity": validity,
    }
