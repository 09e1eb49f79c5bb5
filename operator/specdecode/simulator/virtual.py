"""Closed-loop load against the scheduler in virtual time (calibration and model tests).

Runs the same `Scheduler.plan`/`complete` cycle as the real-time engine, but advances a virtual
clock by each step's duration instead of sleeping, so a calibration run at concurrency 64 takes
milliseconds and does not depend on the machine's load. Mirrors `vllm bench serve` as used for
the H200 reference: C clients, each sends its next request when the previous one finishes.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass

from specdecode.experiment.simprofiles import SimParams
from specdecode.simulator.metrics import EngineMetrics
from specdecode.simulator.scheduler import Scheduler, Sequence, SpecConfig


@dataclass(frozen=True)
class RequestTiming:
    """Virtual-time timings of one finished request, in seconds."""

    arrival: float
    first_token: float
    end: float
    output_tokens: int

    @property
    def tpot(self) -> float:
        """(last token − first token) / (output tokens − 1), as `vllm bench serve`."""
        return (self.end - self.first_token) / max(1, self.output_tokens - 1)

    @property
    def ttft(self) -> float:
        """First token − arrival."""
        return self.first_token - self.arrival


@dataclass(frozen=True)
class ClosedLoopResult:
    """Requests of one closed-loop run plus the scheduler (for its metrics)."""

    requests: list[RequestTiming]
    scheduler: Scheduler

    @property
    def tpot_p50_ms(self) -> float:
        """Median TPOT in ms."""
        return statistics.median(r.tpot for r in self.requests) * 1000.0

    @property
    def ttft_p50_ms(self) -> float:
        """Median TTFT in ms."""
        return statistics.median(r.ttft for r in self.requests) * 1000.0


def closed_loop(
    params: SimParams,
    spec: SpecConfig | None,
    *,
    concurrency: int,
    num_requests: int,
    prompt_tokens: int = 256,
    output_tokens: int = 128,
    seed: int = 0,
) -> ClosedLoopResult:
    """Run `num_requests` requests with `concurrency` clients; all start at t = 0."""
    metrics = EngineMetrics(model_name="virtual", num_spec_tokens=spec.k if spec else 0)
    sched = Scheduler(params, spec, seed=seed, metrics=metrics)
    sent = 0
    now = 0.0
    done: list[RequestTiming] = []

    delayed: list[tuple[float, int, Sequence]] = []  # (enters the queue at, order, seq)

    def send() -> None:
        nonlocal sent
        heapq.heappush(
            delayed,
            (
                now + params.request_overhead_ms / 1000.0,
                sent,
                Sequence(
                    request_id=str(sent),
                    prompt_tokens=prompt_tokens,
                    output_tokens=output_tokens,
                    finish_reason="length",
                    arrival=now,
                    max_tokens=output_tokens,
                ),
            ),
        )
        sent += 1

    for _ in range(min(concurrency, num_requests)):
        send()
    while True:
        if not sched.has_work() and delayed:
            now = max(now, delayed[0][0])
        while delayed and delayed[0][0] <= now:
            sched.add(heapq.heappop(delayed)[2])
        step = sched.plan(now)
        if step is None:
            if delayed:
                continue
            break
        now += step.duration_s
        sched.complete(step, now)
        for em in step.emissions:
            if em.finished:
                s = em.seq
                assert s.first_token_at is not None
                done.append(RequestTiming(s.arrival, s.first_token_at, now, s.generated))
                if sent < num_requests:
                    send()
    return ClosedLoopResult(done, sched)
