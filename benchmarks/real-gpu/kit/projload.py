#!/usr/bin/env python3
"""The project's own load generator against ONE running server (the control arm), no stop rule:

    projload.py EXP.yaml URL OUTDIR [--no-warmup]   -> OUTDIR/requests.jsonl ..., OUTDIR/stages.json

The same plan as `specdecode run --local` (plan_from_spec, salt f"{seed}-local"), so the same prompts, bodies
and closed-loop schedule as the experiment's control arm; stages.json: per stage TTFT/TPOT p50/p90 (ms) of
the successful measured requests, by the project's definitions (loadgen/summary.py)."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from specdecode.experiment import documents, records
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import runner, summary


def stage_figures(recs: list[records.RequestRecord]) -> dict[str, dict[str, float | int | None]]:
    by: dict[str, list[records.RequestRecord]] = {}
    for r in recs:
        if not r.warmup:
            by.setdefault(r.stage, []).append(summary.derive(r))
    out = {}
    for stage, rs in by.items():
        ok = [r for r in rs if r.ok]
        ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
        tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
        out[stage] = {"requests": len(rs), "ok": len(ok),
                      "ttft_p50": summary.quantile(ttft, 0.5), "ttft_p90": summary.quantile(ttft, 0.9),
                      "tpot_p50": summary.quantile(tpot, 0.5), "tpot_p90": summary.quantile(tpot, 0.9),
                      "prompt_tokens_p50": summary.quantile([float(r.prompt_tokens or 0) for r in ok], 0.5),
                      "completion_tokens_p50": summary.quantile([float(r.completion_tokens or 0) for r in ok], 0.5)}
    return out


def main(argv: list[str]) -> int:
    exp_path, url, out = Path(argv[0]), argv[1], Path(argv[2])
    s = documents.load_experiment(exp_path).spec
    if "--no-warmup" in argv:
        s = s.model_copy(update={"workload": s.workload.model_copy(update={"warmup_requests": 0})})
    plan = plan_mod.plan_from_spec(s, exp_path.parent, salt=f"{s.engine.seed}-local", scrape_metrics=True)
    asyncio.run(runner.run(plan, {"control": runner.Endpoint(url)}, out))
    recs = [records.RequestRecord.model_validate_json(line)
            for line in (out / "requests.jsonl").read_text().splitlines() if line.strip()]
    figs = stage_figures(recs)
    (out / "stages.json").write_text(json.dumps(figs, indent=1) + "\n")
    for stage, f in figs.items():
        print(f"projload {stage}: {f['ok']}/{f['requests']} ok, TTFT p50 {f['ttft_p50']:.2f} ms, "
              f"TPOT p50 {f['tpot_p50']:.3f} ms, prompt tokens p50 {f['prompt_tokens_p50']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
