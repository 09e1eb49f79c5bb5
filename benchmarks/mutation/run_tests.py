"""cosmic-ray's test command for one mutant (benchmarks/mutation/sample.py).

Runs, with `pytest -x`, the package's fast tests that name the mutated module (a word match on its
stem in the test file; all of the package's fast tests when none does). The scratch copy is a git
repository of HEAD, so the mutated module is the one file `git diff` names. Exit 0: the mutant
survived.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

#: the fast tests of each package (the slow real-server timing tests of loadgen are left out: ~1 min each)
FAST = {
    "experiment": ["tests/experiment"],
    "loadgen": [
        "tests/loadgen/test_units.py",
        "tests/loadgen/test_error_classes.py",
        "tests/loadgen/test_trace.py",
        "tests/loadgen/test_pacing.py",
        "tests/loadgen/test_wire.py",
        "tests/loadgen/test_sessions.py",
        "tests/loadgen/test_datasets.py",
    ],
    "controller": ["tests/controller"],
}


def test_files(package: str) -> list[Path]:
    files: list[Path] = []
    for entry in map(Path, FAST[package]):
        files.extend(sorted(entry.glob("test_*.py")) if entry.is_dir() else [entry])
    return files


def main(package: str) -> int:
    changed = subprocess.run(
        ["git", "diff", "--name-only"], capture_output=True, text=True, check=True
    ).stdout.split()
    # a subpackage's module (experiment/spec/engine.py) is named in tests by the subpackage too (`spec.`)
    stems = {Path(c).stem for c in changed if c.endswith(".py")} - {"__init__"}
    stems |= {Path(c).parent.name for c in changed if c.endswith(".py") and Path(c).parent.name != package}
    files = test_files(package)
    chosen = [f for f in files if any(re.search(rf"\b{re.escape(s)}\b", f.read_text()) for s in stems)]
    args = [str(f) for f in (chosen or files)]
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *args]
    # only the scratch copy's package on the path (not cosmic-ray's own libraries, if installed apart)
    env = {**os.environ, "PYTHONPATH": str(Path.cwd() / "operator")}
    rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    return 0 if rc == 0 else 1  # 1: killed (a failure, an error or a mutant that does not import)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
