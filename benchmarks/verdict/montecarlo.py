"""Monte Carlo study of the verdict's sequential rule (issue 5).

Each simulated experiment is one stage of up to `--max-pairs` paired requests. Per request i:
    TPOT_arm,i = base * exp(a_i + e_arm,i) * stall_arm,i   (treatment divided by the true speed-up)
a_i ~ N(0, 0.4) is the prompt's own heterogeneity, shared by both arms (long prompts are slow in
both); e ~ N(0, sigma) is independent per arm (batch composition differs between the arms); with
probability 5% a request also stalls by a factor 1 + Pareto(2) (heavy right tail, both arms alike).
The true speed-up is exp(E[log control - log treatment]) — the estimand of comparison.compare.

Rules compared on the same samples:
- sequential: the operator's rule — `specdecode.experiment.sequential`, the code the operator runs: a
  group-sequential design with looks planned from the stage's request bound, error spent over them
  (Hwang-Shih-DeCani), stop at the first look whose repeated confidence interval clears or falls
  below minSpeedup; promote iff that interval's lower bound ≥ minSpeedup;
- fixed: the paired t interval after a fixed n (two-sided at the same confidence), for the n a
  fixed-horizon design needs for 90% power at 1.2 × minSpeedup (found by simulation on these samples);
- naive: "promote if the mean of per-request TPOT ratios ≥ minSpeedup" after all pairs (what users
  do today), and its cousin "ratio of mean TPOTs ≥ minSpeedup".

The point estimate (issue 14), on the first `--estimate-runs` runs of each scenario: its bias on the
log scale (mean and median of estimate - log true speed-up, and how often it overshoots), and the
coverage of the interval reported with it, for
- reported: the operator's estimate, median-unbiased at the deciding look
  (`comparison.sequential_estimate`), with that look's repeated confidence interval;
- mean at stop: the plain mean of the pairs at the deciding look (the interval's centre);
- before: the estimate shipped before issue 14, the mean of every pair that finished, including the
  `--overrun` pairs still in flight at the stop (closed loop at concurrency C: about C), with the
  interval widened to reach it; how often it sat on the interval's end.

The goodput guardrail (issue 14) under no true difference (both arms sampled alike, speed-up 1.0):
with an SLO at the q-th percentile of the latency distribution, how often its paired interval says
goodput dropped (upper bound < 0: blocks a Pass, the false-veto rate) or dropped by more than
maxGoodputDrop 0.02 (fails the stage), at a stage's full 300 pairs and at an early stop's 50
(own random stream: the figures above do not move).

Run: .venv/bin/python benchmarks/verdict/montecarlo.py   (about 20 s on 2 cores, plus about 20 ms per
estimate: --estimate-runs 1000 adds ~5 min)
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

from specdecode.experiment import comparison, sequential


def simulate(rng: np.random.Generator, runs: int, pairs: int, speedup: float, sigma: float) -> np.ndarray:
    """(control, treatment) TPOT in ms, shape (2, runs, pairs)."""
    a = rng.normal(0.0, 0.4, (runs, pairs))

    def arm() -> np.ndarray:
        stall = np.where(rng.random((runs, pairs)) < 0.05, 1.0 + rng.pareto(2.0, (runs, pairs)), 1.0)
        return 10.0 * np.exp(a + rng.normal(0.0, sigma, (runs, pairs))) * stall

    return np.stack([arm(), arm() / speedup])


def sequential_rule(
    d: np.ndarray, *, threshold: float, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(promoted, rejected, pairs used, [low, high] at the stop) per run: the design's planned looks."""
    runs, n = d.shape
    design = sequential.design(n, alpha=1.0 - confidence)
    b = sequential.look_bounds(d, design)
    stop = (b.low > threshold) | (b.high < threshold)
    stop[:, -1] = True
    first = stop.argmax(axis=1)
    rows = np.arange(runs)
    low, high = b.low[rows, first], b.high[rows, first]
    return low > threshold, high < threshold, b.n[first], np.stack([low, high])


def estimates(
    d: np.ndarray,
    used: np.ndarray,
    bounds: np.ndarray,
    truth: float,
    *,
    threshold: float,
    confidence: float,
    overrun: int,
) -> dict[str, float]:
    """Bias of each point estimate (log scale) and coverage of the interval reported with it."""
    runs, horizon = d.shape
    true = math.log(truth)
    reported, at_stop, before, before_low, before_high, fallback = [], [], [], [], [], 0
    for r in range(runs):
        n, low, high = int(used[r]), float(bounds[0, r]), float(bounds[1, r])
        at = sequential.Look(True, "", n, low, high)
        est = comparison.sequential_estimate(
            d[r], at, threshold=threshold, confidence=confidence, horizon=horizon
        )
        centre = float(d[r, :n].mean())
        fallback += (
            est == centre
            and sequential.median_unbiased(
                d[r], at, threshold=threshold, confidence=confidence, horizon=horizon
            )
            != centre
        )
        reported.append(est)
        at_stop.append(centre)
        everything = float(d[r, : min(horizon, n + overrun)].mean())
        before.append(everything)
        before_low.append(min(low, everything))
        before_high.append(max(high, everything))
    out: dict[str, float] = {}
    for name, values in (("reported", reported), ("mean_at_stop", at_stop), ("before", before)):
        v = np.asarray(values) - true
        out[f"{name}_mean_bias"] = float(v.mean())
        out[f"{name}_median_bias"] = float(np.median(v))
        out[f"{name}_overshoot"] = float((v > 0).mean())
    low, high = bounds[0, :runs], bounds[1, :runs]
    out["reported_coverage"] = float(((low <= true) & (true <= high)).mean())
    b_low, b_high = np.asarray(before_low), np.asarray(before_high)
    out["before_coverage"] = float(((b_low <= true) & (true <= b_high)).mean())
    out["before_on_interval_end"] = float(((b_low < low) | (b_high > high)).mean())
    out["reported_fallback_to_centre"] = fallback / runs
    return out


