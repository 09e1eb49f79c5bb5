"""`specdecode operator`: run the kopf operator with the project's handlers."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import kopf


def run(
    *,
    namespaces: Sequence[str],
    standalone: bool,
    liveness: str | None,
    metrics_port: int | None,
    log_format: str,
    verbose: bool,
) -> None:
    """Block until the operator is stopped (SIGTERM/SIGINT)."""
    from specdecode.controller import handlers  # noqa: F401  (registers the handlers)

    kopf.configure(
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    memo = kopf.Memo(metrics_port=metrics_port)
    kopf.run(
        standalone=standalone,
        namespaces=list(namespaces),
        clusterwide=not namespaces,
        liveness_endpoint=liveness,
        memo=memo,
    )
