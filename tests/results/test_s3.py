"""The S3 results store against a real S3-compatible server (s3proxy, tests/s3_server.py), which checks
every request's SigV4 signature as S3 does: put, get, list, the size limit, and what each
misconfiguration (wrong keys, a missing bucket, an endpoint that does not answer) says to fix."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from specdecode import results
from specdecode.results import s3
from tests.results.test_packed import varied_run
from tests.s3_server import S3Server, running

BUCKET = "specdecode-results"
T = TypeVar("T")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running(tmp_path_factory.mktemp("s3")) as srv:
        srv.make_bucket(BUCKET)
        yield srv


def with_store(
    server: S3Server,
    use: Callable[[s3.Store], Awaitable[T]],
    *,
    bucket: str = BUCKET,
    secret: str | None = None,
    endpoint: str | None = None,
) -> T:
    """`use` a store of the test server (its own client, closed after)."""
    location = s3.Location(bucket, "runs", endpoint or server.endpoint)
    store = s3.Store(location, s3.Credentials(server.access_key, secret or server.secret_key), timeout=10.0)

    async def go() -> T:
        try:
            return await use(store)
        finally:
            await store.aclose()

    return asyncio.run(go())


def test_a_bundle_stored_and_read_back_parses_to_the_same_results(server: S3Server) -> None:
    _, files = varied_run()
    blob = results.encode_files(files)
    key = s3.object_key("team-a", "exp", 3, "exp-results", "uid-1", pod=(1, 2))

    async def use(store: s3.Store) -> tuple[str, bytes, dict[str, int]]:
        url = await store.put(store.location.key(key), blob)
        return (
            url,
            await store.get(store.location.key(key), max_bytes=len(blob)),
            await store.list("runs/team-a/"),
        )

    url, back, listed = with_store(server, use)
    assert (
        url == f"s3://{BUCKET}/runs/team-a/exp/generation-3/exp-results/job-uid-1/pod-1-of-2.results.v2.npz"
    )
    assert back == blob
    assert listed == {f"runs/{key}": len(blob)}
    assert len(results.parse(results.Bundle(back))[0]) == 244


def test_listing_follows_every_page_and_the_prefix(server: S3Server) -> None:
    async def use(store: s3.Store) -> dict[str, int]:
        for i in range(3):
            await store.put(f"paged/{i}", b"x" * (i + 1))
        await store.put("paged-not/0", b"y")
        return await store.list("paged/", page=2)

    assert with_store(server, use) == {"paged/0": 1, "paged/1": 2, "paged/2": 3}


def test_an_object_larger_than_the_limit_is_refused_while_it_is_read(server: S3Server) -> None:
    async def use(store: s3.Store) -> bytes:
        await store.put("big", b"z" * 4096)
        return await store.get("big", max_bytes=4095)

    with pytest.raises(results.ResultsTooLarge, match="SPECDECODE_RESULTS_MAX_BYTES"):
        with_store(server, use)


def test_an_object_read_back_is_held_once_not_copied(server: S3Server) -> None:
    """The operator reads an object of up to `max_bytes` (48 MiB by default): its body is hashed as
    it streams in and held once, not gathered into one buffer and then copied into another (2x
    the object at the end; benchmarks/README.md, "Results at scale", the S3 store)."""
    blob = random.Random(16).randbytes(8 * 2**20)  # incompressible, as an object at the limit is
    with_store(server, lambda store: store.put("held-once", blob))

    async def use(store: s3.Store) -> tuple[bytes, int]:
        tracemalloc.start()
        try:
            data = await store.get("held-once", max_bytes=len(blob))
            return data, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    back, peak = with_store(server, use)
    assert back == blob
    assert peak < 1.5 * len(blob), f"reading {len(blob)} bytes peaked at {peak} bytes allocated"


def test_a_missing_object_is_missing_results(server: S3Server) -> None:
    with pytest.raises(results.ResultsMissing, match=f"s3://{BUCKET}/nothing-here does not exist"):
        with_store(server, lambda store: store.get("nothing-here", max_bytes=100))


def test_an_object_rewritten_behind_the_uploader_does_not_hash_to_its_digest(server: S3Server) -> None:
    with_store(server, lambda store: store.put("tampered", b"measured"))
    (server.data / BUCKET / "tampered").write_bytes(b"invented")
    with pytest.raises(results.ResultsCorrupt, match="does not hash to the digest"):
        with_store(server, lambda store: store.get("tampered", max_bytes=100))


def test_wrong_credentials_are_refused_naming_the_secret(server: S3Server) -> None:
    with pytest.raises(
        s3.ResultsStoreError, match=r"refused the credentials to write .*resultsStore\.s3\.credentialsSecret"
    ):
        with_store(server, lambda store: store.put("k", b"v"), secret="not-the-secret")
    with pytest.raises(s3.ResultsStoreError, match="refused the credentials to list") as refused:
        with_store(server, lambda store: store.check(), secret="not-the-secret")
    assert not refused.value.transient  # failed at once: waiting does not fix a key


def test_a_missing_bucket_is_named_with_its_setting(server: S3Server) -> None:
    for use in (lambda store: store.check(), lambda store: store.put("k", b"v")):
        with pytest.raises(
            s3.ResultsStoreError, match=r"bucket 'no-such-bucket' does not exist .*resultsStore\.s3\.bucket"
        ):
            with_store(server, use, bucket="no-such-bucket")


def test_an_endpoint_that_does_not_answer_is_named_with_its_setting(server: S3Server) -> None:
    with pytest.raises(
        s3.ResultsStoreError, match=r"127\.0\.0\.1:9 is unreachable .*resultsStore\.s3\.endpoint"
    ) as unreachable:
        with_store(server, lambda store: store.check(), endpoint="http://127.0.0.1:9")
    assert unreachable.value.transient  # retried within the operator's analysis grace, as Prometheus is


def test_the_configuration_is_checked_before_any_request() -> None:
    with pytest.raises(
        s3.ResultsStoreError, match=r"'Bad_Bucket' is not an S3 bucket name.*resultsStore\.s3\.bucket"
    ):
        s3.Location("Bad_Bucket")
    with pytest.raises(s3.ResultsStoreError, match=r"not an http\(s\) URL: set AWS_ENDPOINT_URL"):
        s3.Location.from_url("s3://b-1/p", {"AWS_ENDPOINT_URL": "s3.example.com"})
    with pytest.raises(s3.ResultsStoreError, match="credentialsSecret"):
        s3.Credentials.from_env({"AWS_ACCESS_KEY_ID": "only-the-id"})
    assert s3.from_env({}) is None  # no bucket: the ConfigMaps store
    local = s3.Location.from_url("s3://my-bucket/runs/a", {"AWS_REGION": "eu-west-1"})
    assert (local.bucket, local.prefix, local.base) == (
        "my-bucket",
        "runs/a",
        "https://s3.eu-west-1.amazonaws.com",
    )


def test_signing_matches_the_example_of_aws_documentation() -> None:
    """AWS's "Signature Calculations ... (AWS Signature Version 4)", example GET Object."""
    headers = s3.sign(
        "GET",
        "https://examplebucket.s3.amazonaws.com/test.txt",
        {},
        {"range": "bytes=0-9", "x-amz-content-sha256": s3.EMPTY_SHA256},
        s3.Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        "us-east-1",
        now=dt.datetime(2013, 5, 24, tzinfo=dt.UTC),
    )
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


