"""The load plan: every stage's requests and intended schedule, fixed before the first send.

`plan_from_spec` turns an `ExperimentSpec` into a `Plan`; `runner.run` executes it. Everything
random (prompts, per-request seeds, arrival gaps) derives from `spec.engine.seed`, so two runs of
one spec send the same prompt sequence on the same schedule; `salt` (default: the spec's seed and
the time of planning) only changes the nonce prefixes, so a rerun against the same warm server
still misses its prefix cache.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from specdecode.experiment import loadpods, records, sequential, verdict
from specdecode.experiment import spec as spec_mod
from specdecode.loadgen import schedule, sessions, trace, workload

WARMUP = "warmup"


@dataclass(frozen=True)
class StagePlan:
    """One stage: open loop (`rate`, `offsets`) or closed loop (`concurrency`)."""

    name: str
    requests: tuple[workload.PreparedRequest, ...]
    rate: float | None = None
    concurrency: int | None = None
    offsets: tuple[float, ...] | None = None
    """Open loop: intended send time of request i, seconds after the stage's start."""
    warmup: bool = False
    looks: tuple[int, ...] = ()
    """Completed pairs at which the stop rule is asked: the sequential design's planned looks
    (`sequential.planned_looks`); empty: every `Plan.look_every` pairs."""
    indices: tuple[int, ...] | None = None
    """A load pod's shard (`shard`): the stage's index of each of `requests`, which its records and
    request ids carry; None: the whole stage, request i is index i."""

    def index_of(self, position: int) -> int:
        """The stage's index of `requests[position]` (the pair key of its records)."""
        return position if self.indices is None else self.indices[position]

    @property
    def open_loop(self) -> bool:
        """Paced by a schedule rather than by completions."""
        return self.offsets is not None

    @property
    def sessions(self) -> list[list[int]] | None:
        """Multi-turn sessions: each session's request indices, turns in order; None otherwise."""
        if not self.requests or self.requests[0].session is None:
            return None
        return sessions.groups(self.requests)


@dataclass(frozen=True)
class Budgets:
    """When the client's own overhead makes a run untrustworthy (summary `validity`)."""

    schedule_lag_p99_ms: float = 5.0
    """Open loop: p99 of send - intended may not exceed max(this, `schedule_lag_ttft_fraction` · p50 TTFT)."""
    schedule_lag_ttft_fraction: float = 0.02
    loop_lag_p99_ms: float = 5.0
    """p99 lateness of a 10 ms ticker on the client's event loop (judged only with loop stamps)."""
    cpu_percent: float = 90.0
    """Client CPU time over wall time; above this the client was the bottleneck."""


@dataclass(frozen=True)
class Plan:
    """Everything a run needs besides the endpoints."""

    stages: tuple[StagePlan, ...]
    seed: int = 42
    salt: str = ""
    request_timeout_s: float = 600.0
    look_every: int = 10
    """Completed pairs between calls of the stop rule, for stages without planned `looks`."""
    scrape_metrics: bool = False
    """Read each arm's /metrics at stage boundaries (the operator reads Prometheus instead)."""
    scrape_interval_s: float = 5.0
    """How often /metrics is read during a stage for gauges (kv cache usage max); 0 disables."""
    lead_s: float = 0.05
    """Open loop: the first intended send is this long after the stage starts."""
    kernel_timestamps: bool = True
    """Stamp reads with the kernel's receive time where possible (plain HTTP on Linux)."""
    budgets: Budgets = field(default_factory=Budgets)
    description: dict[str, object] = field(default_factory=dict)
    """Echoed into the summary (arrival process, dataset, ...)."""


def _stage_requests(
    spec: spec_mod.ExperimentSpec,
    items: list[workload.Item] | None,
    *,
    name: str,
    replay: trace.Trace | None = None,
    conversations: list[sessions.Conversation] | None = None,
    n: int,
    first: int,
    salt: str,
    stage: spec_mod.Stage | None = None,
) -> tuple[workload.PreparedRequest, ...]:
    """`n` requests named after `name`; a synthetic dataset at `stage`'s lengths where given; whole
    sessions of `conversations[first:]` for a multi-turn dataset."""
    wl = spec.workload
    if conversations is not None:
        return sessions.requests(
            conversations,
            n=n,
            first=first,
            model=spec.served_name,
            sampling=wl.sampling,
            seed=spec.engine.seed,
            salt=salt,
            stage=name,
        )[0]
    out: list[workload.PreparedRequest] = []
    for i in range(n):
        if replay is not None:
            out.append(
                trace.request(
                    replay.records[(first + i) % len(replay.records)],
                    model=spec.served_name,
                    sampling=wl.sampling,
                    seed=spec.engine.seed,
                    salt=salt,
                    stage=name,
                    index=i,
                )
            )
        elif items is None:
            assert isinstance(wl.dataset, spec_mod.SyntheticDataset)
            out.append(
                workload.synthetic_request(
                    model=spec.served_name,
                    sampling=wl.sampling,
                    dataset=spec.stage_dataset(stage) if stage is not None else wl.dataset,
                    seed=spec.engine.seed,
                    salt=salt,
                    stage=name,
                    index=i,
                )
            )
        else:
            item = items[(first + i) % len(items)]
            out.append(
                workload.item_request(
                    item,
                    model=spec.served_name,
                    sampling=wl.sampling,
                    seed=spec.engine.seed,
                    salt=salt,
                    stage=name,
                    index=i,
                )
            )
    return tuple(out)


