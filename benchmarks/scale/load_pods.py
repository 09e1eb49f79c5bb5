"""Do two load processes hold an open-loop rate that one cannot? (`workload.loadPods`, issue 16)

Usage (from the repository root, with the project's venv):

    python benchmarks/scale/load_pods.py [--rates 200,400,600] [--seconds 5] [--server sim|fake]
                                         [--repeats 1] [--json FILE]

For each rate (requests/s per arm, Poisson, 64-token prompts, 16 output tokens, both arms), the same
experiment file is sent by `specdecode loadgen` as the load Job runs it:

- **1 process**: the whole schedule (what one load pod does);
- **2 processes** at once: `--load-pods 2` with `JOB_COMPLETION_INDEX` 0 and 1 (what the two pods
  of an Indexed Job do), each sending its shard (index mod 2) of the same schedule; their results
  are merged as the operator merges them (`experiment/loadpods.py`).

Both at normal priority, unpinned (the scheduler spreads them over the machine's cores), against
two servers of `benchmarks/loadgen/bench.py` (the simulator by default, on the other core). Per run:
the schedule lag (send - intended) p50/p99 over every request, the achieved send rate per arm (each
process's requests over the span of its send stamps, summed), each process's client CPU and the run's validity
(the load generator's own budgets: lag p99, client CPU; the merged validity for two).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from specdecode import results
from specdecode.experiment import keys, loadpods
from specdecode.loadgen import summary

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "loadgen"))
import bench  # noqa: E402  (the loadgen benchmark's servers and helpers)


def experiment_file(directory: Path, rate: float, seconds: float) -> Path:
    """One open-loop stage at `rate` per arm for `seconds`: short prompts and answers, so the
    servers cost little and the client's sends are what is measured."""
    workload = {
        "dataset": {"type": "synthetic", "inputTokens": 64, "outputTokens": 16},
        "sampling": {"maxTokens": 16},
        "stages": [{"name": "open", "rate": rate}],
        "requestsPerStage": int(rate * seconds),
        "warmupRequests": 0,
    }
    speculative = {"method": "ngram", "numSpeculativeTokens": 3}
    spec = {"model": "bench-model", "speculative": speculative, "workload": workload}
    path = directory / "experiment.json"
    path.write_text(
        json.dumps(
            {"apiVersion": keys.GROUP_VERSION, "kind": keys.KIND, "metadata": {"name": "bench"}, "spec": spec}
        )
    )
    return path


def send(experiment: Path, urls: tuple[str, str], out: Path, pods: int) -> list[loadpods.Measured]:
    """`specdecode loadgen` in `pods` processes at once; the results of each."""
    procs = []
    for k in range(pods):
        argv = [sys.executable, "-m", "specdecode", "loadgen", "--experiment", str(experiment)]
        argv += ["--control-url", urls[0], "--treatment-url", urls[1], "--out", str(out / f"pod{k}")]
        argv += ["--salt", "bench", "--quiet"]
        env = dict(os.environ)
        if pods > 1:
            argv += ["--load-pods", str(pods)]
            env["JOB_COMPLETION_INDEX"] = str(k)
        procs.append(subprocess.Popen(argv, env=env))
    for proc in procs:
        if proc.wait(timeout=600) != 0:
            raise RuntimeError(f"loadgen exited {proc.returncode}")
    return [results.parse_files(results.read_dir(out / f"pod{k}")) for k in range(pods)]


def measure(rate: float, pods: int, *, kind: str, seconds: float, scratch: Path) -> dict[str, Any]:
    out = scratch / f"r{rate:g}-p{pods}"
    out.mkdir(parents=True)
    with bench.servers(kind, 2, realtime=False, python=sys.executable, spec_k=3) as (control, treatment):
        load_before = bench.load()
        shards = send(experiment_file(out, rate, seconds), (control.url, treatment.url), out, pods)
    recs, _, _, merged = loadpods.merge(shards)
    lags = [r.schedule_lag_ms for r in recs if r.schedule_lag_ms is not None]
    sent = [r.sent for r in recs if r.arm == "control"]
    # each process's requests over the span of its own sends, summed (the processes start apart)
    achieved = sum(
        len(s) / max(1e-9, max(s) - min(s))
        for s in ([r.sent for r in p[0] if r.arm == "control"] for p in shards)
        if s
    )
    validity = merged["validity"]
    blocks = validity.get("pods") or [validity]
    return {
        "rate_per_arm": rate,
        "processes": pods,
        "requests_per_arm": len(sent),
        "ok": sum(r.ok for r in recs),
        "load_before": load_before,
        "load_after": bench.load(),
        "schedule_lag_ms": bench.pct(lags),
        "achieved_send_rate_per_arm": achieved,
        "client_cpu_percent": [b.get("client_cpu_percent") for b in blocks],
        "schedule_lag_budget_ms": [b.get("schedule_lag_budget_ms") for b in blocks],
        "valid": bool(validity["valid"]),
        "reasons": validity["reasons"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="200,400,600", help="requests/s per arm")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--server", choices=("sim", "fake"), default="sim")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each (rate, processes), interleaved")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for rate in [float(x) for x in args.rates.split(",") if x]:
                for pods in (1, 2):
                    run = measure(
                        rate, pods, kind=args.server, seconds=args.seconds, scratch=Path(tmp) / str(repeat)
                    )
                    runs.append(run)
                    lag = run["schedule_lag_ms"]
                    print(
                        f"{rate:g} req/s per arm, {pods} process(es): achieved "
                        f"{run['achieved_send_rate_per_arm']:.0f} req/s, lag p50 {lag['p50']:.2f} p99 "
                        f"{lag['p99']:.2f} ms, cpu {run['client_cpu_percent']}, "
                        f"{'valid' if run['valid'] else 'INVALID: ' + '; '.join(run['reasons'])}",
                        flush=True,
                    )
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "server": args.server,
        "seconds": args.seconds,
        "runs": runs,
        "medians": medians(runs),
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (rate, processes): the median p99 lag and achieved rate, and how many runs were valid."""
    keys = sorted({(r["rate_per_arm"], r["processes"]) for r in runs})
    out = []
    for rate, pods in keys:
        same = [r for r in runs if (r["rate_per_arm"], r["processes"]) == (rate, pods)]
        out.append(
            {
                "rate_per_arm": rate,
                "processes": pods,
                "lag_p99_ms": summary.quantile([r["schedule_lag_ms"]["p99"] for r in same], 0.5),
                "achieved_send_rate_per_arm": summary.quantile(
                    [r["achieved_send_rate_per_arm"] for r in same], 0.5
                ),
                "valid_runs": f"{sum(r['valid'] for r in same)}/{len(same)}",
            }
        )
    return out


if __name__ == "__main__":
    main()
