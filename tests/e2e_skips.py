"""In CI (`CI=true`) a skipped e2e test fails the run (#23).

The e2e tests are the only ones that run the operator's handlers against a real API server; a CI
run where they skip (a cluster without GPU nodes, without Prometheus credentials) would be green
while testing none of that. Outside CI a skip stays a skip, printed by `-ra`.
Registered by tests/conftest.py (`register`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def is_e2e(nodeid: str) -> bool:
    return "e2e" in Path(nodeid.split("::", 1)[0]).parts


class SkippedE2E:
    """Collects skipped e2e tests; in CI turns the session's exit status into a failure."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail") and is_e2e(report.nodeid):
            longrepr = report.longrepr
            why = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
            self.skipped.append((report.nodeid, why))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if in_ci() and self.skipped and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if in_ci() and self.skipped:
            terminalreporter.write_sep(
                "=", f"{len(self.skipped)} e2e test(s) skipped in CI: a failure", red=True
            )
            for nodeid, why in self.skipped:
                terminalreporter.write_line(f"SKIPPED IN CI {nodeid}: {why}")


def register(config: pytest.Config) -> None:
    config.pluginmanager.register(SkippedE2E(), "specdecode-skipped-e2e")
