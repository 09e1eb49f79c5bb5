"""A user's references go somewhere: every relative link in the docs names a file of the repository, and
the CLI's help cites no document a user does not have (issue 21, item 7)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "benchmarks").rglob("*.md")),
    ROOT / "tests" / "e2e" / "README.md",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_of_the_repository(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the page
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    assert broken == [], f"{doc.relative_to(ROOT)} links outside the repository or to nothing: {broken}"


@pytest.mark.parametrize("command", [[], ["sim"], ["run"], ["validate"]], ids=lambda c: " ".join(c) or "top")
def test_the_help_cites_no_internal_design_document(command: list[str]) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "specdecode", *command, "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "design.md" not in shown and "shared/" not in shown, shown
