"""Output equivalence decided, not assumed: a lossy treatment against the default minOutputMatch.

A clear speed win used to stop a stage at its first look (20 pairs), and the output-match guardrail
"held" whenever those pairs showed no mismatch, although 20 clean pairs cannot show a match rate of
0.99. This runs whole stages through the verdict's own code at default settings (`requestsPerStage`
300, minOutputMatch 0.99, maxErrorRate 0.01, confidence 0.95, sequential on, one closed-loop stage
at C = 1): the load generator's stop rule (`verdict.stage_decided`, asked at the plan's looks,
`sequential.planned_looks`) decides when the stage ends, and `verdict.analyse_stage` judges what ran.

Each pair: the control's TPOT log-normal (σ 0.3 between prompts), the treatment's the control's /
speed-up × exp(0.15 z); the treatment's greedy text differs from the control's with probability
`mismatch`, independently per pair. No request fails.

Two designs on the same pairs:
- `before` (the rule before issue 35 item 2): the stage stops at the first look whose speed-up
  interval is decided; the guardrail holds when its estimate is within the limit (today's Undecided
  counts as Holds);
- `now`: the stop rule waits until errorRate and outputMatch are decided (their one-sided bound
  within the limit) or one fails; Undecided blocks a Pass.
Per configuration: the rate of stage Pass (Promote, for this one-stage experiment), its 95% Wilson
interval, and the median pairs the stage ran.

Run: .venv/bin/python benchmarks/verdict/equivalence.py --runs 400 --json benchmarks/verdict/equivalence.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))

from specdecode.experiment import sequential, validation, verdict  # noqa: E402
from specdecode.experiment.comparison import proportion_interval  # noqa: E402
from specdecode.experiment.records import RequestRecord  # noqa: E402
from specdecode.experiment.spec import ExperimentSpec  # noqa: E402
from specdecode.experiment.status import ReasonCode, StageVerdict  # noqa: E402

REQUESTS = 300  # the default requestsPerStage
CONFIGS = (  # (speed-up, greedy mismatch rate)
    (1.5, 0.05),
    (1.2, 0.05),
    (1.5, 0.02),
    (1.2, 0.0),
    (1.5, 0.0),
)


def experiment() -> ExperimentSpec:
    doc = {
        "apiVersion": "specdecode.io/v1alpha1",
        "kind": "SpecDecodeExperiment",
        "metadata": {"name": "equivalence"},
        "spec": {
            "model": "Qwen/Qwen3-4B",
            "speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
            "workload": {"stages": [{"name": "c1", "concurrency": 1}]},
        },
    }
    spec, _ = validation.parse_experiment(doc)
    assert spec.workload.requests_per_stage == REQUESTS and spec.analysis.guardrails.min_output_match == 0.99
    return spec


def stage_records(rng: np.random.Generator, speedup: float, mismatch: float) -> list[RequestRecord]:
    base = np.exp(rng.normal(2.3, 0.3, REQUESTS))
    treated = base / speedup * np.exp(rng.normal(0.0, 0.15, REQUESTS))
    differs = rng.random(REQUESTS) < mismatch
    out: list[RequestRecord] = []
    for i in range(REQUESTS):
        text = f"answer {i}"
        for arm, tpot, t in (
            ("control", base[i], text),
            ("treatment", treated[i], text + "!" * int(differs[i])),
        ):
            out.append(
                RequestRecord(
                    stage="c1", index=i, arm=arm, sent=float(i), ok=True, tpot_ms=float(tpot), text=t
                )
            )
    return out


def judge(spec: ExperimentSpec, recs: list[RequestRecord], *, now: bool) -> tuple[bool, int]:
    """(the stage passed, pairs it ran) under the design `now` or `before`."""
    stage = spec.workload.stages[0]
    looks = sequential.planned_looks(REQUESTS, sequential.first_look(stage.concurrency))
    ran = REQUESTS
    for n in looks:
        upto = recs[: 2 * n]
        control = [r for r in upto if r.arm == "control"]
        treatment = [r for r in upto if r.arm == "treatment"]
        if now:
            stop = verdict.stage_decided(spec.analysis, control, treatment, max_pairs=REQUESTS, concurrency=1)
        else:
            stop = verdict.stage_look(
                spec.analysis, control, treatment, max_pairs=REQUESTS, concurrency=1
            ).decided
        if stop:
            ran = n
            break
    result = verdict.analyse_stage(spec, stage, recs[: 2 * ran], None)
    passed = result.verdict is StageVerdict.PASS or (
        not now and result.code is ReasonCode.GUARDRAIL_UNDECIDED
    )
    return passed, ran


def one(args: tuple[float, float, int, int]) -> dict[str, Any]:
    speedup, mismatch, runs, seed = args
    spec = experiment()
    out: dict[str, Any] = {"speedup": speedup, "mismatch": mismatch, "runs": runs}
    for design in ("before", "now"):
        rng = np.random.default_rng(seed)
        judged = [
            judge(spec, stage_records(rng, speedup, mismatch), now=design == "now") for _ in range(runs)
        ]
        passes = sum(p for p, _ in judged)
        low, high = proportion_interval(passes, runs, confidence=0.95, method="wilson")
        out[design] = {
            "pass_rate": passes / runs,
            "ci": [round(low, 3), round(high, 3)],
            "median_pairs": float(np.median([n for _, n in judged])),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    started = time.monotonic()
    with ProcessPoolExecutor() as pool:
        rows = list(pool.map(one, [(s, m, a.runs, a.seed + i) for i, (s, m) in enumerate(CONFIGS)]))
    print(
        f"{'speed-up':>8} {'mismatch':>8} | {'Pass before [95%]':>24} {'pairs':>5} | {'Pass now [95%]':>24} {'pairs':>5}"
    )
    for r in rows:
        b, n = r["before"], r["now"]
        print(
            f"{r['speedup']:>8.2f} {r['mismatch']:>8.2f} | {b['pass_rate']:>8.3f} {b['ci']!s:>15} {b['median_pairs']:>5.0f}"
            f" | {n['pass_rate']:>8.3f} {n['ci']!s:>15} {n['median_pairs']:>5.0f}"
        )
    elapsed = time.monotonic() - started
    print(f"{a.runs} runs a configuration, {elapsed:.0f} s")
    if a.json:
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()} {platform.processor() or ''} {sys.platform}".strip(),
            "command": " ".join(sys.argv),
            "seconds": round(elapsed, 1),
        }
        a.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
