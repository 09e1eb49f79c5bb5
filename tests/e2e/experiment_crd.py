"""The SpecDecodeExperiment CRD and an example experiment, as the e2e tests install them."""

from __future__ import annotations

from k8s_cluster import REPO_ROOT

CRD_FILE = REPO_ROOT / "crds" / "specdecodeexperiments.specdecode.io.yaml"
CRD_NAME = "specdecodeexperiments.specdecode.io"
EXAMPLE = REPO_ROOT / "examples" / "ngram.yaml"