def plan_from_spec(
    spec: spec_mod.ExperimentSpec,
    base_dir: Path,
    *,
    dataset_file: Path | None = None,
    salt: str | None = None,
    scrape_metrics: bool = False,
    warmup_concurrency: int = 4,
    budgets: Budgets | None = None,
    look_every: int = 10,
) -> Plan:
    """The plan of an experiment: warm-up (closed loop) first, then the spec's stages in order.

    A closed-loop stage whose concurrency differs from the load just before it opens with a warm-up
    round of that many requests (`warmup-<stage>`, not measured): on the real H200, vLLM 0.20's
    speculative path paid ~300 ms of TTFT on the first round at a batch size it had not run yet
    (benchmarks/real-gpu/README.md), which a stage stopped early at 20 pairs reports as its TTFT p90.
    """
    wl = spec.workload
    seed = spec.engine.seed
    salt = salt if salt is not None else f"{seed}-{time.time_ns()}"
    items: list[workload.Item] | None = None
    replay: trace.Trace | None = None
    convs: list[sessions.Conversation] | None = None
    if isinstance(wl.dataset, spec_mod.TraceDataset):
        # A trace is replayed in its own order, every stage from its first record (the nonce keeps
        # the stages' and the warm-up's prompts byte-distinct).
        replay = trace.load(wl.dataset, base_dir, seed=seed, dataset_file=dataset_file)
    elif isinstance(wl.dataset, spec_mod.MultiTurnDataset):
        convs = sessions.load(wl.dataset, base_dir, dataset_file)
        random.Random(f"{seed}:order").shuffle(convs)
    elif not isinstance(wl.dataset, spec_mod.SyntheticDataset):
        items = workload.load_items(wl.dataset, base_dir, dataset_file)
        random.Random(f"{seed}:order").shuffle(items)
    stages: list[StagePlan] = []
    measured_items = items
    warm_items = items
    measured_convs = warm_convs = convs
    # Multi-turn: a warm-up round at concurrency C is C sessions of a mean length (whole sessions)
    turns = 1 if convs is None else max(1, round(sessions.mean_turns(convs)))
    load_before: int | None = None
    if wl.warmup_requests:
        if items is not None and len(items) > wl.warmup_requests:
            warm_items, measured_items = items[: wl.warmup_requests], items[wl.warmup_requests :]
        if convs is not None:
            used = sessions.covering(convs, wl.warmup_requests)
            if len(convs) > used:
                warm_convs, measured_convs = convs[:used], convs[used:]
        load_before = max(1, min(warmup_concurrency, wl.warmup_requests))
        stages.append(
            StagePlan(
                name=WARMUP,
                warmup=True,
                concurrency=load_before,
                requests=_stage_requests(
                    spec,
                    warm_items,
                    name=WARMUP,
                    n=wl.warmup_requests,
                    first=0,
                    salt=salt,
                    replay=replay,
                    conversations=warm_convs,
                ),
            )
        )
    first = 0
    time_scales: dict[str, float] = {}
    for stage in wl.stages:
        if wl.warmup_requests and stage.concurrency is not None and stage.concurrency != load_before:
            name = f"{WARMUP}-{stage.name}"
            stages.append(
                StagePlan(
                    name=name,
                    warmup=True,
                    concurrency=stage.concurrency,
                    requests=_stage_requests(
                        spec,
                        warm_items,
                        name=name,
                        n=stage.concurrency * turns,
                        first=0,
                        salt=salt,
                        replay=replay,
                        conversations=warm_convs,
                        stage=stage,
                    ),
                )
            )
        load_before = stage.concurrency
        n = spec.stage_requests(stage)
        reqs = _stage_requests(
            spec,
            measured_items,
            name=stage.name,
            n=n,
            first=0 if replay is not None else first,
            salt=salt,
            replay=replay,
            conversations=measured_convs,
            stage=stage,
        )
        first += n if measured_convs is None else len(sessions.groups(reqs))
        looks = (
            sequential.planned_looks(n, sequential.first_look(stage.concurrency))
            if spec.analysis.sequential
            else ()
        )
        if stage.rate is not None:
            if replay is not None:
                offs = replay.offsets(n, rate=stage.rate)
                time_scales[stage.name] = round(replay.time_scale(stage.rate), 6)
            else:
                offs = schedule.offsets(
                    wl.arrival.value, stage.rate, n, seed=seed, stage=stage.name, burstiness=wl.burstiness
                )
            stages.append(
                StagePlan(name=stage.name, requests=reqs, rate=stage.rate, offsets=tuple(offs), looks=looks)
            )
        else:
            stages.append(
                StagePlan(name=stage.name, requests=reqs, concurrency=stage.concurrency, looks=looks)
            )
    dataset = wl.dataset.model_dump(by_alias=True, exclude_none=True)
    if replay is not None:
        dataset["trace"] = {**replay.describe(), "timeScale": time_scales}
    lengths = {
        stage.name: spec.stage_dataset(stage).model_dump(
            by_alias=True, include={"input_tokens", "output_tokens"}
        )
        for stage in wl.stages
        if stage.input_tokens is not None or stage.output_tokens is not None
    }
    if lengths:
        dataset["stages"] = lengths
    if convs is not None:
        dataset["sessions"] = {
            "conversations": len(convs),
            "meanTurns": round(sessions.mean_turns(convs), 3),
            "prefixCaching": spec.prefix_caching,
        }
    return Plan(
        stages=tuple(stages),
        seed=seed,
        salt=salt,
        request_timeout_s=wl.request_timeout_seconds,
        scrape_metrics=scrape_metrics,
        budgets=budgets or Budgets(),
        look_every=look_every,
        description={
            "arrival": "trace" if replay is not None else wl.arrival.value,
            "burstiness": wl.burstiness,
            "dataset": dataset,
            "sampling": wl.sampling.model_dump(by_alias=True),
            "model": spec.served_name,
        },
    )


