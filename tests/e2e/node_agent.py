"""A test-side node agent: the kubelet for the fake nodes it manages, running pods as local processes.

KWOK keeps every node alive (Ready condition, lease) but its pod stages skip the pods bound to the
nodes this agent manages (``kwok_stages_without`` below), so the agent alone writes their status.

For every pod bound to one of its nodes the agent:

- gives the pod its own **network namespace** (``ip netns``), joined to a host bridge by a veth pair,
  with an address from a loopback /24 (``127.65.K.0/24``, gateway ``127.65.K.1`` on the bridge;
  ``route_localnet=1`` so loopback-range addresses route between namespaces). Processes bind
  ``0.0.0.0:8000`` as rendered without clashing; the host (Prometheus, the tests) reaches
  ``<podIP>:<port>`` through the bridge;
- gives each container its own **mount and UTS namespace** (``unshare``): ConfigMap, Secret,
  downwardAPI, projected (the ServiceAccount token) and emptyDir volumes are materialised as files
  in a temp dir, a PersistentVolumeClaim is its bound ``hostPath``/``local`` volume's own host
  directory, and each is bind-mounted at its ``mountPath`` (read-only when asked); the pod's own
  ``/etc/hosts`` is bind-mounted over ``/etc/hosts``; the hostname is the pod's name;
- runs each container's ``command`` + ``args`` (``$(VAR)`` expanded) from the project's venv
  (images are not pulled: ``PATH`` starts with the venv's ``bin``, so ``specdecode`` and ``python``
  are the project's own), with ``env`` / ``envFrom`` resolved like the kubelet (literal values,
  fieldRef, secretKeyRef, configMapKeyRef) plus ``KUBERNETES_SERVICE_HOST``/``PORT``;
- runs the container's real startup, readiness and liveness probes (httpGet / tcpSocket / exec)
  against the pod IP, periods scaled by ``probe_scale``;
- writes ``status`` through the pods/status subresource: ``phase``, ``podIP``/``podIPs``,
  conditions (PodScheduled, Initialized, ContainersReady, Ready), ``containerStatuses`` (running /
  waiting / terminated with exit code and reason, ``restartCount``, ``lastState``), honouring
  ``restartPolicy`` (crash-loop back-off with ``CrashLoopBackOff``, Never: Succeeded / Failed);
- on deletion: SIGTERM to the container's process group, SIGKILL after the grace period (capped),
  then deletes the pod object with grace 0 (as the kubelet does) and removes its namespace.

**Service names**: each pod's ``/etc/hosts`` maps ``<svc>`` (own namespace), ``<svc>.<ns>``,
``<svc>.<ns>.svc`` and ``<svc>.<ns>.svc.cluster.local`` to a ready endpoint address from the
Service's EndpointSlices (refreshed every sync), and ``kubernetes.default.svc`` (and its short
forms) to the bridge gateway, where the agent relays TCP to the API server. This stands in for
cluster DNS + kube-proxy: a name resolves to one *pod* IP, not a ClusterIP, so there is no
load-balancing across replicas, the Service ``port`` must equal the ``targetPort`` (checked), and a
Service without ready endpoints does not resolve at all (in a cluster it resolves and refuses).

Cleanup: everything the agent made (processes, namespaces, veths, the bridge, temp dirs, mount
points it had to create on the host) is removed by ``stop()``, also at interpreter exit; an agent
that starts sweeps the namespaces and bridges of agents whose process is gone (``sd<pid>-...``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ipaddress
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from k8s_cluster import Cluster, _die_with_parent

AGENT_LABEL = "specdecode.io/node-agent"
SUBNET_BASE = "127.65"  # 127.65.K.0/24 per agent; kwok's fake pods use 127.64.0.0/16
SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TERMINATION_GRACE_CAP = 5.0  # seconds, at most, between SIGTERM and SIGKILL
BACKOFF_BASE = 10.0  # the kubelet's crash-loop back-off: 10 s, doubling, capped at 300 s
BACKOFF_CAP = 300.0
STATE_DIR = Path("/run/specdecode-node-agent")  # mount points each agent made on the host, by agent id
NAME_RE = re.compile(r"^sd(?:br)?(\d+)(?:a\d+)?(?:-\d+)?$")
_instances = iter(range(1 << 30))


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def kwok_stages_without(stages_yaml: str, nodes: list[str]) -> str:
    """KWOK's stages, with every Pod stage skipping pods bound to ``nodes`` (the agent's)."""
    docs = [d for d in yaml.safe_load_all(stages_yaml) if d]
    for d in docs:
        if d["spec"]["resourceRef"].get("kind") == "Pod":
            sel = d["spec"].setdefault("selector", {})
            sel.setdefault("matchExpressions", []).append(
                {"key": ".spec.nodeName", "operator": "NotIn", "values": list(nodes)}
            )
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def host_path_claim(pv_name: str, claim: str, namespace: str, path: Path) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume at ``path`` and a claim that the PV binder binds to it (by name)."""
    storage = {"storage": "1Gi"}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": storage,
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": storage},
            },
        },
    ]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_list() -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def links() -> list[str]:
    out = run("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def delete_netns(name: str) -> None:
    """Kill what still runs in the namespace (else it outlives `ip netns del`), then delete it."""
    pids = run("ip", "netns", "pids", name, check=False).stdout.split()
    for p in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(p), signal.SIGKILL)
    run("ip", "netns", "del", name, check=False)


