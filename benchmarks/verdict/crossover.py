"""Monte Carlo study of the crossover (issue 22): arms on hosts of unequal speed, with and without it.

Each simulated experiment is one stage, as in `montecarlo.py` (same per-request TPOT model: shared
per-prompt heterogeneity, per-arm log-noise `--sigma`, 5% heavy-tailed stalls), with the treatment's
host `h` times as fast as the control's (every treatment TPOT divided by h; h = 1.1: a 10% faster
node). So round 1 measures the true speed-up S times h.

- without the crossover: round 1 alone, judged by the operator's sequential rule (up to
  `--max-pairs` pairs, `specdecode.experiment.sequential`); a stage passes iff the repeated
  interval's lower bound at the deciding look clears minSpeedup;
- with it: round 2 repeats the stage with the hosts swapped (true S / h), `--fraction` of the pairs
  at a fixed horizon (paired t interval), and `crossover.fold` + `crossover.judge` (the operator's
  code) decide whether a round-1 pass stands. Round 1's point estimate is the operator's
  (`comparison.sequential_estimate`, median-unbiased at the deciding look).

Reported per (S, h): the promote rate without and with the crossover, and the mean placement effect
estimated (exp f) among all runs. `--rule round1-margin` replaces `crossover.judge` by the rule it was
preferred to: keep a pass iff round 1's lower bound divided by the placement effect still clears
minSpeedup.

Run: .venv/bin/python benchmarks/verdict/crossover.py --runs 2000 --json benchmarks/verdict/crossover.json
(a few minutes on 2 shared cores: the median-unbiased estimate costs ~20 ms per round-1 pass)
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from montecarlo import sequential_rule, simulate

from specdecode.experiment import comparison, crossover, sequential
from specdecode.experiment.status import Speedup, StageResult, StageVerdict


def paired_t(d: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) of each row's paired t interval, log scale."""
    n = d.shape[1]
    mean = d.mean(axis=1)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * d.std(axis=1, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def scenario(
    rng: np.random.Generator,
    *,
    runs: int,
    pairs: int,
    fraction: float,
    speedup: float,
    host: float,
    sigma: float,
    min_speedup: float,
    confidence: float,
    rule: str = "operator",
) -> dict[str, float]:
    threshold = math.log(min_speedup)
    first = simulate(rng, runs, pairs, speedup * host, sigma)
    d1 = np.log(first[0] / first[1])
    promoted, _, used, bounds = sequential_rule(d1, threshold=threshold, confidence=confidence)
    n2 = max(crossover.MIN_SWAPPED_REQUESTS, math.ceil(fraction * pairs))
    second = simulate(rng, runs, n2, speedup / host, sigma)
    mean2, low2, high2 = paired_t(np.log(second[0] / second[1]), confidence)
    kept, effects = 0, []
    for r in range(runs):
        low, high = float(bounds[0, r]), float(bounds[1, r])
        at = sequential.Look(True, "", int(used[r]), low, high)
        if promoted[r]:
            est = comparison.sequential_estimate(
                d1[r], at, threshold=threshold, confidence=confidence, horizon=pairs
            )
        else:  # only a pass can be withheld: the centre suffices for the effect's mean
            est = float(d1[r, : int(used[r])].mean())
        one = Speedup(metric="tpot", estimate=math.exp(est), ci_low=math.exp(low), ci_high=math.exp(high))
        two = Speedup(
            metric="tpot",
            estimate=math.exp(mean2[r]),
            ci_low=math.exp(low2[r]),
            ci_high=math.exp(high2[r]),
        )
        placed = crossover.fold(one, two)
        effects.append(placed.effect or math.nan)
        stage = StageResult(
            name="s", speedup=one, verdict=StageVerdict.PASS if promoted[r] else StageVerdict.FAIL
        )
        if rule == "round1-margin":
            kept += bool(promoted[r]) and math.exp(low) / (placed.effect or math.inf) >= min_speedup
        else:
            kept += crossover.judge(stage, placed, min_speedup=min_speedup).verdict is StageVerdict.PASS
    return {
        "speedup": speedup,
        "host": host,
        "promote_without": float(promoted.mean()),
        "promote_with": kept / runs,
        "mean_effect": float(np.nanmean(effects)),
        "mean_pairs_round1": float(np.mean(used)),
        "pairs_round2": n2,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2000, help="simulated experiments per scenario")
    p.add_argument("--max-pairs", type=int, default=300, help="requestsPerStage")
    p.add_argument("--fraction", type=float, default=0.5, help="analysis.crossoverFraction")
    p.add_argument("--min-speedup", type=float, default=1.10)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--sigma", type=float, default=0.25, help="per-arm log-noise of TPOT")
    p.add_argument("--seed", type=int, default=20261202)
    p.add_argument("--rule", choices=["operator", "round1-margin"], default="operator")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    started = time.time()
    rows = []
    for speedup in (1.0, round(1.2 * args.min_speedup, 4)):
        for host in (1.0, 1.1, 1.2, 1 / 1.1):
            rng = np.random.default_rng([args.seed, int(speedup * 1000), int(host * 1000)])
            row = scenario(
                rng,
                runs=args.runs,
                pairs=args.max_pairs,
                fraction=args.fraction,
                speedup=speedup,
                host=host,
                sigma=args.sigma,
                min_speedup=args.min_speedup,
                confidence=args.confidence,
                rule=args.rule,
            )
            rows.append(row)
            print(
                f"true {speedup:.2f}x, treatment host {host:.3f}x: promote {row['promote_without']:.1%} without, "
                f"{row['promote_with']:.1%} with the crossover; mean placement effect {row['mean_effect']:.3f}",
                flush=True,
            )
    print(f"{time.time() - started:.0f} s")
    if args.json:
        doc = {
            "args": vars(args),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
            "seconds": round(time.time() - started, 1),
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