def shard(plan: Plan, pod: int, pods: int) -> Plan:
    """Load pod `pod`'s part of `plan` when `pods` pods send it (`experiment/loadpods.py`): request
    i of every stage if `i % pods == pod`, at its planned send time, and its share of a closed-loop
    stage's concurrency (a warm-up's at least 1: it is not measured). The pods' shards together are
    `plan`, each request in exactly one. No looks: the pods run their stages to the bound."""
    if not 0 <= pod < pods:
        raise ValueError(f"load pod {pod} is not one of {pods} (0..{pods - 1})")
    stages = []
    for sp in plan.stages:
        kept = [i for i in range(len(sp.requests)) if loadpods.in_shard(sp.index_of(i), pod, pods)]
        concurrency = sp.concurrency
        if concurrency is not None:
            share = loadpods.concurrency_share(concurrency, pod, pods)
            concurrency = max(1, share) if sp.warmup else share
        stages.append(
            replace(
                sp,
                requests=tuple(sp.requests[i] for i in kept),
                offsets=None if sp.offsets is None else tuple(sp.offsets[i] for i in kept),
                indices=tuple(sp.index_of(i) for i in kept),
                concurrency=concurrency,
                looks=(),
            )
        )
    return replace(plan, stages=tuple(stages))


StopRule = Callable[[str, Sequence[records.RequestRecord]], bool]


def stop_rule(s: spec_mod.ExperimentSpec) -> StopRule | None:
    """Sequential stopping (the verdict's group-sequential design) when `analysis.sequential` is on."""
    if not s.analysis.sequential:
        return None
    bounds = {stage.name: s.stage_requests(stage) for stage in s.workload.stages}
    concurrency = {stage.name: stage.concurrency for stage in s.workload.stages}
    rate = {stage.name: stage.rate for stage in s.workload.stages}
    greedy = s.workload.sampling.temperature == 0.0

    control_arm, treatment_arm = spec_mod.Arm.CONTROL, spec_mod.Arm.TREATMENT

    def decided(stage: str, recs: Sequence[records.RequestRecord]) -> bool:
        control = [r for r in recs if r.arm == control_arm]
        treatment = [r for r in recs if r.arm == treatment_arm]
        return verdict.stage_decided(
            s.analysis,
            control,
            treatment,
            max_pairs=bounds.get(stage, len(control)),
            concurrency=concurrency.get(stage),
            rate=rate.get(stage),
            greedy=greedy,
        )

    return decided
