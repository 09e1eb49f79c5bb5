#!/usr/bin/env python3
"""bench.sh's comparison: vLLM's `vllm bench serve` against the project's figures on the same prompts.

    compare.py BENCHDIR [EXP_RESULT_JSON]   -> BENCHDIR/compare.json, BENCHDIR/compare.txt (also printed)

Sources, per stage: bench/STAGE.json (vllm bench serve: median_ttft_ms, median_tpot_ms), proj1/ and proj2/
stages.json (the project's load generator against the same server process, before and after the bench),
and the experiment's result.json control figures (stages[].control.ttftP50/tpotP50: another start of the same
control command line). Target (issue): bench within 3% of the project's figures."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    d = Path(argv[0])
    exp = json.loads(Path(argv[1]).read_text()) if len(argv) > 1 and Path(argv[1]).exists() else None
    rows, lines = [], []
    for bench_file in sorted((d / "bench").glob("*.json")):
        stage = bench_file.stem
        b = json.loads(bench_file.read_text())
        row = {"stage": stage, "bench": {"ttft_p50": b.get("median_ttft_ms"), "tpot_p50": b.get("median_tpot_ms"),
                                          "completed": b.get("completed")}}
        for name in ("proj1", "proj2"):
            f = d / name / "stages.json"
            if f.exists():
                row[name] = json.loads(f.read_text()).get(stage)
        if exp:
            st = next((s for s in exp.get("stages", []) if s.get("name") == stage), None)
            if st:
                row["experiment"] = {"ttft_p50": st["control"].get("ttftP50"), "tpot_p50": st["control"].get("tpotP50"),
                                     "requests": st["control"].get("requests")}
        for metric in ("ttft_p50", "tpot_p50"):
            bv = row["bench"][metric]
            proj = [(row.get(r) or {}).get(metric) for r in ("proj1", "proj2")]
            proj = [x for x in proj if x]
            if proj:
                row[f"proj_{metric}"] = sum(proj) / len(proj)
            for ref, rv in (("proj", row.get(f"proj_{metric}")), ("experiment", (row.get("experiment") or {}).get(metric))):
                if bv and rv:
                    row.setdefault("diff", {})[f"{metric} bench vs {ref}"] = bv / rv - 1
        rows.append(row)
        fmt = lambda x: "-" if x is None else f"{x:7.3f}"  # noqa: E731
        pct = lambda x: "-" if x is None else f"{x:+.1%}"  # noqa: E731
        for metric in ("tpot_p50", "ttft_p50"):
            dp = row.get("diff", {}).get(f"{metric} bench vs proj")
            de = row.get("diff", {}).get(f"{metric} bench vs experiment")
            verdict = "-" if dp is None else ("within 3%" if abs(dp) <= 0.03 else "OUTSIDE 3%")
            lines.append(
                f"{stage:5} {metric:8}  bench {fmt(row['bench'][metric])}  project same server {fmt(row.get(f'proj_{metric}'))}"
                f" (pass1 {fmt((row.get('proj1') or {}).get(metric))}, pass2 {fmt((row.get('proj2') or {}).get(metric))})"
                f"  experiment control {fmt((row.get('experiment') or {}).get(metric))} ms"
                f" | bench vs project {pct(dp)} {verdict}; vs experiment {pct(de)}")
    text = "vllm bench serve vs the project's load generator (same prompts, closed loop)\n" + "\n".join(lines)
    (d / "compare.json").write_text(json.dumps(rows, indent=1) + "\n")
    (d / "compare.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
