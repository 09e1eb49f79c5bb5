"""Shared fixtures."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import experiment_document


@pytest.fixture
def document() -> dict[str, Any]:
    return experiment_document()