def sweep_orphans() -> list[str]:
    """Remove namespaces and bridges left by agents whose process is gone. Returns what it removed."""
    removed = []
    for ns in netns_list():
        m = NAME_RE.match(ns)
        if m and ns.startswith("sd") and not ns.startswith("sdbr") and not pid_alive(int(m.group(1))):
            delete_netns(ns)
            removed.append(ns)
    for link in links():
        m = NAME_RE.match(link)
        if m and link.startswith("sdbr") and not pid_alive(int(m.group(1))):
            run("ip", "link", "del", link, check=False)
            removed.append(link)
    for state in STATE_DIR.glob("*.mounts") if STATE_DIR.is_dir() else []:
        if not pid_alive(int(state.stem.split("a")[0])):
            removed += remove_mount_points([Path(p) for p in state.read_text().splitlines() if p])
            state.unlink()
    return removed


def remove_mount_points(paths: list[Path]) -> list[str]:
    """Remove the (empty) mount points an agent created on the host, deepest first."""
    removed = []
    for p in reversed(paths):
        with contextlib.suppress(OSError):
            if p.is_dir():
                p.rmdir()
            elif p.exists():
                p.unlink()
            removed.append(str(p))
    return removed


def agent_leftovers(agent_id: str | None = None) -> dict[str, list[str]]:
    """Network namespaces and links of the agent ``agent_id`` (default: any agent of this process)."""

    def mine(i: str) -> bool:
        return i == agent_id if agent_id else i.split("a")[0] == str(os.getpid())

    ns = [n for n in netns_list() if n.startswith("sd") and "-" in n and mine(n[2:].split("-")[0])]
    ls = [
        link
        for link in links()
        if (link.startswith("sdbr") and mine(link[4:]))
        or (link.startswith("sdv") and mine(link[3:].split("x")[0]))
    ]
    return {"netns": ns, "links": ls}


# ------------------------------------------------------------------ a TCP relay to the API server


