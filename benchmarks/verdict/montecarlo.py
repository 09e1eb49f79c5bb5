"""Monte Carlo study of the verdict's sequential rule (issue 5).

Each simulated experiment is one stage of up to `--max-pairs` paired requests. Per request i:
    TPOT_arm,i = base * exp(a_i + e_arm,i) * stall_arm,i   (treatment divided by the true speed-up)
a_i ~ N(0, 0.4) is the prompt's own heterogeneity, shared by both arms (long prompts are slow in
both); e ~ N(0, sigma) is independent per arm (batch composition differs between the arms); with
probability 5% a request also stalls by a factor 1 + Pareto(2) (heavy right tail, both arms alike).
The true speed-up is exp(E[log control - log treatment]) — the estimand of verdict.compare.

Rules compared on the same samples:
- sequential: the operator's rule (`specdecode.experiment.sequential`, the code the operator runs):
  the load generator looks every `--look-every` pairs, each look acts at its last analysis point
  (10, 15, 20, ... pairs); stop when the promote or fail SPRT stops or the stage is futile; promote
  iff the interval's lower bound >= minSpeedup at the stop;
- old: the rule this replaced (normal-mixture confidence sequence, horizon futility), for before/after;
- fixed: the paired t test after a fixed n, two-sided at the same confidence, i.e. each one-sided
  test at (1 - confidence) / 2 like the sequential rule (what `analysis.sequential: false` does).
  "The fixed-horizon test with the same error rates" is this test with the same alpha and the same
  power at 1.2 x minSpeedup as the rule it is compared with (n found by simulation on these samples:
  the smallest n whose promote rate reaches that power). Reported twice: matched to each rule's own
  power (same alpha, same beta), and at exactly 90% power (the issue's power floor);
- naive: "promote if the mean of per-request TPOT ratios >= minSpeedup" after all pairs (what users
  do today), and its cousin "ratio of mean TPOTs >= minSpeedup".

Run: .venv/bin/python benchmarks/verdict/montecarlo.py --runs 4000   (about 30 s on 2 cores)
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

from specdecode.experiment import sequential


def simulate(rng: np.random.Generator, runs: int, pairs: int, speedup: float, sigma: float) -> np.ndarray:
    """(control, treatment) TPOT in ms, shape (2, runs, pairs)."""
    a = rng.normal(0.0, 0.4, (runs, pairs))

    def arm() -> np.ndarray:
        stall = np.where(rng.random((runs, pairs)) < 0.05, 1.0 + rng.pareto(2.0, (runs, pairs)), 1.0)
        return 10.0 * np.exp(a + rng.normal(0.0, sigma, (runs, pairs))) * stall

    return np.stack([arm(), arm() / speedup])


def sequential_rule(
    d: np.ndarray, *, threshold: float, confidence: float, look_every: int, futility: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(promoted, failed, pairs used, [low, high] at the stop) per run: the operator's rule.

    The load generator looks every `look_every` pairs; each look acts at its last analysis point
    (`sequential.analysis_points`), exactly as `verdict.stage_decided` does.
    """
    runs, n = d.shape
    rule = sequential.stops(d, threshold=threshold, confidence=confidence, horizon=n)
    seq = sequential.confidence_sequence(d, confidence=confidence, horizon=n)
    t = np.arange(1, n + 1)
    points = np.flatnonzero(rule.points) + 1
    # The analysis point each look acts at (looks before the first point see nothing).
    looks = t[(t % look_every == 0) | (t == n)]
    acted = np.array([points[points <= k][-1] if (points <= k).any() else 0 for k in looks])
    acted = np.unique(acted[acted > 0]) - 1
    stop = rule.above | rule.below
    if futility:
        stop |= rule.futile
    stop = stop[:, acted]
    stop[:, -1] = True
    first = acted[stop.argmax(axis=1)]
    rows = np.arange(runs)
    low, high = seq.low[rows, first], seq.high[rows, first]
    return low >= threshold, high < threshold, first + 1, np.stack([low, high])


