"""Fixtures for the chart tests: the helm binary and a renderer.

helm is the one `hack/build-k8s-bins.sh` builds beside the test cluster's binaries
($SPECDECODE_K8S_BIN_DIR if set, else the directory that script prints). A missing helm fails the
tests with what to run; it never skips them, and the helm on PATH is never used (one version).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "specdecode-operator"
BUILD_SCRIPT = ROOT / "hack" / "build-k8s-bins.sh"

Render = Callable[..., list[dict[str, Any]]]


def k8s_bin_dir() -> Path:
    """Where the test binaries are (builds nothing)."""
    if env := os.environ.get("SPECDECODE_K8S_BIN_DIR"):
        return Path(env)
    if not BUILD_SCRIPT.is_file():
        pytest.fail(f"{BUILD_SCRIPT} is missing and SPECDECODE_K8S_BIN_DIR is not set", pytrace=False)
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def helm() -> Path:
    path = k8s_bin_dir() / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm missing at {path}: run `make k8s-bins` (hack/build-k8s-bins.sh)", pytrace=False)
    return path


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs helm with no user config (no repositories, plugins or cache from $HOME)."""
    env = {**os.environ, "HELM_CONFIG_HOME": "/nonexistent", "HELM_CACHE_HOME": "/nonexistent"}
    return subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture(scope="session")
def render(helm: Path) -> Render:
    """`render("--set", "a=b", ...)`: the chart's manifests (release `sdx`, namespace `ops`) as dicts."""

    def _render(*args: str) -> list[dict[str, Any]]:
        res = run_helm(helm, "template", "sdx", str(CHART), "--namespace", "ops", *args)
        assert res.returncode == 0, res.stderr
        return [doc for doc in yaml.safe_load_all(res.stdout) if doc]

    return _render
