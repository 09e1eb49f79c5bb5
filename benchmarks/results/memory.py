"""Peak memory of the operator judging one experiment's results, against the size of those results.

Results format version 1 (gzip'd JSON; version 2: benchmarks/scale/results_100k.py). Builds
`--records` request records per arm as the load Job writes them (every token event and the
generated text kept, `--tokens` tokens each), packs them as the load Job does, then in a fresh
process does what the operator does in Analyzing: inflate the bundle (bounded by
`--max-bytes`), parse the records, analyse and render the report. Prints one JSON line: the raw
and gzip'd sizes, the parts, the child's peak RSS (VmHWM) and the outcome.

    .venv/bin/python benchmarks/results/memory.py --records 4000 --tokens 256
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def build(records: int, tokens: int, stages: int) -> dict[str, str]:
    """The load Job's three files for `records` requests per arm, split over `stages` stages."""
    from tests.factories import experiment_document
    from tests.report import synthetic

    from specdecode.experiment import validation

    stage_list = [{"name": f"c{i}", "concurrency": 1} for i in range(stages)]
    doc = experiment_document(
        workload={"stages": stage_list, "requestsPerStage": max(1, records // stages), "warmupRequests": 0}
    )
    spec, _ = validation.parse_experiment(doc)
    recs, windows = synthetic.run(spec, tokens=tokens, warmup=0)
    text = " ".join(f"tok{i % 97}" for i in range(tokens))  # ~6 characters a token, as real text
    lines = "".join(r.model_copy(update={"text": text}).model_dump_json() + "\n" for r in recs)
    doc_windows = {
        "anchor": {"monotonic": 0.0, "wall": 0.0},
        "windows": [w.model_dump(mode="json") for w in windows],
    }
    return {
        "requests.jsonl": lines,
        "windows.json": json.dumps(doc_windows),
        "loadgen-summary.json": json.dumps({"validity": {"valid": True, "reasons": []}}),
        "__spec__": json.dumps(doc["spec"]),
    }


def judge(bundle_path: str, max_bytes: int) -> dict[str, Any]:
    """In this process: what the operator does with the parts (inflate, parse, analyse, render)."""
    from specdecode import results
    from specdecode.experiment import status, validation, validity, verdict
    from specdecode.report import page

    parts, spec_doc = pickle.loads(Path(bundle_path).read_bytes())
    started = time.perf_counter()
    try:
        recs, _, windows, summary = results.parse(results.unpack(parts, max_bytes=max_bytes))
    except results.ResultsError as exc:
        outcome = exc.reason
    else:
        del parts
        spec, _ = validation.parse_experiment(
            {
                "apiVersion": "specdecode.io/v1alpha1",
                "kind": "SpecDecodeExperiment",
                "metadata": {"name": "exp"},
                "spec": spec_doc,
            }
        )
        analysis = verdict.analyse(spec, recs, windows, validity=validity.Validity.of_summary(summary))
        judged = analysis.apply(status.ExperimentStatus())
        page.render_html(judged, recs, windows, spec, name="exp")
        outcome = str(analysis.verdict or analysis.reason)
    return {
        "outcome": outcome,
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mib": round(peak_rss() / 2**20),
    }


def peak_rss() -> int:
    """This process's peak resident set (VmHWM: unlike ru_maxrss, not inherited across exec from a
    large parent that spawned it with vfork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(records: int, tokens: int, stages: int, max_bytes: int) -> dict[str, Any]:
    """Build the results here, judge them in a fresh process (its peak RSS is the figure)."""
    from specdecode import results

    files = build(records, tokens, stages)
    spec_doc = json.loads(files.pop("__spec__"))
    raw = sum(len(v.encode()) for v in files.values())
    parts = results.pack_legacy(files)  # version 1 (benchmarks/scale/results_100k.py compares v2)
    with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
        f.write(pickle.dumps((parts, spec_doc)))
        f.flush()
        child = subprocess.run(
            [sys.executable, __file__, "--judge", f.name, "--max-bytes", str(max_bytes)],
            check=True,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
    return {
        "records": 2 * records,
        "tokens": tokens,
        "raw_mib": round(raw / 2**20, 1),
        "gzip_mib": round(sum(map(len, parts)) / 2**20, 1),
        "parts": len(parts),
        "max_bytes_mib": round(max_bytes / 2**20),
        **json.loads(child.stdout),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=4000, help="requests per arm")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--max-bytes", type=int, default=None, help="default: the operator's default")
    p.add_argument("--judge", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.max_bytes is None:
        from specdecode import results

        args.max_bytes = results.Limits().max_bytes
    if args.judge:
        print(json.dumps(judge(args.judge, args.max_bytes)))
        return
    print(json.dumps(measure(args.records, args.tokens, args.stages, args.max_bytes)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