def test_the_fetch_script_names_where_the_jar_is() -> None:
    import subprocess

    from tests.s3_server import BUILD_SCRIPT

    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-path"], capture_output=True, text=True, check=True
    )
    assert Path(out.stdout.strip()).name == "s3proxy.jar"


def test_the_operator_reads_only_the_key_of_the_load_job_it_observed(server: S3Server) -> None:
    """`results.download` with a bucket: the object of this generation's load Job (by uid) and pod,
    nothing of another Job; no Job uid, nothing read at all."""
    location = s3.Location(BUCKET, "op", server.endpoint)
    env = server.env()
    blob = results.encode_files(varied_run()[1])
    key = location.key(s3.object_key("ns", "exp", 2, "exp-results", "job-a", (1, 2)))
    with_store(server, lambda store: store.put(key, blob))

    def download(job_uid: str | None, pod: tuple[int, int] = (1, 2)) -> results.Bundle:
        async def go() -> results.Bundle:
            return await results.download(
                None,  # type: ignore[arg-type]  # no ConfigMap is read with a bucket
                namespace="ns",
                experiment="exp",
                generation=2,
                job_uid=job_uid,
                pod=pod,
                store=location,
            )

        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            return asyncio.run(go())

    assert download("job-a").data == blob
    with pytest.raises(results.ResultsMissing, match=r"job-b/pod-1-of-2\.results\.v2\.npz does not exist"):
        download("job-b")
    with pytest.raises(results.ResultsMissing, match="pod-0-of-2"):
        download("job-a", (0, 2))
    with pytest.raises(results.ResultsUntrusted, match="the load Job exp-load is gone"):
        download(None)
    assert results.objects_url(location, {"namespace": "ns", "name": "exp", "generation": 2}) == (
        f"s3://{BUCKET}/op/ns/exp/generation-2/"
    )
    assert results.objects_url(None, {"namespace": "ns", "name": "exp"}) is None


def test_a_load_pod_refuses_to_start_when_the_bucket_cannot_take_its_results(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before the first request: a wrong bucket or key ends the load Job at once (the
    experiment LoadJobFailed, the log naming the value to fix), not after the whole measurement."""
    import yaml

    from specdecode import cli, exit_status
    from tests.factories import experiment_document

    experiment = tmp_path / "exp.yaml"
    experiment.write_text(yaml.safe_dump(experiment_document()))
    argv = ["loadgen", "--experiment", str(experiment), "--control-url", "http://127.0.0.1:9"]
    argv += [
        "--treatment-url",
        "http://127.0.0.1:9",
        "--out",
        str(tmp_path / "out"),
        "--results-configmap",
        "e-results",
    ]
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SPECDECODE_RESULTS_S3_ENDPOINT", server.endpoint)
    monkeypatch.setenv("SPECDECODE_RESULTS_S3_BUCKET", "no-such-bucket")
    assert cli.main(argv) == exit_status.INVALID
    assert "bucket 'no-such-bucket' does not exist" in capsys.readouterr().err
    monkeypatch.setenv("SPECDECODE_RESULTS_S3_BUCKET", BUCKET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    assert cli.main(argv) == exit_status.INVALID
    assert "refused the credentials to list" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing was sent
