"""Correlated pairs, tails: A/A coverage of the p50/p90/p99 speed-up intervals, iid bootstrap against block bootstrap.

The stages of `correlated.py` (the simulator's own scheduler in virtual time, both arms speculative
with their own acceptance seeds, each arm's host noisy as a shared server is): the arms are
exchangeable, so every true quantile ratio control/treatment is exactly 1.0. Each stage's tails are
judged by the shipped code (`comparison.quantile_speedups`, the percentile bootstrap of the
quantile ratio) twice: resampling pairs (block 1, the rule before issue 35) and resampling circular
blocks of the stage's sampling unit (`pairing.sampling_unit`: the concurrency, or twice the requests
in flight of an open loop), the default since. Reported per configuration: how often each interval
contains 1.0 (nominal 95%), with its 95% Wilson interval over the runs, and the median width ratio
(blocked / iid).

Run: .venv/bin/python benchmarks/verdict/tails.py --runs 200 --json benchmarks/verdict/tails.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import correlated

from specdecode.experiment.comparison import proportion_interval, quantile_speedups

QUANTILES = (0.5, 0.9, 0.99)
CONFIDENCE = 0.95


def one(args: tuple[str, int, int, tuple[float, float]]) -> dict[str, Any]:
    config, requests, seed, jitter = args
    correlated.JITTER = jitter
    rng = np.random.default_rng(seed)
    lengths = np.column_stack([rng.integers(64, 1024, requests), rng.integers(16, 160, requests)])
    if config.startswith("c"):
        concurrency, arrivals = int(config[1:]), None
    else:
        concurrency, arrivals = None, np.cumsum(rng.exponential(1.0 / float(config[1:]), requests))
    c_tpot, _ = correlated.arm(lengths, seed=seed * 2 + 1, concurrency=concurrency, arrivals=arrivals)
    t_tpot, t_e2e = correlated.arm(lengths, seed=seed * 2 + 2, concurrency=concurrency, arrivals=arrivals)
    unit = (
        concurrency
        if concurrency is not None
        else max(1, math.ceil(2.0 * float(config[1:]) * float(np.mean(t_e2e))))
    )
    out: dict[str, Any] = {"unit": unit}
    for design, block in (("iid", 1), ("blocked", unit)):
        tails = quantile_speedups(
            c_tpot, t_tpot, metric="tpot", confidence=CONFIDENCE, rng=np.random.default_rng(seed), unit=block
        )
        out[design] = {
            str(t.quantile): (bool(t.ci_low <= 1.0 <= t.ci_high), math.log(t.ci_high / t.ci_low))
            for t in tails
            if t.ci_low is not None and t.ci_high is not None
        }
    return out


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
    parser.add_argument("--jitter", type=float, default=correlated.JITTER[0])
    parser.add_argument("--jitter-seconds", type=float, default=correlated.JITTER[1])
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
                "runs": len(runs),
                "median_unit": float(np.median([r["unit"] for r in runs])),
            }
            for q in map(str, QUANTILES):
                row[f"p{round(float(q) * 100)}"] = {
                    design: rate(sum(r[design][q][0] for r in runs), len(runs))
                    for design in ("iid", "blocked")
                } | {
                    "width_ratio": float(np.median([r["blocked"][q][1] / r["iid"][q][1] for r in runs])),
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