def old_rule(
    d: np.ndarray, *, threshold: float, confidence: float, look_every: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rule before this study's revision, for the before/after table: the two-sided normal-mixture
    confidence sequence (t* = max(20, n/10)), running intersection, horizon futility."""
    runs, n = d.shape
    alpha = 1.0 - confidence
    t = np.arange(1, n + 1, dtype=np.float64)
    mean = np.cumsum(d, axis=1) / t
    c = d - d[:, :1]
    cm = np.cumsum(c, axis=1) / t
    sd = np.sqrt(np.maximum(np.cumsum(c * c, axis=1) - t * cm * cm, 0.0) / np.maximum(t - 1.0, 1.0))
    r2 = (-2.0 * math.log(alpha) + math.log(-2.0 * math.log(alpha) + 1.0)) / max(20, n // 10)

    def factor(k: np.ndarray) -> np.ndarray:
        return np.sqrt(2.0 * (k * r2 + 1.0) / (k * k * r2) * np.log(np.sqrt(k * r2 + 1.0) / alpha))

    low, high = mean - sd * factor(t), mean + sd * factor(t)
    low[:, t < 10], high[:, t < 10] = -np.inf, np.inf
    low, high = np.maximum.accumulate(low, axis=1), np.minimum.accumulate(high, axis=1)
    final = sd * factor(np.array(float(n)))
    stop = (low > threshold) | (high < threshold) | ((threshold - final < low) & (high < threshold + final))
    stop &= ((t % look_every == 0) & (t >= 10))[None, :]
    stop[:, -1] = True
    first = stop.argmax(axis=1)
    rows = np.arange(runs)
    lo, hi = low[rows, first], high[rows, first]
    return lo > threshold, hi < threshold, first + 1, np.stack([lo, hi])


def fixed_rule(
    d: np.ndarray, n: int, *, threshold: float, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """Paired t lower/upper bounds after the first n pairs (two-sided at `confidence`, i.e. each
    one-sided test at (1 - confidence) / 2: what `analysis.sequential: false` does)."""
    x = d[:, :n]
    mean = x.mean(axis=1)
    se = x.std(axis=1, ddof=1) / math.sqrt(n)
    crit = stats.t.ppf(0.5 + confidence / 2.0, n - 1)
    return mean - crit * se, mean + crit * se


def fixed_n_for_power(d: np.ndarray, power: float, *, threshold: float, confidence: float) -> int | None:
    """The smallest fixed n whose paired-t promote rate on `d` (samples at 1.2 x) reaches `power`."""
    for n in range(sequential.MIN_PAIRS, d.shape[1] + 1):
        if (fixed_rule(d, n, threshold=threshold, confidence=confidence)[0] > threshold).mean() >= power:
            return n
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2000, help="simulated experiments per scenario")
    p.add_argument("--max-pairs", type=int, default=300, help="requestsPerStage")
    p.add_argument("--min-speedup", type=float, default=1.10)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--look-every", type=int, default=5, help="pairs between the load generator's looks")
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.25, 0.5], help="per-arm log-noise of TPOT")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    m, conf, n_max = args.min_speedup, args.confidence, args.max_pairs
    th = math.log(m)
    started = time.time()
    results = []
    for sigma in args.sigmas:
        row: dict[str, object] = {"sigma": sigma}
        by_truth: dict[str, dict[str, float]] = {}
        samples = {}
        for label, truth in (
            ("slower 1.0x", 1.0),
            ("at minSpeedup", m),
            ("1.1 x min", 1.1 * m),
            ("1.2 x min", 1.2 * m),
        ):
            c, t = simulate(rng, args.runs, n_max, truth, sigma)
            d = np.log(c / t)
            samples[label] = d
            promoted, failed, used, bounds = sequential_rule(
                d, threshold=th, confidence=conf, look_every=args.look_every
            )
            no_fut = sequential_rule(
                d, threshold=th, confidence=conf, look_every=args.look_every, futility=False
            )
            old = old_rule(d, threshold=th, confidence=conf, look_every=args.look_every)
            mu = math.log(truth)
            covered = (bounds[0] <= mu) & (mu <= bounds[1])
            by_truth[label] = {
                "true_speedup": truth,
                "seq_promote": float(promoted.mean()),
                "seq_fail": float(failed.mean()),
                "seq_mean_pairs": float(used.mean()),
                "seq_promote_no_futility": float(no_fut[0].mean()),
                "seq_mean_pairs_no_futility": float(no_fut[2].mean()),
                "seq_coverage_at_stop": float(covered.mean()),
                "old_promote": float(old[0].mean()),
                "old_fail": float(old[1].mean()),
                "old_mean_pairs": float(old[2].mean()),
                "old_coverage_at_stop": float(((old[3][0] <= mu) & (mu <= old[3][1])).mean()),
                "naive_mean_ratio_promote": float(((c / t).mean(axis=1) >= m).mean()),
                "naive_ratio_of_means_promote": float((c.mean(axis=1) / t.mean(axis=1) >= m).mean()),
                "sd_log_ratio": float(d.std()),
            }
        # Fixed-horizon comparators (paired t, each side at (1 - confidence) / 2, as the sequential
        # rule), their n found on the samples at 1.2 x: 90% power, and the power of each rule.
        h1 = by_truth["1.2 x min"]
        n90 = fixed_n_for_power(samples["1.2 x min"], 0.90, threshold=th, confidence=conf)
        row["fixed_n_for_90pct_power"] = n90
        if n90 is not None:
            low, _ = fixed_rule(samples["at minSpeedup"], n90, threshold=th, confidence=conf)
            row["fixed_false_promote"] = float((low > th).mean())
            row["seq_pairs_over_fixed_n_at_1.2x"] = h1["seq_mean_pairs"] / n90
            row["old_pairs_over_fixed_n_at_1.2x"] = h1["old_mean_pairs"] / n90
        for rule in ("seq", "old"):
            n_match = fixed_n_for_power(
                samples["1.2 x min"], h1[f"{rule}_promote"], threshold=th, confidence=conf
            )
            row[f"fixed_n_matching_{rule}_power"] = n_match
            if n_match is not None:
                row[f"{rule}_pairs_over_matched_fixed_n_at_1.2x"] = h1[f"{rule}_mean_pairs"] / n_match
        low, high = fixed_rule(samples["at minSpeedup"], n_max, threshold=th, confidence=conf)
        row["fixed_at_max_pairs_coverage"] = float(((low <= th) & (th <= high)).mean())
        row["scenarios"] = by_truth
        results.append(row)
    out = {
        "runs_per_scenario": args.runs,
        "max_pairs": n_max,
        "min_speedup": m,
        "confidence": conf,
        "look_every": args.look_every,
        "design": {
            "design_ratio": sequential.DESIGN_RATIO,
            "futility_ratio": sequential.FUTILITY_RATIO,
            "siegmund_rho": sequential.SIEGMUND_RHO,
            "analysis_every": sequential.LOOK_EVERY,
            "min_pairs": sequential.MIN_PAIRS,
        },
        "seed": args.seed,
        "seconds": round(time.time() - started, 1),
        "machine": f"{platform.machine()} {platform.processor() or ''} python {sys.version.split()[0]} "
        f"numpy {np.__version__}".strip(),
        "results": results,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
