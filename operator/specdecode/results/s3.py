"""The S3 store (optional): each load pod's bundle as one object in an S3-compatible bucket.

ConfigMaps stay the default. Where results outgrow them (`limits.check_size`) a platform team points
the operator at a bucket (chart values `resultsStore.s3`); the load pods then upload their bundle as
one object each and the operator reads it back, bounded as from ConfigMaps (`Limits.max_bytes`).

The client is AWS Signature Version 4 over httpx (already a dependency), not boto3: ~150 lines
against 35 MB installed (boto3 1.44.8, botocore, s3transfer, jmespath, dateutil) in the operator and
load images, and 40.7 MiB more RSS for one boto3 S3 client (a `Store`: 2.7 MiB) in an operator whose
budget is 300 MiB (benchmarks/README.md, "The S3 client"). What that costs: credentials are static keys only
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`, from the environment or
the chart's `credentialsSecret`); boto3's credential chain (IRSA web identity, instance profiles,
SSO) is not followed. Requests are path-style (`<endpoint>/<bucket>/<key>`), which S3-compatible
servers and AWS both answer.

What the operator trusts: the object of exactly the key it computes (`object_key`: namespace,
experiment, generation, the load Job's uid it observed, round and pod), whose bytes hash to the digest
the uploader stored with it (`x-amz-meta-bundle-digest`). Anyone who may write that key in the bucket
can forge results, as anyone who may edit ConfigMaps in the namespace can: the verdict is as
trustworthy as the bucket's writers.

Errors name the setting to fix (`Settings`): a bucket that does not exist, credentials the server
refuses, an endpoint that does not answer; each is a `ResultsStoreError` (status reason
`ResultsStoreFailed`), a missing object `ResultsMissing`, an object over the limit `ResultsTooLarge`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import io
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from specdecode.results.format import DATA_KEY, Bundle, encode_dir
from specdecode.results.limits import (
    Limits,
    ResultsCorrupt,
    ResultsError,
    ResultsMissing,
    ResultsTooLarge,
    mib,
)

SCHEME = "s3://"
DIGEST_HEADER = "x-amz-meta-bundle-digest"
"""The sha256 of the object, stored with it by the uploader and checked by the reader."""
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# What an error answer of S3 is read to at most (its XML names the error code).
ERROR_BYTES = 64 * 1024
# A listing page (1,000 keys at most, ~300 bytes each).
LIST_BYTES = 1024 * 1024


class ResultsStoreError(ResultsError):
    """The object store cannot be used as configured (bucket, credentials, endpoint)."""

    reason = "ResultsStoreFailed"

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class Settings:
    """Where each part of the configuration comes from, as the errors name it."""

    endpoint: str = "resultsStore.s3.endpoint"
    bucket: str = "resultsStore.s3.bucket"
    region: str = "resultsStore.s3.region"
    credentials: str = "resultsStore.s3.credentialsSecret"


CHART = Settings()
"""The operator and the load Job: configured by the chart's values."""
LOCAL = Settings(
    endpoint="AWS_ENDPOINT_URL",
    bucket="--results-store s3://<bucket>/<prefix>",
    region="AWS_REGION",
    credentials="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
)
"""`specdecode run --local --results-store`: the standard AWS environment variables."""


@dataclass(frozen=True)
class Credentials:
    """Static AWS keys (see the module docstring for what is not followed)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], settings: Settings = CHART) -> Credentials:
        key, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
        if not key or not secret:
            raise ResultsStoreError(
                "the S3 results store has no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                f"are not both set; set {settings.credentials}"
            )
        return cls(key, secret, env.get("AWS_SESSION_TOKEN") or None)


@dataclass(frozen=True)
class Location:
    """A bucket, a key prefix in it, and the server that holds it."""

    bucket: str
    prefix: str = ""
    endpoint: str = ""
    """The server's base URL; empty: AWS's regional endpoint."""
    region: str = "us-east-1"
    settings: Settings = CHART

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", self.bucket):
            raise ResultsStoreError(
                f"{self.bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, dots and "
                f"hyphens): set {self.settings.bucket}"
            )
        if self.endpoint and urlsplit(self.endpoint).scheme not in ("http", "https"):
            raise ResultsStoreError(
                f"{self.endpoint!r} is not an http(s) URL: set {self.settings.endpoint} to e.g. "
                "https://s3.example.com:9000"
            )

    @classmethod
    def from_url(cls, url: str, env: Mapping[str, str], settings: Settings = LOCAL) -> Location:
        """`s3://bucket/prefix`, the server from `AWS_ENDPOINT_URL` (empty: AWS) in `AWS_REGION`."""
        if not url.startswith(SCHEME):
            raise ResultsStoreError(f"{url!r} is not an s3://<bucket>/<prefix> URL ({settings.bucket})")
        bucket, _, prefix = url[len(SCHEME) :].partition("/")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        return cls(bucket, prefix, env.get("AWS_ENDPOINT_URL", ""), region, settings)

    @property
    def base(self) -> str:
        return (self.endpoint or f"https://s3.{self.region}.amazonaws.com").rstrip("/")

    def key(self, *names: str) -> str:
        """The object key of `names` under the prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, *names) if p.strip("/"))

    def url(self, key: str) -> str:
        """`s3://bucket/key`, as the status and the logs name an object."""
        return f"{SCHEME}{self.bucket}/{key}"


