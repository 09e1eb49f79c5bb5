"""A real Kubernetes control plane on loopback, for tests.

etcd -> kube-apiserver -> kube-controller-manager -> kube-scheduler -> kwok (fake nodes and pods),
each started from the binaries that ``hack/build-k8s-bins.sh`` builds, on free ports on 127.0.0.1,
with a fresh PKI and data dir in a temporary directory. Every process is started in its own
session and is stopped by its PID (reverse start order; SIGTERM, then SIGKILL). Processes are
also stopped at interpreter exit, and on Linux they get SIGTERM if the test process dies.

Only loopback addresses are used anywhere: fake pods get IPs from a 127.x CIDR and fake nodes
the node IP 127.0.0.1, so anything that connects to a pod or node IP (Prometheus scraping a
discovered pod) stays on this machine.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-k8s-bins.sh"
REQUIRED_BINS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
)
KWOK_STAGES = "kwok-stages.yaml"
POD_CIDR = "127.64.0.0/16"  # kwok's fake pod IPs: loopback on purpose (see module docstring)
NODE_IP = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"  # never dialled: there is no kube-proxy
ADMIN_USER = "specdecode-test-admin"


# Extra feature gates for the built-in apiserver (kopf's shard_selectors need this one, k8s >= 1.36).
FEATURE_GATES = ("ShardedListAndWatch=true",)


class ClusterStartError(RuntimeError):
    """A component did not start or did not become ready."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------ binaries


class MissingBinariesError(RuntimeError):
    pass


def find_bin_dir() -> Path:
    """The directory with the test binaries: $SPECDECODE_K8S_BIN_DIR, else the build script's cache dir.

    Raises MissingBinariesError (with what to run) when a binary is missing; never builds.
    """
    env = os.environ.get("SPECDECODE_K8S_BIN_DIR")
    if env:
        bin_dir = Path(env)
    else:
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, check=True
        )
        bin_dir = Path(out.stdout.strip().splitlines()[-1])
    missing = [b for b in REQUIRED_BINS if not os.access(bin_dir / b, os.X_OK)]
    if not (bin_dir / KWOK_STAGES).is_file():
        missing.append(KWOK_STAGES)
    if missing:
        raise MissingBinariesError(
            f"Kubernetes test binaries missing in {bin_dir}: {', '.join(missing)}. "
            "Build them with `make k8s-bins` (or `hack/build-k8s-bins.sh`); `make test` does this."
        )
    return bin_dir


# ------------------------------------------------------------------ processes

_PR_SET_PDEATHSIG = 1
_running: list[subprocess.Popen[bytes]] = []
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:  # runs in the child between fork and exec: no imports, no dlopen
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM by PID, wait, then SIGKILL. Idempotent."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout)
    if proc in _running:
        _running.remove(proc)


@atexit.register
def _stop_leftovers() -> None:
    for proc in reversed(list(_running)):
        stop_process(proc, timeout=5.0)


@dataclass
class Component:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_process(name: str, argv: Sequence[str], log_dir: Path) -> Component:
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    _running.append(proc)
    return Component(name, proc, log)


def wait_until(component: Component, check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if component.proc.poll() is not None:
            raise ClusterStartError(
                f"{component.name} exited with {component.proc.returncode} before {what}; "
                f"log {component.log}:\n{tail(component.log)}"
            )
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        if time.monotonic() > deadline:
            raise ClusterStartError(
                f"{component.name} not {what} after {timeout:.0f} s; log {component.log}:\n{tail(component.log)}"
            )
        time.sleep(0.1)


def http_ok(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> bool:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError:
        return False


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


# ------------------------------------------------------------------ PKI


@dataclass(frozen=True)
class Pki:
    dir: Path
    token: str

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    def __getitem__(self, name: str) -> Path:
        return self.dir / name


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path) -> Pki:
    """CA, apiserver serving cert, admin client cert (system:masters), SA key, static token."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-days", "3650", "-keyout", "ca.key", "-out", "ca.crt",
        "-subj", "/CN=specdecode-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=d,
    )  # fmt: skip
    sans = ",".join(
        ["IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes"]
        + [f"DNS:kubernetes.default{s}" for s in ("", ".svc", ".svc.cluster.local")]
    )
    leaves = {
        "apiserver": ("/CN=kube-apiserver", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth"),
        "admin": (f"/O=system:masters/CN={ADMIN_USER}", "extendedKeyUsage=clientAuth"),
    }
    for name, (subj, ext) in leaves.items():
        (d / f"{name}.ext").write_text(f"{ext}\nkeyUsage=critical,digitalSignature,keyEncipherment\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "3650", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
            cwd=d,
        )  # fmt: skip
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=d)
    token = secrets.token_hex(24)
    (d / "tokens.csv").write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    (d / "admin.token").write_text(token)
    return Pki(d, token)


# ------------------------------------------------------------------ the cluster


def kubeconfig_dict(server: str, ca: Path, token: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "specdecode-test",
        "clusters": [
            {"name": "specdecode-test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "specdecode-test", "context": {"cluster": "specdecode-test", "user": "admin"}}],
    }


@dataclass
class Cluster:
    """What tests need to reach a cluster, whoever started it."""

    kubeconfig: Path
    bin_dir: Path
    api_url: str = ""
    token: str | None = None
    ca_file: Path | None = None
    builtin: bool = False

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl from the bin dir (never the one on PATH) against this cluster."""
        res = subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
            check=False,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stderr}{res.stdout}"
            )
        return res

    def get_json(self, *args: str) -> dict[str, Any]:
        out = self.kubectl("get", "-o", "json", *args).stdout
        return dict(json.loads(out))


