"""CPU of one stage's analysis (`verdict.analyse`) in a long-running operator: the first call in a
process and the median of the following ones (issue 16: 50 collections at once queue on it).

A synthetic run of known effect (`tests/report/synthetic.py`, speed-up 1.3) of the
many-experiments benchmark's experiment (one stage, `--pairs` pairs). Process CPU time
(`time.process_time`), so other work on the machine moves it less than wall time.

    PYTHONPATH=operator:. .venv/bin/python benchmarks/scale/stage_analysis.py [--pairs 200 2000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from benchmarks.scale import many_experiments
from tests.report import synthetic

from specdecode.experiment import validation, verdict


def measure(pairs: int, repeats: int) -> dict[str, float | int]:
    parsed, problems = validation.parse_experiment(many_experiments.experiment("x", pairs))
    assert parsed is not None, problems
    recs, windows = synthetic.run(parsed, n=pairs, warmup=0)
    t = time.process_time()
    verdict.analyse(parsed, recs, windows)
    first = time.process_time() - t
    later = []
    for _ in range(repeats):
        t = time.process_time()
        verdict.analyse(parsed, recs, windows)
        later.append(time.process_time() - t)
    return {
        "pairs": pairs,
        "first_cpu_s": round(first, 4),
        "later_cpu_s_median": round(statistics.median(later), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, nargs="+", default=[200, 2000])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    for pairs in args.pairs:
        print(json.dumps(measure(pairs, args.repeats)))


if __name__ == "__main__":
    main()
