"""Mutation score of one package by a seeded random sample of cosmic-ray's mutants (issue 23).

Not part of `make test`. Needs cosmic-ray (benchmarks/mutation/README.md). For PACKAGE in
experiment, loadgen, controller it:

1. exports HEAD into a scratch git repository (cosmic-ray mutates files in place: never the checkout);
2. `cosmic-ray init` over the package's modules (all of cosmic-ray's operators);
3. keeps a deterministic sample of N mutants (sorted by module, operator, occurrence, then
   `random.Random(SEED).sample`) and marks the rest skipped;
4. `cosmic-ray exec`: each mutant runs `run_tests.py`, the package's fast tests that name the
   mutated module (`pytest -x`);
5. writes the outcome of every sampled mutant and the score with its 95% Wilson interval as JSON
   (report.py: signature-annotation mutants are set apart as equivalent).

    python benchmarks/mutation/sample.py controller --n 60 --seed 23 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkItem, WorkResult

import report  # benchmarks/mutation/report.py: a script's own folder is on sys.path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

#: modules left out, and why (stated in the README's table)
EXCLUDED = {
    # the Kubernetes client and the kopf entry point: exercised only by the e2e tests against a real
    # kube-apiserver, which take minutes each, not by the fast tests this benchmark runs
    "controller": ["kube.py", "run.py"],
}
#: per-mutant limit: past it the mutant counts as killed by timeout (reported apart)
TIMEOUT_S = {"experiment": 300.0, "loadgen": 120.0, "controller": 120.0}


def scratch_copy(dest: Path) -> None:
    """HEAD's tracked files in a git repository of their own (run_tests.py diffs against it)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    for cmd in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=m", "-c", "user.email=m@m", "commit", "-qm", "base"],
    ):
        subprocess.run(["git", "-C", str(dest), *cmd], check=True)


def config(package: str, modules: list[str]) -> str:
    paths = ", ".join(json.dumps(m) for m in modules)
    return (
        "[cosmic-ray]\n"
        f"module-path = [{paths}]\n"
        f"timeout = {TIMEOUT_S[package]}\n"
        "excluded-modules = []\n"
        f'test-command = "{sys.executable} {HERE / "run_tests.py"} {package}"\n'
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


def _order(item: WorkItem) -> tuple[str, str, int]:
    m = item.mutations[0]
    return (str(m.module_path), m.operator_name, m.occurrence)


def sample(db: WorkDB, n: int, seed: int) -> list[str]:
    """Keep n mutants (deterministic for a given code and seed); mark the others skipped."""
    items = sorted(db.work_items, key=_order)
    keep = random.Random(seed).sample(items, min(n, len(items)))
    kept = {w.job_id for w in keep}
    skipped = WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not in the sample")
    db.set_multiple_results([w.job_id for w in items if w.job_id not in kept], skipped)
    return sorted(kept)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("package", choices=["experiment", "loadgen", "controller"])
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix=f"mutation-{args.package}-")) / "repo"
    scratch_copy(work)
    package_dir = work / "operator" / "specdecode" / args.package
    modules = sorted(
        str(p.relative_to(work))
        for p in package_dir.rglob("*.py")  # a subpackage's modules too (experiment/spec/)
        if p != package_dir / "__init__.py" and p.name not in EXCLUDED.get(args.package, [])
    )
    (work / "cosmic-ray.toml").write_text(config(args.package, modules))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work / "operator"), *sys.path[1:]])}
    cosmic = [sys.executable, "-m", "cosmic_ray.cli"]
    subprocess.run([*cosmic, "init", "cosmic-ray.toml", "session.sqlite"], cwd=work, env=env, check=True)
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        total = db.num_work_items
        kept = sample(db, args.n, args.seed)
    started = time.time()
    subprocess.run([*cosmic, "exec", "cosmic-ray.toml", "session.sqlite"], cwd=work, env=env, check=True)
    elapsed = time.time() - started

    run = report.from_session(work / "session.sqlite")
    result = {
        "seed": args.seed,
        "mutants_total": total,
        "sampled": len(kept),
        "excluded_modules": EXCLUDED.get(args.package, []),
        "elapsed_s": round(elapsed),
        **report.summarise(run),
        "mutants": run["mutants"],
    }
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "mutants"}))
    if not args.keep:
        shutil.rmtree(work.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
