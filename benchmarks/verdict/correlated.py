"""Correlated pairs: A/A coverage, false promotion at minSpeedup and power, iid intervals against blocked ones.

Requests of one closed-loop wave (or one open-loop time window) share their arm's engine batches,
so their paired log-ratios are correlated, and an interval that treats them as independent is too
narrow. This runs paired two-arm stages in virtual time on the simulator's own scheduler
(`simulator/scheduler.Scheduler`, the default profile), both arms speculative (k = 3, α = 0.8) with
their own acceptance seeds: the two arms are exchangeable, so the true TPOT speed-up is exactly 1.0.
Each request has its own prompt and output length (the same in both arms, as a stage's pairs do).
Each arm's host is noisy as a shared server is (`--jitter`): its steps take exp(σ z) times as long,
z a standard normal drawn afresh every `--jitter-seconds` of the arm's virtual time (other tenants,
clocks, garbage collection), so the requests in flight together are slowed together. The scheduler
alone (`--jitter 0`) has no shared noise worth the name: its pairs' lag-1 correlation is ~0.

Per configuration (closed loop at C = 1, 4, 16, 64 with each arm's own C clients; open loop with
Poisson arrivals at the same intended times in both arms), `--runs` stages of `--requests` pairs.
The same stages are judged by the design without blocks (sampling unit 1: every pair its own
block, the rule before issue 35) and with them (the default: blocks of at least one sampling unit, at most
`MAX_BLOCKS` per look, `pairing.sampling_unit`):
- A/A coverage: the stage's interval (minSpeedup 1.1, sequential, the look that decided) contains 1.0;
  and the fixed-horizon interval (`analysis.sequential: false`, the NoiseFloor mode's) does;
- false promotion: the same pairs shifted to a true speed-up of exactly minSpeedup (d + log 1.1):
  the stage passes;
- power: shifted to 1.2x, the stage passes.
Each rate with its 95% Wilson interval over the runs.

Run: .venv/bin/python benchmarks/verdict/correlated.py --runs 200 --json benchmarks/verdict/correlated.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))

from specdecode.experiment import sequential  # noqa: E402
from specdecode.experiment.comparison import paired_t, proportion_interval  # noqa: E402
from specdecode.experiment.simprofiles import DEFAULT_PROFILE, PROFILES  # noqa: E402
from specdecode.simulator.metrics import EngineMetrics  # noqa: E402
from specdecode.simulator.scheduler import Scheduler, Sequence, SpecConfig  # noqa: E402

MIN_SPEEDUP = 1.1
POWER_AT = 1.2
CONFIDENCE = 0.95
SPEC = SpecConfig.constant(3, 0.8)


JITTER = (0.15, 0.25)  # σ of the host's log slowdown, seconds it holds (set by --jitter, --jitter-seconds)


def arm(
    lengths: np.ndarray, *, seed: int, concurrency: int | None, arrivals: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """TPOT and E2E (s) of each request index in one arm; closed loop at `concurrency` or open at `arrivals`."""
    params = PROFILES[DEFAULT_PROFILE]
    sigma, hold = JITTER
    host = np.random.default_rng(seed + 7_000_000)
    slow: dict[int, float] = {}

    def slowdown(at: float) -> float:
        k = int(at // hold)
        if k not in slow:
            slow[k] = math.exp(sigma * float(host.standard_normal()))
        return slow[k]

    sched = Scheduler(
        params, SPEC, seed=seed, metrics=EngineMetrics(model_name="virtual", num_spec_tokens=SPEC.k)
    )
    n = len(lengths)
    tpot, e2e = np.full(n, np.nan), np.full(n, np.nan)
    delayed: list[tuple[float, int, Sequence]] = []
    now, sent = 0.0, 0

    def send(i: int, at: float) -> None:
        prompt, out = (int(v) for v in lengths[i])
        seq = Sequence(str(i), prompt, out, "length", at, max_tokens=out)
        heapq.heappush(delayed, (at + params.request_overhead_ms / 1000.0, i, seq))

    if arrivals is None:
        assert concurrency is not None
        for i in range(min(concurrency, n)):
            send(i, 0.0)
        sent = min(concurrency, n)
    else:
        for i in range(n):
            send(i, float(arrivals[i]))
        sent = n
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
        now += step.duration_s * (slowdown(now) if sigma > 0 else 1.0)
        sched.complete(step, now)
        for em in step.emissions:
            if em.finished:
                s = em.seq
                i = int(s.request_id)
                assert s.first_token_at is not None
                tpot[i] = (now - s.first_token_at) / max(1, s.generated - 1)
                e2e[i] = now - s.arrival
                if arrivals is None and sent < n:
                    send(sent, now)
                    sent += 1
    return tpot, e2e


def stage(config: str, requests: int, seed: int) -> tuple[np.ndarray, int]:
    """The paired log-ratios of one A/A stage and its sampling unit."""
    rng = np.random.default_rng(seed)
    lengths = np.column_stack([rng.integers(64, 1024, requests), rng.integers(16, 160, requests)])
    if config.startswith("c"):
        concurrency, arrivals = int(config[1:]), None
    else:  # "r<rate>": Poisson arrivals, requests/s
        concurrency, arrivals = None, np.cumsum(rng.exponential(1.0 / float(config[1:]), requests))
    c_tpot, _ = arm(lengths, seed=seed * 2 + 1, concurrency=concurrency, arrivals=arrivals)
    t_tpot, t_e2e = arm(lengths, seed=seed * 2 + 2, concurrency=concurrency, arrivals=arrivals)
    d = np.log(c_tpot / t_tpot)
    if concurrency is not None:
        unit = concurrency
    else:
        unit = max(1, math.ceil(2.0 * float(config[1:]) * float(np.mean(t_e2e))))  # pairing.sampling_unit
    return d, unit


def judged(d: np.ndarray, unit: int, concurrency: int | None, *, blocked: bool) -> dict[str, bool]:
    """The A/A stage `d` judged without blocks (unit 1, the rule before issue 35) or with them."""
    if not blocked:
        unit = 1
    threshold = math.log(MIN_SPEEDUP)
    first = sequential.first_look(concurrency)
    h = int(d.size)

    def look(shift: float) -> sequential.Look:
        return sequential.look(
            d + shift,
            threshold=threshold,
            confidence=CONFIDENCE,
            horizon=h,
            final=True,
            first=first,
            unit=unit,
        )

    aa = look(0.0)
    _, low, high, _ = paired_t(d, threshold=0.0, confidence=CONFIDENCE, unit=unit)
    return {
        "covers": aa.low <= 0.0 <= aa.high,
        "fixed_covers": low <= 0.0 <= high,
        "false_promote": look(threshold).low > threshold,
        "power": look(math.log(POWER_AT)).low > threshold,
    }


def one(args: tuple[str, int, int, tuple[float, float]]) -> dict[str, Any]:
    global JITTER
    config, requests, seed, JITTER = args
    d, unit = stage(config, requests, seed)
    concurrency = int(config[1:]) if config.startswith("c") else None
    corr = float(np.corrcoef(d[:-1], d[1:])[0, 1])
    return {
        "unit": unit,
        "lag1": corr,
        "iid": judged(d, unit, concurrency, blocked=False),
        "blocked": judged(d, unit, concurrency, blocked=True),
    }


def rate(hits: int, runs: int) -> dict[str, float]:
    low, high = proportion_interval(hits, runs, confidence=0.95, method="wilson")
    return {"rate": hits / runs, "low": low, "high": high}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument(
        "--config", action="append", default=[], help="c<concurrency> or r<rate/s> (repeatable)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jitter", type=float, default=JITTER[0], help="σ of each host's log slowdown")
    parser.add_argument("--jitter-seconds", type=float, default=JITTER[1], help="how long one slowdown holds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.time()
    rows = []
    jitter = (args.jitter, args.jitter_seconds)
    with ProcessPoolExecutor(args.workers) as pool:
        for config in args.config or ["c1", "c4", "c16", "c64", "r20"]:
            runs = list(pool.map(one, [(config, args.requests, 1000 + i, jitter) for i in range(args.runs)]))
            row: dict[str, Any] = {
                "config": config,
                "requests": args.requests,
                "jitter": args.jitter,
                "jitter_seconds": args.jitter_seconds,
                "runs": len(runs),
                "median_unit": float(np.median([r["unit"] for r in runs])),
                "median_lag1_correlation": float(np.median([r["lag1"] for r in runs])),
            }
            for design in ("iid", "blocked"):
                row[design] = {
                    key: rate(sum(r[design][key] for r in runs), len(runs))
                    for key in ("covers", "fixed_covers", "false_promote", "power")
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.node()} {platform.processor()} {platform.python_version()}",
            "seconds": round(time.time() - started),
            "command": " ".join(sys.argv),
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