def goodput_false_veto(
    rng: np.random.Generator, runs: int, sigma: float, *, confidence: float, max_drop: float = 0.02
) -> dict[str, float]:
    """How often the goodput guardrail trips when both arms are alike."""
    out: dict[str, float] = {}
    c, t = simulate(rng, runs, 300, 1.0, sigma)
    for q in (0.5, 0.9):
        slo = float(np.quantile(c, q))
        for n in (50, 300):
            blocked = failed = 0
            for r in range(runs):
                change = comparison.paired_proportion_difference(
                    (c[r, :n] <= slo).tolist(), (t[r, :n] <= slo).tolist(), confidence=confidence
                )
                assert change is not None
                blocked += change[2] < 0.0
                failed += change[2] < -max_drop
            out[f"slo_at_p{q * 100:g}_n{n}_blocks_pass"] = blocked / runs
            out[f"slo_at_p{q * 100:g}_n{n}_fails_stage"] = failed / runs
    return out


def fixed_rule(
    d: np.ndarray, n: int, *, threshold: float, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """Paired t lower/upper bounds after the first n pairs."""
    x = d[:, :n]
    mean = x.mean(axis=1)
    se = x.std(axis=1, ddof=1) / math.sqrt(n)
    crit = stats.t.ppf(0.5 + confidence / 2.0, n - 1)
    return mean - crit * se, mean + crit * se


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2000, help="simulated experiments per scenario")
    p.add_argument("--max-pairs", type=int, default=300, help="requestsPerStage")
    p.add_argument("--min-speedup", type=float, default=1.10)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.25, 0.5], help="per-arm log-noise of TPOT")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--estimate-runs", type=int, default=1000, help="runs per scenario for the estimate study")
    p.add_argument("--overrun", type=int, default=4, help="pairs in flight at the stop (before issue 14)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    goodput_rng = np.random.default_rng(args.seed + 1)
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
            promoted, rejected, used, bounds = sequential_rule(d, threshold=th, confidence=conf)
            covered = (bounds[0] <= math.log(truth)) & (math.log(truth) <= bounds[1])
            by_truth[label] = {
                "true_speedup": truth,
                "seq_promote": float(promoted.mean()),
                "seq_reject": float(rejected.mean()),
                "seq_mean_pairs": float(used.mean()),
                "seq_coverage_at_stop": float(covered.mean()),
                "naive_mean_ratio_promote": float(((c / t).mean(axis=1) >= m).mean()),
                "naive_ratio_of_means_promote": float((c.mean(axis=1) / t.mean(axis=1) >= m).mean()),
                "sd_log_ratio": float(d.std()),
            }
            k = min(args.estimate_runs, args.runs)
            if k > 0:
                by_truth[label].update(
                    estimates(
                        d[:k],
                        used[:k],
                        bounds[:, :k],
                        truth,
                        threshold=th,
                        confidence=conf,
                        overrun=args.overrun,
                    )
                )
        # The fixed-horizon design with 90% power at 1.2 x minSpeedup, found on these samples.
        grid = list(range(sequential.MIN_PAIRS, n_max + 1))
        n_fix = None
        for n in grid:
            low, _ = fixed_rule(samples["1.2 x min"], n, threshold=th, confidence=conf)
            if (low > th).mean() >= 0.90:
                n_fix = n
                break
        row["fixed_n_for_90pct_power"] = n_fix
        if n_fix is not None:
            low, high = fixed_rule(samples["at minSpeedup"], n_fix, threshold=th, confidence=conf)
            row["fixed_false_promote"] = float((low > th).mean())
            seq_power = by_truth["1.2 x min"]["seq_promote"]
            # The fixed n matching the sequential rule's own power (if reachable within max pairs).
            n_match = next(
                (
                    n
                    for n in grid
                    if (fixed_rule(samples["1.2 x min"], n, threshold=th, confidence=conf)[0] > th).mean()
                    >= seq_power
                ),
                None,
            )
            row["fixed_n_matching_seq_power"] = n_match
            row["seq_pairs_over_fixed_n_at_1.2x"] = by_truth["1.2 x min"]["seq_mean_pairs"] / n_fix
            if n_match is not None:
                row["seq_pairs_over_matched_fixed_n_at_1.2x"] = (
                    by_truth["1.2 x min"]["seq_mean_pairs"] / n_match
                )
        low, high = fixed_rule(samples["at minSpeedup"], n_max, threshold=th, confidence=conf)
        row["fixed_at_max_pairs_coverage"] = float(((low <= th) & (th <= high)).mean())
        row["scenarios"] = by_truth
        row["goodput_no_difference"] = goodput_false_veto(goodput_rng, args.runs, sigma, confidence=conf)
        results.append(row)
    out = {
        "runs_per_scenario": args.runs,
        "max_pairs": n_max,
        "min_speedup": m,
        "confidence": conf,
        "looks": list(sequential.planned_looks(n_max)),
        "spending_gamma": sequential.GAMMA,
        "seed": args.seed,
        "estimate_runs_per_scenario": min(args.estimate_runs, args.runs),
        "overrun_pairs": args.overrun,
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
