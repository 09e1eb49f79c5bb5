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

`--store s3` (version 2 only): the same through the S3 store. s3proxy is started as the tests
start it (tests/s3_server.py; `make s3proxy` fetches the jar), then in fresh processes whose
environment names the bucket as the chart does (`s3.as_env`, the AWS keys):

- upload (the load pod's side, `cli.py`): `s3.upload` of the directory, one object, its CPU, wall
  time and peak RSS;
- s3-judge (the operator's side, `controller/reading.py`): `results.download` of the load Job's
  object at the operator's default limits (download wall time, CPU, peak RSS and the object's
  size), then the judge's figures as above (`unpack_cpu_s` then includes the download).

`--run DIR` keeps the written run in DIR, or reuses the one written there (writing takes minutes).

    nice .venv/bin/python benchmarks/scale/results_100k.py --records 100000 --format v2 v1
    nice .venv/bin/python benchmarks/scale/results_100k.py --store s3 --format v2 --run /tmp/run-100k
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


def experiment_spec(spec_doc: dict[str, Any]) -> Any:
    """The parsed spec of the written run (`write_run`); imports what `analyse` uses, so that its
    figures leave imports out."""
    from specdecode.experiment import status, validation, validity, verdict  # noqa: F401
    from specdecode.report import page  # noqa: F401

    spec, _ = validation.parse_experiment(
        {
            "apiVersion": "specdecode.io/v1alpha1",
            "kind": "SpecDecodeExperiment",
            "metadata": {"name": "exp"},
            "spec": spec_doc,
        }
    )
    return spec


def judge(parts_path: Path, spec_doc: dict[str, Any]) -> dict[str, Any]:
    """In this process: the operator's side, parts -> records -> verdict -> report."""
    from specdecode import results

    spec = experiment_spec(spec_doc)
    parts = pickle.loads(parts_path.read_bytes())
    baseline, t0 = rss("VmRSS"), cpu()
    bundle = results.unpack(parts, max_bytes=2**40)
    del parts
    return analyse(bundle, spec, baseline, t0)


def analyse(bundle: Any, spec: Any, baseline: int, t0: float) -> dict[str, Any]:
    """In this process: a bundle (read since CPU time `t0`, at RSS `baseline`) -> records (the
    `unpack_cpu_s`) -> verdict -> report, as `controller/collect.py` does; the operator's figures."""
    from specdecode import results
    from specdecode.experiment import status, validity, verdict
    from specdecode.report import page

    recs, _, windows, summary = results.parse(bundle)
    del bundle
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


# Where the S3 steps store and read the bundle: the load Job's object key (`s3.object_key`).
S3_OBJECT = {"namespace": "scale", "experiment": "exp", "generation": 1, "job_uid": "job-uid-1"}
S3_PREFIX = "exp-results"


def s3_upload(directory: Path) -> dict[str, Any]:
    """In this process: the load pod's side with the S3 store (`cli.py`: `s3.upload` of the bucket
    `s3.from_env` names), the directory -> one object; the object's size and digest come after."""
    import asyncio

    from specdecode.results import s3

    location = s3.from_env()
    assert location is not None, "no SPECDECODE_RESULTS_S3_BUCKET in the environment"
    baseline, started, wall = rss("VmRSS"), cpu(), time.perf_counter()
    url = asyncio.run(
        s3.upload(
            location,
            directory,
            namespace=str(S3_OBJECT["namespace"]),
            experiment=str(S3_OBJECT["experiment"]),
            prefix=S3_PREFIX,
            generation=int(S3_OBJECT["generation"]),
            job_uid=str(S3_OBJECT["job_uid"]),
        )
    )
    return {
        "object": url,
        "upload_cpu_s": round(cpu() - started, 2),
        "upload_wall_s": round(time.perf_counter() - wall, 2),
        "upload_peak_rss_mib": round(rss() / 2**20),
        "upload_baseline_rss_mib": round(baseline / 2**20),
    }


def s3_judge(spec_doc: dict[str, Any]) -> dict[str, Any]:
    """In this process: the operator's side with the S3 store (`controller/reading.py`):
    `results.download` of the load Job's object, at the operator's default limits, then `analyse`."""
    import asyncio

    from specdecode import results
    from specdecode.results import s3

    location = s3.from_env()
    assert location is not None, "no SPECDECODE_RESULTS_S3_BUCKET in the environment"
    spec = experiment_spec(spec_doc)
    # The operator's event loop lives on (kopf's); a loop torn down after each download
    # (`asyncio.run`) peaked at ~54 MiB more in its teardown here, which the operator never does.
    loop = asyncio.new_event_loop()
    baseline, t0, wall = rss("VmRSS"), cpu(), time.perf_counter()
    bundle = loop.run_until_complete(
        results.download(
            None,  # type: ignore[arg-type]  # no ConfigMap is read with a bucket
            namespace=str(S3_OBJECT["namespace"]),
            experiment=str(S3_OBJECT["experiment"]),
            generation=int(S3_OBJECT["generation"]),
            job_uid=str(S3_OBJECT["job_uid"]),
            limits=results.Limits(s3=True),
            store=location,
        )
    )
    downloaded = {
        "download_wall_s": round(time.perf_counter() - wall, 2),
        "download_cpu_s": round(cpu() - t0, 2),
        "download_peak_rss_mib": round(rss() / 2**20),
        "object_mib": round(len(bundle.data) / 2**20, 2),
    }
    judged = analyse(bundle, spec, baseline, t0)
    loop.close()
    return {**judged, **downloaded}


def run_s3(directory: Path, server_dir: Path, raw: int, tokens: int) -> None:
    """Start s3proxy as the tests do (tests/s3_server.py), then upload and judge in fresh processes
    whose environment names the bucket as the chart's values do (`s3.as_env`) and the keys."""
    import os

    from tests.s3_server import running

    from specdecode.results import s3

    with running(server_dir) as server:
        server.make_bucket("specdecode-results")
        location = s3.Location("specdecode-results", "runs", server.endpoint)
        env = {**os.environ, **server.env(), **s3.as_env(location)}
        uploaded = child("--step", "upload", str(directory), "-", env=env)
        judged = child("--step", "s3-judge", "-", str(directory / "spec.json"), env=env)
    line = {
        "format": "v2",
        "store": "s3",
        "tokens": tokens,
        "raw_mib": round(raw / 2**20),
        **uploaded,
        **judged,
    }
    print(json.dumps(line), flush=True)


def child(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one step of this script in a fresh process (in `env`); its JSON line."""
    done = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True, cwd=ROOT, env=env
    )
    return dict(json.loads(done.stdout))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--records", type=int, default=100_000, help="request records, both arms")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument(
        "--format", nargs="+", choices=["v1", "v2"], help="default: v2 v1 (--store s3: v2, all it takes)"
    )
    p.add_argument(
        "--store",
        default="configmaps",
        choices=["configmaps", "s3"],
        help="s3: the load pod uploads (version 2) to s3proxy and the operator downloads from it",
    )
    p.add_argument("--run", type=Path, help="keep the written run here, or reuse the one written here")
    p.add_argument("--step", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step:
        step, where, extra = args.step
        if step == "pack":
            fmt, parts_path = extra.split(":", 1)
            print(json.dumps(pack(Path(where), fmt, Path(parts_path))))
        elif step == "upload":
            print(json.dumps(s3_upload(Path(where))))
        elif step == "s3-judge":
            print(json.dumps(s3_judge(json.loads(Path(extra).read_text()))))
        else:
            print(json.dumps(judge(Path(where), json.loads(Path(extra).read_text()))))
        return
    if args.store == "s3" and args.format not in (None, ["v2"]):
        p.error("--store s3: the load pod uploads version 2 only; pass --format v2")
    formats = args.format or ["v2", "v1"]
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.run or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        if not (directory / "spec.json").exists():
            spec_doc = write_run(directory, args.records, args.tokens, args.stages)
            (directory / "spec.json").write_text(json.dumps(spec_doc))
            print(f"# wrote the run in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        raw = sum((directory / name).stat().st_size for name in ("requests.jsonl", "windows.json"))
        print(f"# {raw / 2**20:.0f} MiB of results in {directory}", file=sys.stderr)
        if args.store == "s3":
            with tempfile.TemporaryDirectory() as server_dir:
                run_s3(directory, Path(server_dir), raw, args.tokens)
            return
        for fmt in formats:
            parts_path = directory / f"parts-{fmt}.pickle"
            packed = child("--step", "pack", str(directory), f"{fmt}:{parts_path}")
            judged = child("--step", "judge", str(parts_path), str(directory / "spec.json"))
            parts_path.unlink()
            line = {"format": fmt, "tokens": args.tokens, "raw_mib": round(raw / 2**20), **packed, **judged}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
