"""Which cluster the e2e tests use: their own control plane, unless one is named explicitly (#23).

`KUBECONFIG` is ignored: a developer's or CI runner's shell often has it set, and the tests then
skipped every operator test and created namespaces (and force-applied the CRD) in that cluster.
Running against an existing cluster is an opt-in, `SPECDECODE_E2E_KUBECONFIG=<file>`, and only for a
current context that looks like a test cluster (a loopback API server, or a context, cluster or
server name saying kind, minikube, k3d, test, e2e, ci, dev, ...); `SPECDECODE_E2E_FORCE=1` takes
any other one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

#: the kubeconfig whose current context the e2e tests use instead of starting a control plane
E2E_KUBECONFIG = "SPECDECODE_E2E_KUBECONFIG"
#: "1": use it even when its context does not look like a test cluster
E2E_FORCE = "SPECDECODE_E2E_FORCE"

_TEST_WORDS = re.compile(
    r"(?:^|[^a-z0-9])(?:kind|minikube|k3d|k3s|microk8s|docker-desktop|rancher-desktop|colima|envtest|"
    r"kwok|test|testing|e2e|ci|dev|sandbox|scratch)(?:[^a-z0-9]|$)",
    re.IGNORECASE,
)


class RefusedClusterError(RuntimeError):
    """The named cluster does not look like one that tests may write to."""


def current_context(kubeconfig: Path) -> tuple[str, str, str]:
    """(context name, cluster name, API server URL) of the kubeconfig's current context."""
    cfg: dict[str, Any] = yaml.safe_load(kubeconfig.read_text()) or {}
    name = str(cfg.get("current-context") or "")
    ctx = next((c.get("context") or {} for c in cfg.get("contexts") or [] if c.get("name") == name), {})
    cluster = str(ctx.get("cluster") or "")
    server = next(
        (
            str((c.get("cluster") or {}).get("server") or "")
            for c in cfg.get("clusters") or []
            if c.get("name") == cluster
        ),
        "",
    )
    return name, cluster, server


def looks_like_a_test_cluster(context: str, cluster: str, server: str) -> bool:
    host = urlsplit(server).hostname or ""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        if host == "localhost":
            return True
    return any(_TEST_WORDS.search(text) for text in (context, cluster, host))


def external_kubeconfig(environ: Mapping[str, str]) -> Path | None:
    """The kubeconfig the e2e tests should use, or None for their own control plane.

    Raises `RefusedClusterError` for a context that does not look like a test cluster (unless forced).
    """
    named = environ.get(E2E_KUBECONFIG, "")
    if not named:
        return None
    path = Path(named)
    context, cluster, server = current_context(path)
    if environ.get(E2E_FORCE) != "1" and not looks_like_a_test_cluster(context, cluster, server):
        raise RefusedClusterError(
            f"{E2E_KUBECONFIG}={path}: its current context {context!r} (cluster {cluster!r}, server "
            f"{server or '?'}) does not look like a test cluster, and the e2e tests create namespaces and "
            f"apply the CRD there; set {E2E_FORCE}=1 to use it anyway, or unset {E2E_KUBECONFIG} to "
            "start a control plane"
        )
    return path
