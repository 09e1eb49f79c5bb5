"""deploy/grafana/specdecode.json read as Grafana would: every PromQL it runs, with the template
variables substituted (shared by the pure test here and the e2e test that runs them)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "specdecode.json"

#: Grafana's built-in interval variables, as it would pick them for a 1 s scrape interval.
BUILTINS = {"__rate_interval": "5s", "__interval": "1s"}


def load() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) of every panel target and every Prometheus annotation."""
    found = [
        (f"panel {panel['title']!r} target {target['refId']}", str(target["expr"]))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]
    found += [
        (f"annotation {a['name']!r}", str(a["expr"])) for a in dashboard["annotations"]["list"] if "expr" in a
    ]
    return found


def substitute(expr: str, variables: dict[str, str]) -> str:
    """`$name` and `${name}` replaced by the value (the built-in intervals included); unknown ones kept."""
    values = {**BUILTINS, **variables}

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)
