"""Are the pairs of a stage independent? Run-to-run spread of the speed-up against its reported interval.

The stage's interval treats its pairs as independent draws. In a closed loop at concurrency C, the
requests in flight together share their arm's server: one hiccup of that server (a scheduler stall,
a host's other tenants, garbage collection) moves all of them at once. With n requests at concurrency
C there are about n / C waves, and with one wave the pairs may be far less independent than n says.

This runs the same one-stage experiment `--runs` times on the simulator through `specdecode run
--local` (each run with its own engine seed, fixed-horizon analysis), for each `--config C:N`, and
reports the standard deviation of the log speed-up across runs next to the median standard error
the runs reported (from their 95% intervals). A ratio near 1 means the interval is as wide as the
runs' real spread; above 1, it is too narrow.

`--sequential`: the same with sequential stopping on (the default analysis): the stage may stop at
a planned look, and the row also gives the pairs at the deciding look. Since 2026-12-02 a closed-loop
stage's first look waits for four waves (`sequential.first_look`); run the script against an older
checkout (PYTHONPATH=<checkout>/operator) for the rule before it.

Run: .venv/bin/python benchmarks/verdict/waves.py --runs 8 --config 64:64 --config 64:320 --config 1:60
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

Z95 = 1.959963984540054


def one_run(concurrency: int, requests: int, seed: int, *, sequential: bool = False) -> dict[str, Any]:
    from tests.local.simulated import ANALYSIS, run_local, simulated

    document = simulated(
        {
            "dataset": {"type": "synthetic", "inputTokens": 64, "outputTokens": 64},
            "sampling": {"maxTokens": 64},
            "stages": [{"name": f"c{concurrency}", "concurrency": concurrency}],
            "requestsPerStage": requests,
            "warmupRequests": 2,
        },
        seed=seed,
        analysis={**ANALYSIS, "sequential": sequential},
        deadlines={"deploy": "1m", "run": "10m"},
    )
    with tempfile.TemporaryDirectory() as tmp:
        _, status, _ = run_local(Path(tmp), document)
    assert status is not None and status["phase"] == "Completed", status
    (stage,) = status["stages"]
    s = stage["speedup"]
    se = (math.log(s["ciHigh"]) - math.log(s["ciLow"])) / (2 * Z95)
    decided = s.get("decidedAt") or s["n"]
    return {
        "estimate": s["estimate"],
        "log": math.log(s["estimate"]),
        "se": se,
        "n": s["n"],
        "decided_at": decided,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--config", action="append", default=[], help="CONCURRENCY:REQUESTS (repeatable)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--sequential", action="store_true", help="sequential stopping on (default: off)")
    args = parser.parse_args()
    rows = []
    for config in args.config or ["64:64", "64:320", "1:60"]:
        concurrency, requests = (int(x) for x in config.split(":"))
        runs = [
            one_run(concurrency, requests, seed=1000 + i, sequential=args.sequential)
            for i in range(args.runs)
        ]
        spread = statistics.stdev(r["log"] for r in runs)
        se = statistics.median(r["se"] for r in runs)
        row = {
            "concurrency": concurrency,
            "requests": requests,
            "waves": requests / concurrency,
            "runs": len(runs),
            "sequential": args.sequential,
            "decided_at": [r["decided_at"] for r in runs],
            "estimates": [round(r["estimate"], 4) for r in runs],
            "sd_log_across_runs": spread,
            "median_reported_se": se,
            "ratio": spread / se,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} {platform.processor()}"}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
