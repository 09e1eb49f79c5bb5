"""Where the SpecDecodeExperiment CRD comes from in e2e tests: the generated file, else a placeholder."""

from __future__ import annotations

from pathlib import Path

from k8s_cluster import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures"
REAL_CRD = REPO_ROOT / "crds" / "specdecodeexperiments.specdecode.io.yaml"
PLACEHOLDER_CRD = FIXTURES / "placeholder-crd.yaml"
CRD_NAME = "specdecodeexperiments.specdecode.io"


def crd_file() -> Path:
    return REAL_CRD if REAL_CRD.exists() else PLACEHOLDER_CRD