def generation_prefix(namespace: str, experiment: str, generation: int) -> str:
    """The key prefix of every bundle of one generation of an experiment (`status.resultsRef.objects`)."""
    return f"{namespace}/{experiment}/generation-{generation}/"


def object_key(
    namespace: str,
    experiment: str,
    generation: int,
    prefix: str,
    job_uid: str,
    pod: tuple[int, int] | None = None,
) -> str:
    """Where load Job `job_uid` stores the bundle of load pod `pod` (k, N; None: its only pod) for a
    generation, under the location's prefix: `prefix` is the Job's ConfigMap prefix (`<exp>-results`,
    a round's `<exp>-results-<round>`). The operator computes it; nothing else is read."""
    k, n = pod if pod is not None else (0, 1)
    return f"{generation_prefix(namespace, experiment, generation)}{prefix}/job-{job_uid}/pod-{k}-of-{n}.{DATA_KEY}"


class Store:
    """Objects of one location, through SigV4-signed requests (one client per store)."""

    def __init__(self, location: Location, credentials: Credentials, *, timeout: float = 30.0) -> None:
        self.location = location
        self._credentials = credentials
        self._client = httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def put(self, key: str, data: bytes) -> str:
        """Store `data` under `key`; returns its s3:// URL."""
        sha = hashlib.sha256(data).hexdigest()
        async with self._request(
            "PUT", key, body=data, sha=sha, headers={DIGEST_HEADER: f"sha256:{sha}"}
        ) as r:
            await self._raise_for(r, "write", key)
        return self.location.url(key)

    async def get(self, key: str, *, max_bytes: int) -> bytes:
        """The object under `key`, read to at most `max_bytes` (more: ResultsTooLarge), checked against
        the digest its uploader stored with it.

        The body is held once: each chunk is hashed as it comes and written to a `BytesIO`, whose
        `getvalue()` hands over its buffer rather than copying it (a `bytearray` then `bytes(...)`
        held the object twice at the end: 2x an object of up to `max_bytes` in the operator; the
        tracemalloc test in tests/results/test_s3.py)."""
        async with self._request("GET", key) as r:
            if r.status_code == 404 and _code(await _head_of(r)) == "NoSuchKey":
                raise ResultsMissing(
                    f"{self.location.url(key)} does not exist: the load Job stored no results there"
                )
            await self._raise_for(r, "read", key)
            size = int(r.headers.get("content-length") or 0)
            if size > max_bytes:
                raise _too_large(self.location.url(key), size, max_bytes)
            body, sha = io.BytesIO(), hashlib.sha256()
            async for chunk in r.aiter_bytes():
                if body.tell() + len(chunk) > max_bytes:
                    raise _too_large(self.location.url(key), body.tell() + len(chunk), max_bytes)
                body.write(chunk)
                sha.update(chunk)
            expected = r.headers.get(DIGEST_HEADER)
        if expected != f"sha256:{sha.hexdigest()}":
            raise ResultsCorrupt(
                f"{self.location.url(key)} does not hash to the digest its uploader stored with it "
                f"({DIGEST_HEADER}: {expected}): truncated, or rewritten by someone else"
            )
        return body.getvalue()

    async def list(self, prefix: str = "", *, page: int = 1000) -> dict[str, int]:
        """Key -> size of the objects under `prefix` (every page; folder markers left out)."""
        out: dict[str, int] = {}
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix, "max-keys": str(page)}
            if token:
                query["continuation-token"] = token
            async with self._request("GET", "", query=query) as r:
                await self._raise_for(r, "list", prefix)
                body = await _read(r, LIST_BYTES)
            listed = _listing(body)
            out.update(listed.objects)
            if listed.next_token is None:
                return out
            token = listed.next_token

    async def check(self) -> None:
        """Reach the bucket with these credentials (a listing of one key), or say which setting is wrong."""
        async with self._request("GET", "", query={"list-type": "2", "max-keys": "1"}) as r:
            await self._raise_for(r, "list", "")

    def _request(
        self,
        method: str,
        key: str,
        *,
        query: Mapping[str, str] | None = None,
        body: bytes = b"",
        sha: str = EMPTY_SHA256,
        headers: Mapping[str, str] | None = None,
    ) -> _Streamed:
        loc = self.location
        path = "/" + quote(loc.bucket) + ("/" + quote(key, safe="/-_.~") if key else "")
        signed = sign(
            method,
            loc.base + path,
            query or {},
            {**(headers or {}), "x-amz-content-sha256": sha},
            self._credentials,
            loc.region,
        )
        return _Streamed(
            self._client.stream(
                method, loc.base + path, params=dict(query or {}), content=body, headers=signed
            ),
            loc,
        )

    async def _raise_for(self, r: httpx.Response, action: str, key: str) -> None:
        if r.status_code < 300:
            return
        body = await _head_of(r)
        code, loc = _code(body), self.location
        where = loc.url(key) if key else f"{SCHEME}{loc.bucket}"
        if code == "NoSuchBucket" or (r.status_code == 404 and not key):
            raise ResultsStoreError(
                f"the S3 results bucket {loc.bucket!r} does not exist at {loc.base}: create it, or set "
                f"{loc.settings.bucket} to one that does"
            )
        if r.status_code == 403 or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
            raise ResultsStoreError(
                f"the S3 results store refused the credentials to {action} {where} ({code or r.status_code}): "
                f"check the keys in {loc.settings.credentials}, and that they may {action} there"
            )
        message = re.search(rb"<Message>([^<]{1,300})</Message>", body)
        said = f": {message.group(1).decode(errors='replace')}" if message else ""
        raise ResultsStoreError(
            f"the S3 results store at {loc.base} ({loc.settings.endpoint}) answered HTTP {r.status_code} "
            f"{code or ''} to {action} {where}{said}",
            transient=r.status_code >= 500,  # SlowDown, InternalError, ServiceUnavailable: retried
        )


