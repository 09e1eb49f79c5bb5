"""Exit statuses of every `specdecode` command (design.md, CLI contract): one definition for all.

A failure to write results (`--out DIR` under a file, a directory nobody may write, a full disk) is
`ResultsUnwritable`: one line naming the path and the cause, and exit `FAILED` (3), never a traceback
and exit 1, which `--fail-on-reject` would read as "measured, not promoted".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

OK = 0
"""Done (`run --local`: any verdict, unless `--fail-on-reject`)."""
REJECTED = 1
"""`run --local --fail-on-reject`: the verdict is not Promote."""
INVALID = 2
"""Invalid input (experiment file, dataset, URL, flags)."""
FAILED = 3
"""Could not measure (an arm died, no request succeeded), or could not write the results."""
INTERRUPTED = 130
"""Interrupted (Ctrl-C)."""


class ResultsUnwritable(Exception):
    """The results cannot be written where they were asked for (exit `FAILED`); the cause is chained."""

    reason = "ResultsUnwritable"

    def __init__(self, path: Path, cause: OSError) -> None:
        why = cause.strerror or str(cause)
        where = f" ({cause.filename})" if cause.filename and str(cause.filename) != str(path) else ""
        super().__init__(
            f"cannot write the results to {path}: {why}{where}; choose a writable directory (--out DIR)"
        )
        self.path = path


@contextlib.contextmanager
def writing_results(path: Path) -> Iterator[None]:
    """Turn an `OSError` of the writes inside into `ResultsUnwritable(path)` (wrap only file writes:
    a refused connection is an `OSError` too, and no results problem)."""
    try:
        yield
    except OSError as exc:
        raise ResultsUnwritable(path, exc) from exc


def prepare_results_directory(path: Path) -> None:
    """Create `path` and prove it writable before anything is measured (`ResultsUnwritable` if not):
    a run that finds out at the end has spent its measurement. Root ignores permission bits, so
    the proof is a file actually written and removed."""
    with writing_results(path):
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".specdecode-write-test"
        probe.write_bytes(b"")
        probe.unlink()
