"""`specdecode run --local --results-store s3://bucket/prefix` (issue 16): the run's bundle and
result.json also go to an S3 bucket (a real s3proxy, tests/s3_server.py), the server and keys from the
standard AWS variables; a bucket that is wrong is refused before any arm starts."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdecode import exit_status, results
from specdecode.results import s3
from tests.local.test_run_local import write_experiment
from tests.s3_server import S3Server, running

BUCKET = "local-runs"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running(tmp_path_factory.mktemp("s3")) as srv:
        srv.make_bucket(BUCKET)
        yield srv


def run_local(env: dict[str, str], path: Path, out: Path, store: str) -> subprocess.CompletedProcess[str]:
    """`specdecode run --local --results-store` in a process of its own, with only `env`'s AWS variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    argv = ["run", str(path), "--local", "--out", str(out), "--quiet", "--results-store", store]
    return subprocess.run(
        [sys.executable, "-m", "specdecode", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, **env},
    )


def test_a_local_run_stores_its_bundle_and_result_in_the_bucket(server: S3Server, tmp_path: Path) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20)
    out = tmp_path / "out"
    done = run_local(server.env(), path, out, f"s3://{BUCKET}/team-a")
    assert done.returncode in (exit_status.OK, exit_status.REJECTED), done.stderr
    store = s3.Store(
        s3.Location(BUCKET, endpoint=server.endpoint), s3.Credentials(server.access_key, server.secret_key)
    )

    async def read() -> tuple[dict[str, int], bytes, bytes]:
        try:
            listed = await store.list("team-a/experiment/")
            (bundle,) = [k for k in listed if k.endswith("/results.v2.npz")]
            (result,) = [k for k in listed if k.endswith("/result.json")]
            return (
                listed,
                await store.get(bundle, max_bytes=1 << 26),
                await store.get(result, max_bytes=1 << 26),
            )
        finally:
            await store.aclose()

    listed, bundle, result = asyncio.run(read())
    assert len(listed) == 2, listed
    assert bundle == (out / "results.v2.npz").read_bytes()
    assert json.loads(result) == json.loads((out / "result.json").read_text())
    assert len(results.parse(results.Bundle(bundle))[0]) >= 2 * 20  # both arms
    assert f"stored the results in s3://{BUCKET}/team-a/experiment/" in done.stderr


def test_a_missing_bucket_or_refused_keys_stop_the_run_before_any_arm(
    server: S3Server, tmp_path: Path
) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20)
    out = tmp_path / "out"
    missing = run_local(server.env(), path, out, "s3://no-such-bucket/x")
    assert missing.returncode == exit_status.INVALID, missing.stderr
    assert "bucket 'no-such-bucket' does not exist" in missing.stderr
    assert "--results-store s3://<bucket>/<prefix>" in missing.stderr
    wrong = run_local(server.env(AWS_SECRET_ACCESS_KEY="wrong"), path, out, f"s3://{BUCKET}/x")
    assert wrong.returncode == exit_status.INVALID, wrong.stderr
    assert (
        "refused the credentials" in wrong.stderr
        and "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in wrong.stderr
    )
    assert "Traceback" not in missing.stderr + wrong.stderr
    assert not out.exists()  # nothing ran


def test_an_upload_that_fails_after_the_run_exits_3_and_keeps_the_local_files(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bucket checked at the start can be gone at the end: one line, exit 3 ("could not write the
    results"), and what was measured stays in the directory."""
    from specdecode import cli

    out = tmp_path / "out"
    out.mkdir()
    (out / "result.json").write_text('{"phase": "Completed"}')
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    gone = s3.Location.from_url("s3://bucket-removed-meanwhile/x", server.env())
    assert cli._store_run(gone, out, "experiment") == exit_status.FAILED
    err = capsys.readouterr().err
    assert f"the results are in {out}, but not in the bucket" in err
    assert "bucket 'bucket-removed-meanwhile' does not exist" in err
    assert (out / "result.json").read_text() == '{"phase": "Completed"}'
