"""The e2e tests run on their own control plane whatever $KUBECONFIG says; another cluster is an
explicit opt-in that refuses a production-looking context; in CI a skipped e2e test fails (#23)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from cluster_choice import E2E_FORCE, E2E_KUBECONFIG, RefusedClusterError, external_kubeconfig
from k8s_cluster import REPO_ROOT, Cluster


def kubeconfig(path: Path, context: str, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": context,
                "contexts": [{"name": context, "context": {"cluster": context, "user": "admin"}}],
                "clusters": [{"name": context, "cluster": {"server": server}}],
                "users": [{"name": "admin", "user": {"token": "not-a-real-token"}}],
            }
        )
    )
    return path


@pytest.fixture
def prod(tmp_path: Path) -> Path:
    """A production cluster's kubeconfig (unreachable: the name does not resolve)."""
    return kubeconfig(tmp_path / "prod.yaml", "prod-eu-west", "https://api.prod.example.invalid:6443")


def test_kubeconfig_alone_never_selects_a_cluster(prod: Path) -> None:
    assert external_kubeconfig({"KUBECONFIG": str(prod)}) is None


def test_a_production_looking_context_is_refused_unless_forced(prod: Path) -> None:
    with pytest.raises(RefusedClusterError, match=f"'prod-eu-west'.*{E2E_FORCE}=1"):
        external_kubeconfig({E2E_KUBECONFIG: str(prod)})
    with pytest.raises(RefusedClusterError):
        external_kubeconfig({E2E_KUBECONFIG: str(prod), E2E_FORCE: "true"})  # only "1" forces
    assert external_kubeconfig({E2E_KUBECONFIG: str(prod), E2E_FORCE: "1"}) == prod


@pytest.mark.parametrize(
    ("context", "server"),
    [
        ("kind-kind", "https://172.18.0.2:6443"),
        ("minikube", "https://192.168.49.2:8443"),
        ("team-e2e", "https://api.cluster.example.com"),
        ("anything", "https://127.0.0.1:40123"),
        ("anything", "https://localhost:6443"),
        ("anything", "https://[::1]:6443"),
    ],
)
def test_a_test_looking_context_is_accepted(tmp_path: Path, context: str, server: str) -> None:
    path = kubeconfig(tmp_path / "config", context, server)
    assert external_kubeconfig({E2E_KUBECONFIG: str(path)}) == path


def test_the_session_runs_on_its_own_control_plane(cluster: Cluster) -> None:
    """Run by itself below with a production $KUBECONFIG (and by `make test`, without one)."""
    if os.environ.get(E2E_KUBECONFIG):
        assert not cluster.builtin
        return
    assert cluster.builtin and cluster.api_url.startswith("https://127.0.0.1:"), cluster
    assert os.environ["KUBECONFIG"] != str(cluster.kubeconfig)
    assert "clusters: []" in Path(os.environ["KUBECONFIG"]).read_text()  # tests/conftest.py's empty one
    assert cluster.get_json("namespace/kube-system")["metadata"]["name"] == "kube-system"


def pytest_session(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", E2E_KUBECONFIG, E2E_FORCE)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "-rs", *args],
        cwd=tmp_path,
        env={**environ, "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_production_kubeconfig_in_the_environment_still_gets_the_built_in_control_plane(
    prod: Path, tmp_path: Path
) -> None:
    here = Path(__file__)
    res = pytest_session(
        tmp_path,
        f"--rootdir={REPO_ROOT}",
        f"{here}::test_the_session_runs_on_its_own_control_plane",
        KUBECONFIG=str(prod),
        CI="true",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed" in res.stdout and "skipped" not in res.stdout, res.stdout


SKIPPING = """
import pytest

def test_needs_a_gpu_node():
    pytest.skip("no node labelled nvidia.com/gpu.product")
"""
CONFTEST = """
from tests import e2e_skips

def pytest_configure(config):
    e2e_skips.register(config)
"""


@pytest.mark.parametrize(("ci", "where", "code"), [("true", "e2e", 1), ("", "e2e", 0), ("true", "unit", 0)])
def test_a_skipped_e2e_test_fails_the_run_in_ci_only(tmp_path: Path, ci: str, where: str, code: int) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / where).mkdir()
    (tmp_path / where / "test_skipping.py").write_text(textwrap.dedent(SKIPPING))
    res = pytest_session(tmp_path, f"--rootdir={tmp_path}", where, CI=ci)
    assert res.returncode == code, res.stdout + res.stderr
    assert "1 skipped" in res.stdout
    if code:
        assert f"SKIPPED IN CI {where}/test_skipping.py::test_needs_a_gpu_node" in res.stdout, res.stdout
