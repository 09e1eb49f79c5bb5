"""Every failure to write results is one clear line and exit 3 (issue #21 item 3), never a traceback
and exit 1 (which `--fail-on-reject` would read as "measured, not promoted")."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdecode import exit_status
from tests.local.test_run_local import write_experiment


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A real directory nobody may write to: mode 0555, or, for root (who ignores mode bits),
    /proc, which refuses new entries to everyone."""
    if os.geteuid() == 0:
        yield Path("/proc")
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        yield locked
    finally:
        locked.chmod(stat.S_IRWXU)


def specdecode(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specdecode", *argv], capture_output=True, text=True, timeout=120
    )


def test_run_with_out_in_an_unwritable_directory_exits_3_with_one_line(
    tmp_path: Path, unwritable_dir: Path
) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20)
    out = unwritable_dir / "specdecode-out"
    done = specdecode("run", str(path), "--local", "--out", str(out), "--quiet", "--fail-on-reject")
    assert done.returncode == exit_status.FAILED, done.stderr
    assert "Traceback" not in done.stderr
    assert f"cannot write the results to {out}" in done.stderr
    assert not out.exists()


def test_run_with_out_under_a_file_exits_3_before_starting_an_arm(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    out = a_file / "out"
    done = specdecode("run", str(path), "--local", "--out", str(out), "--quiet")
    assert done.returncode == exit_status.FAILED, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"specdecode run: cannot write the results to {out}: Not a directory; "
        "choose a writable directory (--out DIR)"
    ]


def test_report_of_a_directory_where_report_html_cannot_be_written_exits_3(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20)
    out = tmp_path / "out"
    assert specdecode("run", str(path), "--local", "--out", str(out), "--quiet").returncode == 0
    (out / "report.html").unlink()
    (out / "report.html").mkdir()  # a directory in its place: writing the file fails, also for root
    done = specdecode("report", str(out))
    assert done.returncode == exit_status.FAILED, done.stderr
    assert "Traceback" not in done.stderr
    assert f"cannot write the results to {out / 'report.html'}" in done.stderr


def test_loadgen_with_out_under_a_file_exits_3(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    done = specdecode(
        "loadgen",
        "--experiment",
        str(path),
        "--control-url",
        "http://127.0.0.1:9",
        "--treatment-url",
        "http://127.0.0.1:9",
        "--out",
        str(a_file / "out"),
        "--quiet",
    )
    assert done.returncode == exit_status.FAILED, done.stderr
    assert "Traceback" not in done.stderr
    assert "cannot write the results to" in done.stderr and "Not a directory" in done.stderr
