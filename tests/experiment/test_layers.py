"""The pure core stays pure: import-linter's contracts from pyproject.toml, run as a test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.factories import ROOT


def test_import_contracts_hold() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is not installed: run `make test`"
    result = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken" in result.stdout
