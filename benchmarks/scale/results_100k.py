"""Results at scale: 100,000 request records packed by the load Job, read back and judged by the operator.

Writes a load Job's result directory (`requests.jsonl` as the load generator writes it, every token
event and the generated text kept, `--tokens` tokens each; 1% of the pairs' outputs differ), then,
each step in a fresh process whose peak RSS (VmHWM) and CPU seconds (user + system, imports
excluded) are the figures:

- pack (the load pod's side, `cli.py` after each stage): the directory -> the ConfigMap parts;
- judge (the operator's side, `collect.py`): the parts -> bundle -> records (`results.parse`), the
  analysis (`verdict.analyse`) and the report (`page.render_html`), each step's CPU apart.

`--format v1` is main's format before version 2 (gzip'd JSON of the three files, every record parsed
into a `RequestRecord`; run with its inflation limit lifted, since the operator's default 48 MiB
refuses it), `--format v2` the packed columns (results.py). One JSON line per format, with the
verdict, each stage's verdict and speed-up interval, and a digest of the whole status (`status_sha256`).

    nice .venv/bin/python benchmarks/scale/results_100k.py --records 100000 --format v2 v1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def write_run(directory: Path, records: int, tokens: int, stages: int) -> dict[str, Any]:
    """The load Job's three files for `records` records (both arms), a stage at a time (so that
    no more than one stage's parsed records are in this process at once); returns the spec."""
    from tests.factories import experiment_document
    from tests.report import synthetic

    from specdecode.experiment import validation

    per_stage = max(1, records // 2 // stages)
    doc = experiment_document(
        workload={
            "stages": [{"name": f"c{i}", "concurrency": 1} for i in range(stages)],
            "requestsPerStage": per_stage,
            "warmupRequests": 0,
        }
    )
    text = " ".join(f"tok{i % 97}" for i in range(tokens))  # ~6 characters a token, as real text
    windows = []
    clock = 0.0
    with (directory / "requests.jsonl").open("w") as out:
        for i in range(stages):
            one = experiment_document(
                workload={
                    "stages": [{"name": f"c{i}", "concurrency": 1}],
                    "requestsPerStage": per_stage,
                    "warmupRequests": 0,
                }
            )
            spec, _ = validation.parse_experiment(one)
            recs, stage_windows = synthetic.run(spec, tokens=tokens, warmup=0, seed=i, mismatch_rate=0.01)
            for r in recs:
                shifted = {"sent": r.sent + clock, "end": (r.end or 0.0) + clock, "text": text}
                out.write(r.model_copy(update=shifted).model_dump_json() + "\n")
            for w in stage_windows:
                windows.append(w.model_copy(update={"start": w.start + clock, "end": w.end + clock}))
            clock = windows[-1].end + 1.0
            del recs
    (directory / "windows.json").write_text(
        json.dumps(
            {
                "anchor": {"monotonic": 0.0, "wall": 0.0},
                "windows": [w.model_dump(mode="json") for w in windows],
            }
        )
    )
    (directory / "loadgen-summary.json").write_text(json.dumps({"validity": {"valid": True, "reasons": []}}))
    return dict(doc["spec"])


def cpu() -> float:
    """CPU seconds (user + system) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss(field: str = "VmHWM") -> int:
    """This process's peak (VmHWM) or current (VmRSS) resident set, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def pack(directory: Path, fmt: str, parts_path: Path) -> dict[str, Any]:
    """In this process: the load pod's side, the directory -> parts (written to `parts_path`)."""
    from specdecode import results

    baseline, started = rss("VmRSS"), cpu()
    if fmt == "v1":
        parts = results.pack_legacy(results.read_dir(directory))
    else:
        parts = results.split(results.encode_dir(directory))
    seconds = cpu() - started
    parts_path.write_bytes(pickle.dumps(parts))
    return {
        "pack_cpu_s": round(seconds, 2),
        "pack_peak_rss_mib": round(rss() / 2**20),
        "pack_baseline_rss_mib": round(baseline / 2**20),
        "bundle_mib": round(sum(map(len, parts)) / 2**20, 2),
        "config_maps": len(parts),
    }


def judge(parts_path: Path, spec_doc: dict[str, Any]) -> dict[str, Any]:
    """In this process: the operator's side, parts -> records -> verdict -> report."""
    from specdecode import results
    from specdecode.experiment import status, validation, validity, verdict
    from specdecode.report import page

    spec, _ = validation.parse_experiment(
        {
            "apiVersion": "specdecode.io/v1alpha1",
            "kind": "SpecDecodeExperiment",
            "metadata": {"name": "exp"},
            "spec": spec_doc,
        }
    )
    parts = pickle.loads(parts_path.read_bytes())
    baseline, t0 = rss("VmRSS"), cpu()
    recs, _, windows, summary = results.parse(results.unpack(parts, max_bytes=2**40))
    del parts
    t1 = cpu()
    analysis = verdict.analyse(spec, recs, windows, validity=validity.Validity.of_summary(summary))
    t2 = cpu()
    judged = analysis.apply(status.ExperimentStatus())
    page.render_html(judged, recs, windows, spec, name="exp")
    t3 = cpu()
    return {
        "records": len(recs),
        "verdict": str(analysis.verdict or analysis.reason),
        # the stages' figures, and a digest of the whole status: a change to the analysis's CPU
        # must leave both as they were
        "stages": {
            st.name: [str(st.verdict), st.speedup.estimate, st.speedup.ci_low, st.speedup.ci_high]
            for st in judged.stages
            if st.speedup is not None
        },
        "status_sha256": hashlib.sha256(judged.model_dump_json(by_alias=True).encode()).hexdigest()[:16],
        "unpack_cpu_s": round(t1 - t0, 2),
        "analyse_cpu_s": round(t2 - t1, 2),
        "render_cpu_s": round(t3 - t2, 2),
        "operator_cpu_s": round(t3 - t0, 2),
        "operator_peak_rss_mib": round(rss() / 2**20),
        "operator_baseline_rss_mib": round(baseline / 2**20),
    }


def child(*args: str) -> dict[str, Any]:
    """Run one step of this script in a fresh process; its JSON line."""
    done = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True, cwd=ROOT
    )
    return dict(json.loads(done.stdout))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--records", type=int, default=100_000, help="request records, both arms")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--format", nargs="+", default=["v2", "v1"], choices=["v1", "v2"])
    p.add_argument("--step", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step:
        step, where, extra = args.step
        if step == "pack":
            fmt, parts_path = extra.split(":", 1)
            print(json.dumps(pack(Path(where), fmt, Path(parts_path))))
        else:
            print(json.dumps(judge(Path(where), json.loads(Path(extra).read_text()))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        spec_doc = write_run(directory, args.records, args.tokens, args.stages)
        (directory / "spec.json").write_text(json.dumps(spec_doc))
        raw = sum((directory / name).stat().st_size for name in ("requests.jsonl", "windows.json"))
        print(
            f"# wrote {raw / 2**20:.0f} MiB of results in {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
        for fmt in args.format:
            parts_path = directory / f"parts-{fmt}.pickle"
            packed = child("--step", "pack", str(directory), f"{fmt}:{parts_path}")
            judged = child("--step", "judge", str(parts_path), str(directory / "spec.json"))
            parts_path.unlink()
            line = {"format": fmt, "tokens": args.tokens, "raw_mib": round(raw / 2**20), **packed, **judged}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