class _Streamed:
    """`client.stream(...)` whose connection errors name the endpoint setting."""

    def __init__(self, inner: Any, location: Location) -> None:
        self._inner, self._location = inner, location

    async def __aenter__(self) -> httpx.Response:
        try:
            response: httpx.Response = await self._inner.__aenter__()
        except httpx.HTTPError as exc:
            raise _unreachable(self._location, exc) from None
        return response

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.__aexit__(*exc)


def _unreachable(loc: Location, exc: Exception) -> ResultsStoreError:
    return ResultsStoreError(
        f"the S3 results store at {loc.base} is unreachable ({type(exc).__name__}: {exc}): check "
        f"{loc.settings.endpoint}, and that this pod's network reaches it",
        transient=True,
    )


def _too_large(url: str, size: int, max_bytes: int) -> ResultsTooLarge:
    return ResultsTooLarge(
        f"{url} holds {mib(size)} or more, more than the {mib(max_bytes)} the operator reads "
        "(SPECDECODE_RESULTS_MAX_BYTES); lower spec.workload.requestsPerStage or the number of stages, "
        "or raise that limit with the operator's memory"
    )


async def _read(r: httpx.Response, limit: int) -> bytes:
    data = bytearray()
    async for chunk in r.aiter_bytes():
        data += chunk
        if len(data) > limit:
            break
    return bytes(data[:limit])


async def _head_of(r: httpx.Response) -> bytes:
    return await _read(r, ERROR_BYTES)


@dataclass(frozen=True)
class _Page:
    objects: dict[str, int]
    next_token: str | None


