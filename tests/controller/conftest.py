"""Fixtures of the controller tests."""

from __future__ import annotations

from typing import Any

import kopf
import pytest


@pytest.fixture
def operator_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(reason, message) of every Event the handlers post (instead of posting to an API server)."""
    posted: list[tuple[str, str]] = []

    def event(body: Any, *, type: str, reason: str, message: str = "") -> None:
        posted.append((reason, message))

    monkeypatch.setattr(kopf, "event", event)
    return posted
