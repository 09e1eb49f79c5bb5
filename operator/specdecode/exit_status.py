"""Exit statuses of every `specdecode` command (design.md, CLI contract): one definition for all."""

from __future__ import annotations

OK = 0
"""Done (`run --local`: any verdict, unless `--fail-on-reject`)."""
REJECTED = 1
"""`run --local --fail-on-reject`: the verdict is not Promote."""
INVALID = 2
"""Invalid input (experiment file, dataset, URL, flags)."""
FAILED = 3
"""Could not measure (an arm died, no request succeeded)."""
INTERRUPTED = 130
"""Interrupted (Ctrl-C)."""