class TcpRelay:
    """Listens on ``listen`` and relays every connection to ``target`` (the API server on 127.0.0.1)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.create_server(listen, reuse_port=False)
        self.sock.settimeout(0.2)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="apiserver-relay", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, a: socket.socket) -> None:
        try:
            b = socket.create_connection(self.target, timeout=5)
        except OSError:
            a.close()
            return
        a.setblocking(True)
        b.setblocking(True)
        socks = [a, b]
        try:
            while not self.stopping.is_set():
                ready, _, _ = select.select(socks, [], [], 0.5)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def stop(self) -> None:
        self.stopping.set()
        self.sock.close()
        self.thread.join(2)


# ------------------------------------------------------------------ a container


@dataclass
class Probe:
    spec: dict[str, Any]
    scale: float
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0

    def period(self) -> float:
        return max(0.1, float(self.spec.get("periodSeconds", 10)) * self.scale)

    def schedule_first(self, started: float) -> None:
        self.next_at = started + float(self.spec.get("initialDelaySeconds", 0)) * self.scale

    def due(self, t: float) -> bool:
        return t >= self.next_at

    def record(self, ok: bool, t: float) -> None:
        self.next_at = t + self.period()
        if ok:
            self.successes, self.failures = self.successes + 1, 0
        else:
            self.successes, self.failures = 0, self.failures + 1

    @property
    def success_threshold(self) -> int:
        return int(self.spec.get("successThreshold", 1))

    @property
    def failure_threshold(self) -> int:
        return int(self.spec.get("failureThreshold", 3))


@dataclass
class ContainerRuntime:
    spec: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    started_mono: float = 0.0
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None  # current state, when not restarting
    waiting: dict[str, str] | None = field(default_factory=lambda: {"reason": "ContainerCreating"})
    restart_at: float | None = None
    started_probe_ok: bool = False  # startup probe passed (or none)
    ready: bool = False
    probes: dict[str, Probe] = field(default_factory=dict)
    kill_reason: str | None = None
    backoff_n: int = 0  # crash-loop back-off steps taken since the container last ran long enough

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self, container_id: str) -> dict[str, Any]:
        state: dict[str, Any]
        if self.proc is not None and self.proc.poll() is None:
            state = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            state = {"waiting": self.waiting or {"reason": "ContainerCreating"}}
        st: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": "running" in state and self.started_probe_ok,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.proc is not None:
            st["containerID"] = f"specdecode-node-agent://{container_id}-{self.proc.pid}"
        return st


# ------------------------------------------------------------------ a pod


class PodRuntime:
    """One pod: its network namespace, files and processes, and the thread that drives it."""

    def __init__(self, agent: NodeAgent, pod: dict[str, Any], index: int, ip: str) -> None:
        self.agent = agent
        self.pod = pod
        meta = pod["metadata"]
        self.ns: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.index = index
        self.ip = ip
        self.netns = f"sd{agent.id}-{index}"
        self.veth = f"sdv{agent.id}x{index:x}"
        self.dir = agent.workdir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.hosts_file = self.dir / "hosts"
        self.spec: dict[str, Any] = pod["spec"]
        self.restart_policy: str = self.spec.get("restartPolicy", "Always")
        self.containers = [ContainerRuntime(c) for c in self.spec.get("containers", [])]
        self.start_time = now_iso()
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.net_up = False
        self.phase = "Pending"
        self.last_status: dict[str, Any] | None = None
        self.message = ""
        self.volumes: dict[str, Path] = {}
        self.read_only_volumes: set[str] = set()  # a PVC volume source with readOnly: every mount of it
        self.envs: dict[str, dict[str, str]] = {}
        self.thread = threading.Thread(target=self._main, name=f"pod-{self.ns}/{self.name}", daemon=True)

    # ---- lifecycle

    def start(self) -> None:
        self.thread.start()

    def _main(self) -> None:
        try:
            self._setup_network()
            self.write_hosts()
            self._write_status()
            volumes = self._wait_for(self._materialise_volumes, "volumes")
            if volumes is None:
                return
            self.volumes = volumes
            envs = self._wait_for(lambda: {c.name: self._env(c.spec) for c in self.containers}, "env")
            if envs is None:
                return
            self.envs = envs
            while not self.stopping.is_set():
                self._step()
                self._write_status()
                if self.phase in ("Succeeded", "Failed"):
                    self._teardown_network()
                    break
                self.stopping.wait(self.agent.tick)
        except Exception as e:  # pragma: no cover - shown in the agent's log and the pod's message
            self.agent.log(f"pod {self.ns}/{self.name}: {type(e).__name__}: {e}")
            self.message = f"node agent: {type(e).__name__}: {e}"
            with contextlib.suppress(Exception):
                self._write_status()
        finally:
            self.done.set()

    def _wait_for(self, make: Callable[[], Any], what: str) -> Any:
        """Retry ``make`` (a missing ConfigMap/Secret) as the kubelet does, with the waiting reason shown."""
        while not self.stopping.is_set():
            try:
                return make()
            except MissingReference as e:
                reason = "ContainerCreating" if what == "volumes" else "CreateContainerConfigError"
                for c in self.containers:
                    c.waiting = {"reason": reason, "message": str(e)}
                self._write_status()
                self.stopping.wait(1.0)
        return None

    def stop(self, grace: float) -> None:
        """Stop the containers (SIGTERM, then SIGKILL after ``grace``), remove namespace and files."""
        self.stopping.set()
        self.thread.join(10)
        procs = [c.proc for c in self.containers if c.proc is not None and c.proc.poll() is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + min(grace, TERMINATION_GRACE_CAP)
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self._teardown_network()
        shutil.rmtree(self.dir / "volumes", ignore_errors=True)

    # ---- network

    def _setup_network(self) -> None:
        a = self.agent
        run("ip", "netns", "add", self.netns)
        self.net_up = True
        run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        run("ip", "link", "set", self.veth, "master", a.bridge, "up")
        nsip = ["ip", "-n", self.netns]
        run(*nsip, "link", "set", "lo", "up")
        run(*nsip, "addr", "add", f"{self.ip}/{a.prefix}", "dev", "eth0")
        run(*nsip, "link", "set", "eth0", "up")
        run("ip", "netns", "exec", self.netns, "sysctl", "-qw",
            "net.ipv4.conf.all.route_localnet=1", "net.ipv4.conf.eth0.route_localnet=1")  # fmt: skip
        # 127/8 is `local` on lo in every namespace: route the agent's subnet out of eth0 instead.
        run(*nsip, "route", "add", str(a.subnet), "dev", "eth0", "table", "local")

    def _teardown_network(self) -> None:
        if self.net_up:
            self.net_up = False
            delete_netns(self.netns)
            run("ip", "link", "del", self.veth, check=False)

    def write_hosts(self) -> None:
        text = self.agent.hosts_for(self.ns, self.name, self.ip)
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            old = self.hosts_file.read_text()
        except OSError:
            old = None
        if old != text:
            # in place: the file is bind-mounted into the containers, a rename would not be seen
            with self.hosts_file.open("r+" if old is not None else "w") as f:
                f.seek(0)
                f.write(text)
                f.truncate()

    # ---- volumes and env

    def _materialise_volumes(self) -> dict[str, Path]:
        vols: dict[str, Path] = {}
        base = self.dir / "volumes"
        for v in self.spec.get("volumes", []):
            if "persistentVolumeClaim" in v:  # the volume's own directory on the host, never a copy
                claim = v["persistentVolumeClaim"]
                vols[v["name"]] = self.agent.claim_path(self.ns, claim["claimName"])
                if claim.get("readOnly"):
                    self.read_only_volumes.add(v["name"])
                continue
            d = base / v["name"]
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
            mode = None
            if "configMap" in v:
                src = v["configMap"]
                mode = src.get("defaultMode")
                self._project(d, self.agent.config_map(self.ns, src["name"], src.get("optional")), src)
            elif "secret" in v:
                src = v["secret"]
                mode = src.get("defaultMode")
                self._project(d, self.agent.secret(self.ns, src["secretName"], src.get("optional")), src)
            elif "emptyDir" in v:
                d.chmod(0o777)
            elif "downwardAPI" in v:
                for item in v["downwardAPI"].get("items", []):
                    self._write(d, item["path"], self._field(item["fieldRef"]["fieldPath"]).encode())
            elif "projected" in v:
                mode = v["projected"].get("defaultMode")
                for s in v["projected"].get("sources", []):
                    if "serviceAccountToken" in s:
                        t = s["serviceAccountToken"]
                        token = self.agent.token(self.ns, self.spec.get("serviceAccountName", "default"),
                                                 self.name, self.uid, t)  # fmt: skip
                        self._write(d, t["path"], token.encode())
                    elif "configMap" in s:
                        src = s["configMap"]
                        self._project(
                            d, self.agent.config_map(self.ns, src["name"], src.get("optional")), src
                        )
                    elif "secret" in s:
                        src = s["secret"]
                        self._project(d, self.agent.secret(self.ns, src["name"], src.get("optional")), src)
                    elif "downwardAPI" in s:
                        for item in s["downwardAPI"].get("items", []):
                            self._write(d, item["path"], self._field(item["fieldRef"]["fieldPath"]).encode())
            else:
                raise RuntimeError(f"volume {v['name']}: type not supported by the node agent: {sorted(v)}")
            if mode is not None:
                for p in d.rglob("*"):
                    if p.is_file():
                        p.chmod(mode)
            vols[v["name"]] = d
        return vols

    @staticmethod
    def _write(d: Path, rel: str, data: bytes) -> None:
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def _project(self, d: Path, data: Mapping[str, bytes] | None, src: dict[str, Any]) -> None:
        if data is None:
            return
        items = src.get("items")
        if items:
            for item in items:
                if item["key"] not in data:
                    if src.get("optional"):
                        continue
                    raise MissingReference(f"key {item['key']} not found in {src.get('name')}")
                self._write(d, item["path"], data[item["key"]])
        else:
            for k, b in data.items():
                self._write(d, k, b)

    def _field(self, path: str) -> str:
        meta = self.pod["metadata"]
        simple = {
            "metadata.name": self.name,
            "metadata.namespace": self.ns,
            "metadata.uid": self.uid,
            "spec.nodeName": self.spec.get("nodeName", ""),
            "spec.serviceAccountName": self.spec.get("serviceAccountName", ""),
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
            "status.hostIP": self.agent.node_ip,
            "status.hostIPs": self.agent.node_ip,
        }
        if path in simple:
            return str(simple[path])
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        if path in ("metadata.labels", "metadata.annotations"):
            kv = meta.get(path.split(".")[1]) or {}
            return "\n".join(f'{k}="{v}"' for k, v in sorted(kv.items()))
        raise RuntimeError(f"fieldRef {path} not supported by the node agent")

    def _env(self, c: dict[str, Any]) -> dict[str, str]:
        a = self.agent
        env: dict[str, str] = {
            "PATH": f"{a.venv_bin}:{SYS_PATH}",
            "HOME": "/root",
            "HOSTNAME": self.name,
            "KUBERNETES_SERVICE_HOST": a.api_host,
            "KUBERNETES_SERVICE_PORT": str(a.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(a.api_port),
            "KUBERNETES_PORT": f"tcp://{a.api_host}:{a.api_port}",
            "PYTHONUNBUFFERED": "1",
            # the code under test where the tests run with PYTHONPATH over the venv's editable install
            # (a worktree of the checkout the venv was made for): the pods run the same code as the test
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
            **a.node_env.get(self.spec.get("nodeName", ""), {}),
        }
        for src in c.get("envFrom", []):
            prefix = src.get("prefix", "")
            ref = src.get("configMapRef") or src.get("secretRef") or {}
            get = a.config_map if "configMapRef" in src else a.secret
            found = get(self.ns, ref["name"], ref.get("optional")) or {}
            env.update({prefix + k: v.decode() for k, v in found.items()})
        for e in c.get("env", []):
            if "valueFrom" not in e:
                env[e["name"]] = expand(e.get("value", ""), env)
                continue
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                env[e["name"]] = self._field(vf["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in vf or "configMapKeyRef" in vf:
                is_secret = "secretKeyRef" in vf
                ref = vf["secretKeyRef" if is_secret else "configMapKeyRef"]
                data = (a.secret if is_secret else a.config_map)(self.ns, ref["name"], ref.get("optional"))
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise MissingReference(f"couldn't find key {ref['key']} in {ref['name']}")
                env[e["name"]] = data[ref["key"]].decode()
            elif "resourceFieldRef" in vf:
                env[e["name"]] = "0"
            else:
                raise RuntimeError(f"env {e['name']}: valueFrom not supported: {sorted(vf)}")
        return env

    # ---- containers

    def _launch(self, c: ContainerRuntime) -> None:
        spec = c.spec
        env = self.envs[c.name]
        argv = [expand(x, env) for x in [*spec.get("command", []), *spec.get("args", [])]]
        if not spec.get("command"):
            c.waiting = {
                "reason": "CreateContainerError",
                "message": "node agent: no command (images are not pulled, the image's entrypoint is unknown)",
            }
            c.terminated = None
            return
        script = ["set -e", 'hostname "$1"', 'mount --bind "$2" /etc/hosts']
        # The sources of the mounts live under the agent's workdir (pytest's, under /tmp): a mount
        # over an ancestor of it (the chart's /tmp emptyDir) goes last, or it would hide the sources
        # of those after it. A kubelet's volume directories are outside any container's paths.
        hides_sources = lambda m: self.agent.workdir.is_relative_to(m["mountPath"])  # noqa: E731
        mounts = sorted(spec.get("volumeMounts", []), key=hides_sources)
        hidden = [
            code for code in self.agent.host_code if any(code.is_relative_to(m["mountPath"]) for m in mounts)
        ]
        stash = self.agent.stash_dir / f"{self.uid[:8]}-{self.index}"  # outside /tmp, where pods mount
        for i, code in enumerate(hidden):  # outside the pod's mounts until they are made
            (stash / str(i)).mkdir(parents=True, exist_ok=True)
            script.append(f"mount --bind {shlex.quote(str(code))} {shlex.quote(str(stash / str(i)))}")
        for m in mounts:
            src = self.volumes.get(m["name"])
            if src is None:
                raise RuntimeError(f"volumeMount {m['name']}: no such volume")
            if m.get("subPath"):
                src = src / m["subPath"]
                if not src.exists():  # the kubelet creates a missing subPath as a directory
                    src.mkdir(parents=True)
            dst = m["mountPath"]
            self.agent.ensure_mount_point(Path(dst), directory=src.is_dir())
            script.append(f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}")
            if m.get("readOnly") or m["name"] in self.read_only_volumes:
                script.append(f"mount -o remount,bind,ro {shlex.quote(dst)}")
        for i, code in enumerate(hidden):  # the container's own files stay where its PATH says
            script.append(f"mkdir -p {shlex.quote(str(code))}")
            script.append(f"mount --bind {shlex.quote(str(stash / str(i)))} {shlex.quote(str(code))}")
        workdir = spec.get("workingDir")
        if workdir:
            script.append(f"mkdir -p {shlex.quote(workdir)} && cd {shlex.quote(workdir)}")
        script.append('shift 2; exec "$@"')
        tag = f"specdecode-node-agent-{self.agent.pid}-{self.index}"
        full = [
            "ip", "netns", "exec", self.netns,
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "/bin/sh", "-c", "\n".join(script), tag, self.name, str(self.hosts_file), *argv,
        ]  # fmt: skip
        log = self.dir / f"{c.name}.log"
        nice = cpu_nice(spec.get("resources") or {})

        def preexec() -> None:  # in the child between fork and exec
            _die_with_parent()
            if nice:
                os.setpriority(os.PRIO_PROCESS, 0, nice)

        with log.open("ab") as out:
            out.write(f"--- {now_iso()} start #{c.restart_count}: {shlex.join(argv)}\n".encode())
            out.flush()
            c.proc = subprocess.Popen(
                full,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        self.agent.launched.append(c.proc)
        c.started_at = now_iso()
        c.started_mono = time.monotonic()
        c.waiting = None
        c.terminated = None
        c.ready = False
        c.kill_reason = None
        c.probes = {
            k: Probe(spec[k], self.agent.probe_scale)
            for k in ("startupProbe", "readinessProbe", "livenessProbe")
            if k in spec
        }
        for p in c.probes.values():
            p.schedule_first(c.started_mono)
        c.started_probe_ok = "startupProbe" not in c.probes

    def _step(self) -> None:
        t = time.monotonic()
        for c in self.containers:
            if c.proc is None and c.terminated is None and c.restart_at is None:
                if c.waiting and c.waiting.get("reason") == "CreateContainerError":
                    continue
                self._launch(c)
                continue
            if c.proc is not None and c.proc.poll() is not None:
                self._exited(c, t)
            if c.restart_at is not None and t >= c.restart_at:
                c.restart_at = None
                c.restart_count += 1
                self._launch(c)
            if c.proc is not None and c.proc.poll() is None:
                self._probe(c, t)
        self.phase = self._phase()

    def _exited(self, c: ContainerRuntime, t: float) -> None:
        assert c.proc is not None
        code = c.proc.returncode
        if code < 0:  # killed by a signal: the runtime reports 128 + signal
            code = 128 - code
        reason = c.kill_reason or ("Completed" if code == 0 else "Error")
        term = {"exitCode": code, "reason": reason, "startedAt": c.started_at, "finishedAt": now_iso(),
                "containerID": f"specdecode-node-agent://{self.uid}-{c.proc.pid}"}  # fmt: skip
        c.proc = None
        c.ready = False
        restart = self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)
        if not restart:
            c.terminated = term
            return
        c.last_terminated = term
        c.terminated = None
        # Back-off as the kubelet: 10 s, doubling, capped (scaled like the probes); reset after 10 min up.
        if t - c.started_mono > 600 * self.agent.probe_scale:
            c.backoff_n = 0
        delay = min(BACKOFF_BASE * (2**c.backoff_n), BACKOFF_CAP) * self.agent.probe_scale
        c.backoff_n += 1
        c.restart_at = t + delay
        c.waiting = {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {delay:.1f}s restarting failed container={c.name} pod={self.name}_{self.ns}"
            f"({self.uid})",
        }

    def _probe(self, c: ContainerRuntime, t: float) -> None:
        sp = c.probes.get("startupProbe")
        if sp is not None and not c.started_probe_ok:
            if sp.due(t):
                sp.record(self._check(c, sp.spec), t)
                if sp.successes >= 1:
                    c.started_probe_ok = True
                    for k in ("readinessProbe", "livenessProbe"):
                        if k in c.probes:
                            c.probes[k].schedule_first(t)
                elif sp.failures >= sp.failure_threshold:
                    self._kill(c, "startup probe failed")
            return
        rp = c.probes.get("readinessProbe")
        if rp is None:
            c.ready = True
        elif rp.due(t):
            rp.record(self._check(c, rp.spec), t)
            if rp.successes >= rp.success_threshold:
                c.ready = True
            elif rp.failures >= rp.failure_threshold:
                c.ready = False
        lp = c.probes.get("livenessProbe")
        if lp is not None and lp.due(t):
            lp.record(self._check(c, lp.spec), t)
            if lp.failures >= lp.failure_threshold:
                self._kill(c, "liveness probe failed")

    def _kill(self, c: ContainerRuntime, why: str) -> None:
        assert c.proc is not None
        self.agent.log(f"pod {self.ns}/{self.name} container {c.name}: {why}, killing")
        c.kill_reason = "Error"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(c.proc.pid, signal.SIGTERM)
        try:
            c.proc.wait(TERMINATION_GRACE_CAP)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, signal.SIGKILL)
            c.proc.wait(5)

    def _port(self, c: ContainerRuntime, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        raise RuntimeError(f"container {c.name}: no port named {port}")

    def _check(self, c: ContainerRuntime, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                g = probe["httpGet"]
                host = g.get("host") or self.ip
                url = f"{g.get('scheme', 'HTTP').lower()}://{host}:{self._port(c, g['port'])}{g.get('path', '/')}"
                req = urllib.request.Request(url, headers={"User-Agent": "kube-probe/1.36"})
                for h in g.get("httpHeaders", []):
                    req.add_header(h["name"], h["value"])
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    return 200 <= int(resp.status) < 400
            if "tcpSocket" in probe:
                with socket.create_connection((self.ip, self._port(c, probe["tcpSocket"]["port"])), timeout):
                    return True
            if "exec" in probe:
                res = subprocess.run(
                    ["ip", "netns", "exec", self.netns, *probe["exec"]["command"]],
                    env=self.envs[c.name], capture_output=True, timeout=timeout, check=False,
                )  # fmt: skip
                return res.returncode == 0
        except (OSError, urllib.error.URLError, subprocess.TimeoutExpired, ValueError):
            return False
        return False

    def _phase(self) -> str:
        cs = self.containers
        if any(c.proc is not None and c.proc.poll() is None for c in cs) or any(
            c.restart_at is not None for c in cs
        ):
            return "Running"
        if cs and all(c.terminated is not None for c in cs):
            return (
                "Succeeded" if all(c.terminated and c.terminated["exitCode"] == 0 for c in cs) else "Failed"
            )
        if any(c.terminated is not None for c in cs):
            return "Running"
        return "Pending"

    # ---- status

    def _write_status(self) -> None:
        ready = bool(self.containers) and all(c.ready for c in self.containers)
        t = now_iso()
        prev = {c["type"]: c for c in (self.last_status or {}).get("conditions", [])}

        def cond(kind: str, ok: bool, reason: str = "") -> dict[str, Any]:
            s = "True" if ok else "False"
            old = prev.get(kind)
            since = old["lastTransitionTime"] if old and old["status"] == s else t
            out: dict[str, Any] = {
                "type": kind,
                "status": s,
                "lastProbeTime": None,
                "lastTransitionTime": since,
            }
            if reason and not ok:
                out["reason"] = reason
            return out

        not_ready = "PodCompleted" if self.phase in ("Succeeded", "Failed") else "ContainersNotReady"
        status: dict[str, Any] = {
            "phase": self.phase,
            "hostIP": self.agent.node_ip,
            "hostIPs": [{"ip": self.agent.node_ip}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": [
                cond("PodReadyToStartContainers", self.net_up or self.phase in ("Succeeded", "Failed")),
                cond("Initialized", True),
                cond("Ready", ready, not_ready),
                cond("ContainersReady", ready, not_ready),
                cond("PodScheduled", True),
            ],
            "containerStatuses": [c.status(self.uid) for c in self.containers],
        }
        if self.message:
            status["message"] = self.message
        if status == self.last_status:
            return
        self.agent.patch_status(self.ns, self.name, self.uid, status)
        self.last_status = status


class MissingReference(Exception):
    """A ConfigMap, Secret or key the pod references does not exist (yet)."""


def cpu_quantity(q: Any) -> float:
    s = str(q)
    return float(s[:-1]) / 1000 if s.endswith("m") else float(s)


def cpu_nice(resources: Mapping[str, Any]) -> int:
    """A stand-in for what a CPU request buys on a real node: a higher CFS weight (a nice level).

    In a cluster the load Job's 1-CPU request gives it a CPU's worth of time on a node where the
    control plane does not run; here every pod shares 2 cores with the whole control plane (and
    other tests), which made the load generator's event-loop lag budget fail the measurement. A
    container gets nice -10 per requested CPU (at most -10, ~9x the default weight); no request
    stays at the default.
    """
    requests = resources.get("requests") or resources.get("limits") or {}
    cpu = requests.get("cpu")
    if cpu is None:
        return 0
    return -min(10, round(10 * cpu_quantity(cpu)))


def expand(s: str, env: Mapping[str, str]) -> str:
    """The kubelet's $(VAR) expansion: $(VAR) -> value when defined, $$ -> $."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, s)


