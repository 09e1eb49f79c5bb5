"""A real S3-compatible server for the tests: s3proxy (Apache-2.0, Java) on loopback.

It keeps objects on disk under a temporary directory (its jclouds "filesystem" backend) and checks AWS
SigV4 signatures against one key pair, so a wrong key or a bad signature is refused as S3 refuses it.
`hack/build-s3proxy.sh` fetches the jar from Maven Central (`make test` does; `make s3proxy` alone).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "hack" / "build-s3proxy.sh"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    data: Path
    """The filesystem backend: one directory per bucket."""

    def make_bucket(self, name: str) -> None:
        """A bucket, as an administrator would create it (a directory of the backend)."""
        (self.data / name).mkdir()

    def env(self, **extra: str) -> dict[str, str]:
        """The standard AWS variables for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            **extra,
        }


def jar() -> Path:
    """$SPECDECODE_S3PROXY_JAR, else where hack/build-s3proxy.sh puts it; fails the test when missing."""
    path = (
        os.environ.get("SPECDECODE_S3PROXY_JAR")
        or subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--print-path"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    if not Path(path).is_file():
        pytest.fail(
            f"s3proxy is not fetched ({path}): run `make s3proxy` (hack/build-s3proxy.sh)", pytrace=False
        )
    return Path(path)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(directory: Path, *, host: str = "127.0.0.1", timeout: float = 90.0) -> Iterator[S3Server]:
    """s3proxy on a free port of `host` (e2e: the node agent's bridge, which pods reach), its objects
    under `directory`; stopped on exit."""
    data = directory / "buckets"
    data.mkdir(parents=True)
    port = _free_port()
    server = S3Server(f"http://{host}:{port}", "test-" + secrets.token_hex(4), secrets.token_hex(16), data)
    conf = directory / "s3proxy.conf"
    conf.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint={server.endpoint}",
                "s3proxy.authorization=aws-v4",
                f"s3proxy.identity={server.access_key}",
                f"s3proxy.credential={server.secret_key}",
                "jclouds.provider=filesystem",
                f"jclouds.filesystem.basedir={data}",
                "",
            ]
        )
    )
    log = directory / "s3proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            # A small heap: it streams objects to disk; two cores are shared by the whole suite.
            ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-jar", str(jar()), "--properties", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"s3proxy exited with {proc.returncode}; log {log}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(server.endpoint, timeout=2)
            except urllib.error.HTTPError:
                break  # it answers (403: an unsigned request), so it is up
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"s3proxy did not answer in {timeout:.0f} s; log {log}:\n{log.read_text()[-3000:]}"
                    )
                time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