def _listing(body: bytes) -> _Page:
    """A ListObjectsV2 answer -> its objects (folder markers, keys ending in "/", left out) and the
    token of the next page (None: the last)."""

    def local(tag: str) -> str:
        return tag.rpartition("}")[2]

    root = ET.fromstring(body)
    objects: dict[str, int] = {}
    fields: dict[str, str] = {}
    for child in root:
        if local(child.tag) == "Contents":
            item = {local(e.tag): e.text or "" for e in child}
            key = item.get("Key", "")
            if key and not key.endswith("/"):
                objects[key] = int(item.get("Size") or 0)
        else:
            fields[local(child.tag)] = child.text or ""
    more = fields.get("IsTruncated") == "true" and fields.get("NextContinuationToken")
    return _Page(objects, fields["NextContinuationToken"] if more else None)


def _code(body: bytes) -> str | None:
    """The error code of an S3 error answer (`<Error><Code>...</Code>`)."""
    found = re.search(rb"<Code>([^<]{1,100})</Code>", body)
    return found.group(1).decode(errors="replace") if found else None


def sign(
    method: str,
    url: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    credentials: Credentials,
    region: str,
    *,
    now: dt.datetime | None = None,
) -> dict[str, str]:
    """`headers` plus the SigV4 ones (x-amz-date, host, Authorization) for a request to S3 in `region`.

    `url` is the request's URL without its query, its path already encoded as sent; `headers` must hold
    `x-amz-content-sha256` (the payload's sha256, hex). AWS's "Signature Version 4 signing process"."""
    when = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    day = when[:8]
    parts = urlsplit(url)
    out = {k.lower(): v.strip() for k, v in headers.items()}
    out["host"] = parts.netloc
    out["x-amz-date"] = when
    if credentials.session_token:
        out["x-amz-security-token"] = credentials.session_token
    names = sorted(out)
    canonical = "\n".join(
        [
            method,
            parts.path or "/",
            "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())),
            "".join(f"{n}:{out[n]}\n" for n in names),
            ";".join(names),
            out["x-amz-content-sha256"],
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{when}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{credentials.secret_access_key}".encode()
    for step in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, step.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    del out["host"]  # httpx sends it from the URL, as signed
    return out


ENV = {
    "bucket": "SPECDECODE_RESULTS_S3_BUCKET",
    "prefix": "SPECDECODE_RESULTS_S3_PREFIX",
    "endpoint": "SPECDECODE_RESULTS_S3_ENDPOINT",
    "region": "SPECDECODE_RESULTS_S3_REGION",
}
"""The variables the chart sets on the operator, and the operator on its load Jobs (`as_env`)."""


def from_env(env: Mapping[str, str] | None = None) -> Location | None:
    """The operator's or load pod's bucket from `SPECDECODE_RESULTS_S3_*` (None: none, ConfigMaps)."""
    env = os.environ if env is None else env
    bucket = env.get(ENV["bucket"], "")
    if not bucket:
        return None
    return Location(
        bucket,
        env.get(ENV["prefix"], ""),
        env.get(ENV["endpoint"], ""),
        env.get(ENV["region"]) or "us-east-1",
    )


def as_env(location: Location) -> dict[str, str]:
    """`from_env`'s variables for `location` (what the operator gives its load Jobs)."""
    return {
        ENV["bucket"]: location.bucket,
        ENV["prefix"]: location.prefix,
        ENV["endpoint"]: location.endpoint,
        ENV["region"]: location.region,
    }


async def upload(
    location: Location,
    directory: Path,
    *,
    namespace: str,
    experiment: str,
    prefix: str,
    generation: int,
    job_uid: str,
    pod: tuple[int, int] | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Store the result files of `directory` as one object (`object_key`); returns its s3:// URL."""
    store = Store(location, Credentials.from_env(os.environ if env is None else env, location.settings))
    try:
        key = location.key(object_key(namespace, experiment, generation, prefix, job_uid, pod))
        return await store.put(key, encode_dir(directory))
    finally:
        await store.aclose()


async def download(
    location: Location,
    *,
    namespace: str,
    experiment: str,
    prefix: str,
    generation: int,
    job_uid: str,
    limits: Limits,
    pod: tuple[int, int] | None = None,
    env: Mapping[str, str] | None = None,
) -> Bundle:
    """The bundle load Job `job_uid` stored for `generation` (`parse` reads it), at most
    `limits.max_bytes` read."""
    store = Store(location, Credentials.from_env(os.environ if env is None else env, location.settings))
    try:
        key = location.key(object_key(namespace, experiment, generation, prefix, job_uid, pod))
        return Bundle(await store.get(key, max_bytes=limits.max_bytes), limits.max_bytes)
    finally:
        await store.aclose()