# ------------------------------------------------------------------ the agent


class NodeAgent:
    """Runs the pods bound to ``nodes``; see the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: list[str],
        workdir: Path,
        *,
        venv_bin: Path | None = None,
        probe_scale: float = 0.2,
        tick: float = 0.5,
        node_ip: str = "127.0.0.1",
    ) -> None:
        from kubernetes import client, config

        self.cluster = cluster
        self.nodes = set(nodes)
        self.workdir = workdir
        self.venv_bin = venv_bin or Path(sys.executable).parent
        #: What a container runs from the host (the venv, and the checkout its editable install points
        #: into): a pod's mount over an ancestor of these (the chart's /tmp emptyDir, with the checkout
        #: under /tmp) would hide them, so they are stashed before such a mount and bound back after.
        self.host_code = sorted({self.venv_bin.parent.resolve(), Path(__file__).resolve().parents[2]})
        self.stash_dir = Path("/run") / f"specdecode-node-agent-{os.getpid()}-{id(self):x}"
        self.probe_scale = probe_scale
        self.tick = tick
        self.node_ip = node_ip
        self.pid = os.getpid()
        k = next(_instances)
        self.id = f"{self.pid}" + (f"a{k}" if k else "")
        self.bridge = f"sdbr{self.id}"
        self.state_file = STATE_DIR / f"{self.id}.mounts"
        self.api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(self.api_client)
        self.pods: dict[str, PodRuntime] = {}
        self.launched: list[subprocess.Popen[bytes]] = []
        self.finished: set[str] = set()
        self.next_index = 2
        self.created_mount_points: list[Path] = []
        self.mount_lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="node-agent", daemon=True)
        self.relay: TcpRelay | None = None
        self.services: dict[tuple[str, str], list[str]] = {}
        self.errors: list[str] = []
        self.node_env: dict[str, dict[str, str]] = {}
        """Extra environment of every container started on a node, by node name: the node's own
        configuration (e.g. `SPECDECODE_SIM_SPEED_FACTOR`, a simulated host's speed). The pod's `env` wins."""
        self.log_file = workdir / "node-agent.log"
        self.api_host = "kubernetes.default.svc"
        self.api_port = 0
        self.subnet = ipaddress.IPv4Network(f"{SUBNET_BASE}.0.0/24")
        self.prefix = 24
        self.gateway = ""

    # ---- start / stop

    def start(self) -> NodeAgent:
        self.workdir.mkdir(parents=True, exist_ok=True)
        swept = sweep_orphans()
        if swept:
            self.log(f"removed leftovers of dead agents: {swept}")
        self.subnet = self._free_subnet()
        self.gateway = str(self.subnet.network_address + 1)
        atexit.register(self.stop)
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.gateway}/{self.prefix}", "dev", self.bridge)
        run("sysctl", "-qw", f"net.ipv4.conf.{self.bridge}.route_localnet=1")
        run("ip", "link", "set", self.bridge, "up")
        # Host -> pods: out of the bridge, not to lo (also when policy rules keep `local` separate).
        run("ip", "route", "add", str(self.subnet), "dev", self.bridge, "table", "local", check=False)
        u = self.cluster.api_url.removeprefix("https://")
        api_host, _, port = u.rpartition(":")
        self.api_port = int(port)
        self.relay = TcpRelay((self.gateway, self.api_port), (api_host, self.api_port))
        self.relay.start()
        self.thread.start()
        return self

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = run("ip", "-o", "-4", "addr", "show", check=False).stdout
        for k in range(1, 255):
            if f" {SUBNET_BASE}.{k}.1/" not in used:
                return ipaddress.IPv4Network(f"{SUBNET_BASE}.{k}.0/24")
        raise RuntimeError("no free 127.65.K.0/24 subnet")

    def stop(self) -> None:
        """Stop every pod, remove every namespace, veth, the bridge, temp files and mount points."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(10)
        for rt in list(self.pods.values()):
            rt.stop(grace=1.0)
        self.pods.clear()
        shutil.rmtree(self.stash_dir, ignore_errors=True)  # empty mount points of the pods' namespaces
        if self.relay is not None:
            self.relay.stop()
        run("ip", "link", "del", self.bridge, check=False)
        for ns in netns_list():  # anything of ours a failed setup left
            if ns.startswith(f"sd{self.id}-"):
                delete_netns(ns)
        remove_mount_points(self.created_mount_points)
        self.created_mount_points.clear()
        self.state_file.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            STATE_DIR.rmdir()  # when no other agent uses it
        with contextlib.suppress(Exception):
            self.api_client.close()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, msg: str) -> None:
        with self.log_file.open("a") as f:
            f.write(f"{now_iso()} {msg}\n")

    # ---- the sync loop

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sync()
            except Exception as e:
                self.log(f"sync: {type(e).__name__}: {e}")
                self.errors.append(f"{type(e).__name__}: {e}")
            self.stopping.wait(self.tick)

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        return dict(json.loads(resp.data))

    def sync(self) -> None:
        all_pods = self._json(self.core.list_pod_for_all_namespaces(_preload_content=False))["items"]
        pods = [p for p in all_pods if p["spec"].get("nodeName") in self.nodes]
        self._sync_services(all_pods)
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            rt = self.pods.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                if rt is not None:
                    rt.stop(grace)
                    del self.pods[uid]
                self._delete(pod)
                continue
            if rt is None and uid not in self.finished:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    self.finished.add(uid)
                    continue
                index = self.next_index
                self.next_index += 1
                if index >= self.subnet.num_addresses - 1:
                    raise RuntimeError("the agent's pod subnet is exhausted")
                ip = str(self.subnet.network_address + index)
                rt = PodRuntime(self, pod, index, ip)
                self.pods[uid] = rt
                self.log(f"pod {rt.ns}/{rt.name} -> {ip} ({rt.netns})")
                rt.start()
            elif rt is not None:
                rt.pod = pod
                rt.write_hosts()
        for uid in [u for u in self.pods if u not in seen]:  # gone without us (force delete, node gone)
            self.pods.pop(uid).stop(grace=0)

    def _delete(self, pod: dict[str, Any]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def _sync_services(self, all_pods: list[dict[str, Any]]) -> None:
        """Service -> ready pod IPs, from each Service's selector and the pods' Ready condition.

        What the EndpointSlice controller computes; its slices can't be used here: the API server
        refuses loopback addresses in EndpointSlices, so those of these Services stay empty.
        """
        services = self._json(self.core.list_service_for_all_namespaces(_preload_content=False))["items"]
        ready: dict[str, list[dict[str, Any]]] = {}
        for p in all_pods:
            st = p.get("status") or {}
            conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
            if (
                st.get("podIP")
                and conds.get("Ready") == "True"
                and not p["metadata"].get("deletionTimestamp")
            ):
                ready.setdefault(p["metadata"]["namespace"], []).append(p)
        found: dict[tuple[str, str], list[str]] = {}
        for s in services:
            ns, name = s["metadata"]["namespace"], s["metadata"]["name"]
            sel = s["spec"].get("selector") or {}
            ports = s["spec"].get("ports") or []
            # hosts-file resolution can't translate ports: only Services whose port is the target port
            same_port = all(
                isinstance(p.get("targetPort"), str) or int(p.get("targetPort", p["port"])) == int(p["port"])
                for p in ports
            )
            if not sel or not same_port:
                continue
            found[(ns, name)] = sorted(
                p["status"]["podIP"]
                for p in ready.get(ns, [])
                if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())
            )
        self.services = found

    def hosts_for(self, ns: str, pod: str, ip: str) -> str:
        lines = [
            "# Kubernetes-managed hosts file (specdecode node agent: stands in for cluster DNS + kube-proxy)",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            f"{ip}\t{pod}",
            f"{self.gateway}\tkubernetes kubernetes.default kubernetes.default.svc "
            "kubernetes.default.svc.cluster.local",
        ]
        for (sns, name), addrs in sorted(self.services.items()):
            if not addrs or (sns, name) == ("default", "kubernetes"):
                continue
            names = [f"{name}.{sns}", f"{name}.{sns}.svc", f"{name}.{sns}.svc.cluster.local"]
            if sns == ns:
                names.insert(0, name)
            lines.append(f"{addrs[0]}\t{' '.join(names)}")
        return "\n".join(lines) + "\n"

    # ---- API helpers used by pods

    def patch_status(self, ns: str, name: str, uid: str, status: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        body = {"metadata": {"uid": uid}, "status": status}
        try:
            self.core.patch_namespaced_pod_status(name, ns, body)
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise
            self.log(f"status of {ns}/{name}: {e.status} {e.reason}")

    def config_map(self, ns: str, name: str, optional: bool | None) -> dict[str, bytes] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self._json(self.core.read_namespaced_config_map(name, ns, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                if optional:
                    return None
                raise MissingReference(f'configmap "{name}" not found') from e
            raise
        data = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        return data

    def secret(self, ns: str, name: str, optional: bool | None) -> dict[str, bytes] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            s = self._json(self.core.read_namespaced_secret(name, ns, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                if optional:
                    return None
                raise MissingReference(f'secret "{name}" not found') from e
            raise
        return {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}

    def claim_path(self, ns: str, name: str) -> Path:
        """The host directory of a bound PersistentVolumeClaim's volume (a `hostPath` or `local` PV).

        The binding itself is the real kube-controller-manager's (its PV binder); like the kubelet, a
        pod whose claim is missing or not yet bound waits in ContainerCreating.
        """
        from kubernetes.client.exceptions import ApiException

        try:
            claim = self._json(
                self.core.read_namespaced_persistent_volume_claim(name, ns, _preload_content=False)
            )
        except ApiException as e:
            if e.status == 404:
                raise MissingReference(f'persistentvolumeclaim "{name}" not found') from e
            raise
        volume = claim["spec"].get("volumeName")
        if (claim.get("status") or {}).get("phase") != "Bound" or not volume:
            raise MissingReference(f'persistentvolumeclaim "{name}" is not bound')
        pv = self._json(self.core.read_persistent_volume(volume, _preload_content=False))["spec"]
        source = pv.get("hostPath") or pv.get("local")
        if source is None:
            raise RuntimeError(
                f"persistentvolume {volume}: only hostPath and local volumes are supported by the node agent"
            )
        path = Path(source["path"])
        if not path.is_dir():
            if source.get("type") not in (None, "", "DirectoryOrCreate"):
                raise MissingReference(f"persistentvolume {volume}: {path} is not a directory")
            path.mkdir(parents=True)
        return path

    def token(self, ns: str, sa: str, pod: str, uid: str, src: dict[str, Any]) -> str:
        """A bound ServiceAccount token from the TokenRequest API, as the kubelet gets it."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[src["audience"]] if src.get("audience") else [],
                expiration_seconds=int(src.get("expirationSeconds", 3607)),
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=pod, uid=uid
                ),
            )
        )
        try:
            resp = self.core.create_namespaced_service_account_token(sa, ns, request)
        except ApiException as e:
            if e.status == 404:
                raise MissingReference(f'serviceaccount "{sa}" not found') from e
            raise
        assert resp.status is not None
        return str(resp.status.token)

    def ensure_mount_point(self, path: Path, *, directory: bool) -> None:
        """Mount points must exist on the host's file system; the agent removes those it made."""
        with self.mount_lock:
            if path.exists():
                return
            missing = []
            p = path
            while not p.exists():
                missing.append(p)
                p = p.parent
            if directory:
                path.mkdir(parents=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            self.created_mount_points.extend(reversed(missing))
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            with self.state_file.open("a") as f:  # for the sweep, should this process be killed
                f.writelines(f"{p}\n" for p in reversed(missing))

    def pod_log(self, pod: dict[str, Any], lines: int = 60) -> str:
        """The tail of the container logs of ``pod`` (the agent writes them under its workdir)."""
        meta = pod["metadata"]
        d = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        out = []
        for log in sorted(d.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log}\n" + "\n".join(text))
        return "\n".join(out) or f"(no logs in {d})"

    def leftovers(self) -> dict[str, list[str]]:
        """What of this agent is still there: live processes it started, namespaces, links, files."""
        left = agent_leftovers(self.id)
        left["processes"] = [str(p.pid) for p in self.launched if p.poll() is None]
        left["mount_points"] = [str(p) for p in self.created_mount_points if p.exists()]
        left["state"] = [str(self.state_file)] if self.state_file.exists() else []
        left["volumes"] = [str(p) for p in (self.workdir / "pods").glob("*/volumes")]
        return left