@dataclass
class ControlPlane:
    """Starts and stops etcd, kube-apiserver, KCM, scheduler and kwok; see the module docstring."""

    bin_dir: Path
    workdir: Path | None = None
    feature_gates: Sequence[str] = ()
    agent_nodes: Sequence[str] = ()
    """Nodes whose pods kwok leaves alone: a node agent (node_agent.py) runs them."""
    start_timeout: float = 120.0
    components: list[Component] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    cluster: Cluster | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    _apiserver: tuple[list[str], Callable[[], bool]] | None = None
    """kube-apiserver's argv and readiness check, for `restart_apiserver`."""

    def start(self) -> Cluster:
        t_start = time.monotonic()
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="specdecode-k8s-")
            self.workdir = Path(self._tmp.name)
        d = self.workdir
        logs = d / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            self._start(d, logs)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t_start
        assert self.cluster is not None
        return self.cluster

    def _timed(self, name: str, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        fn()
        self.timings[name] = time.monotonic() - t0

    def _start(self, d: Path, logs: Path) -> None:
        b = self.bin_dir
        t0 = time.monotonic()
        pki = make_pki(d / "pki")
        self.timings["pki"] = time.monotonic() - t0

        # etcd
        t0 = time.monotonic()
        ec, ep = free_port(), free_port()
        etcd = self._spawn("etcd", [
            str(b / "etcd"), "--name=test", f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{ec}", f"--advertise-client-urls=http://127.0.0.1:{ec}",
            f"--listen-peer-urls=http://127.0.0.1:{ep}", f"--initial-advertise-peer-urls=http://127.0.0.1:{ep}",
            f"--initial-cluster=test=http://127.0.0.1:{ep}", "--unsafe-no-fsync", "--log-level=warn",
        ], logs)  # fmt: skip
        wait_until(etcd, lambda: http_ok(f"http://127.0.0.1:{ec}/health"), 30, "healthy")
        self.timings["etcd"] = time.monotonic() - t0

        # kube-apiserver
        t0 = time.monotonic()
        port = free_port()
        api_url = f"https://127.0.0.1:{port}"
        gates = [f"--feature-gates={','.join(self.feature_gates)}"] if self.feature_gates else []
        api_argv = [
            str(b / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ec}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--advertise-address=127.0.0.1",
            f"--cert-dir={d / 'apiserver-certs'}",
            f"--tls-cert-file={pki['apiserver.crt']}", f"--tls-private-key-file={pki['apiserver.key']}",
            f"--client-ca-file={pki.ca_crt}", f"--token-auth-file={pki['tokens.csv']}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki['sa.key']}",
            f"--service-account-signing-key-file={pki['sa.key']}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            *gates,
        ]  # fmt: skip
        apiserver = self._spawn("kube-apiserver", api_argv, logs)
        ctx = ssl.create_default_context(cafile=str(pki.ca_crt))

        def api_ready() -> bool:
            return http_ok(f"{api_url}/readyz", ctx, pki.token)

        self._apiserver = (api_argv, api_ready)
        wait_until(apiserver, api_ready, self.start_timeout, "ready (/readyz)")
        self.timings["kube-apiserver"] = time.monotonic() - t0

        kubeconfig = d / "kubeconfig"
        kubeconfig.write_text(json.dumps(kubeconfig_dict(api_url, pki.ca_crt, pki.token), indent=1))
        self.cluster = Cluster(kubeconfig, b, api_url, pki.token, pki.ca_crt, builtin=True)

        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
        ]

        # kube-controller-manager and kube-scheduler: start both, then wait for both
        t0 = time.monotonic()
        kcm_port, sched_port = free_port(), free_port()
        kcm = self._spawn("kube-controller-manager", [
            str(b / "kube-controller-manager"), *common, f"--secure-port={kcm_port}",
            f"--cert-dir={d / 'kcm-certs'}",
            f"--service-account-private-key-file={pki['sa.key']}", f"--root-ca-file={pki.ca_crt}",
            f"--cluster-signing-cert-file={pki.ca_crt}", f"--cluster-signing-key-file={pki['ca.key']}",
            "--use-service-account-credentials=false",
        ], logs)  # fmt: skip
        sched = self._spawn("kube-scheduler", [
            str(b / "kube-scheduler"), *common, f"--secure-port={sched_port}",
            f"--cert-dir={d / 'scheduler-certs'}",
        ], logs)  # fmt: skip
        wait_until(kcm, lambda: http_ok(f"https://127.0.0.1:{kcm_port}/healthz", insecure), 60, "healthy")
        wait_until(sched, lambda: http_ok(f"https://127.0.0.1:{sched_port}/healthz", insecure), 60, "healthy")
        self.timings["kcm+scheduler"] = time.monotonic() - t0

        # kwok: fakes every node and the pods bound to them
        t0 = time.monotonic()
        kwok_port = free_port()
        stages = b / KWOK_STAGES
        if self.agent_nodes:
            from node_agent import kwok_stages_without

            stages = d / KWOK_STAGES
            stages.write_text(kwok_stages_without((b / KWOK_STAGES).read_text(), list(self.agent_nodes)))
        kwok = self._spawn("kwok", [
            str(b / "kwok"), f"--kubeconfig={kubeconfig}", f"--config={stages}",
            "--manage-all-nodes=true", f"--cidr={POD_CIDR}", f"--node-ip={NODE_IP}",
            "--node-lease-duration-seconds=40", f"--server-address=127.0.0.1:{kwok_port}",
        ], logs)  # fmt: skip
        wait_until(kwok, lambda: http_ok(f"http://127.0.0.1:{kwok_port}/healthz"), 60, "healthy")
        self.timings["kwok"] = time.monotonic() - t0

    def restart_apiserver(self, down: float) -> None:
        """Stop kube-apiserver, leave the API away for `down` seconds, and start it again on the same
        port and etcd (the other components and clients reconnect by themselves)."""
        assert self._apiserver is not None and self.workdir is not None, "start() first"
        argv, ready = self._apiserver
        old = next(c for c in self.components if c.name == "kube-apiserver")
        stop_process(old.proc)
        time.sleep(down)
        new = start_process("kube-apiserver", argv, self.workdir / "logs")
        self.components[self.components.index(old)] = new
        wait_until(new, ready, self.start_timeout, "ready again (/readyz)")

    def _spawn(self, name: str, argv: Sequence[str], logs: Path) -> Component:
        c = start_process(name, argv, logs)
        self.components.append(c)
        return c

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.components]

    def stop(self) -> None:
        """Stop every process this control plane started, in reverse order, by PID."""
        for c in reversed(self.components):
            stop_process(c.proc)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def external_cluster(kubeconfig: Path, bin_dir: Path) -> Cluster:
    """A cluster named by a kubeconfig (its current context); api url, token and CA when present."""
    import yaml

    cfg = yaml.safe_load(kubeconfig.read_text()) or {}
    ctx_name = cfg.get("current-context")
    ctx: dict[str, Any] = next((c["context"] for c in cfg.get("contexts", []) if c["name"] == ctx_name), {})
    cl: dict[str, Any] = next(
        (c["cluster"] for c in cfg.get("clusters", []) if c["name"] == ctx.get("cluster")), {}
    )
    user: dict[str, Any] = next((u["user"] for u in cfg.get("users", []) if u["name"] == ctx.get("user")), {})
    ca = cl.get("certificate-authority")
    return Cluster(
        kubeconfig=kubeconfig,
        bin_dir=bin_dir,
        api_url=cl.get("server", ""),
        token=user.get("token"),
        ca_file=Path(ca) if ca else None,
        builtin=False,
    )


@contextlib.contextmanager
def running_control_plane(bin_dir: Path, **kwargs: object) -> Iterator[ControlPlane]:
    cp = ControlPlane(bin_dir, **kwargs)  # type: ignore[arg-type]
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()
