"""Many experiments on one operator replica, against the real control plane (issue 16).

Starts the e2e harness's control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok),
kwok GPU nodes for every arm and one untainted kwok CPU node for the load Jobs, the real Prometheus
of the e2e tests, and ONE `specdecode operator` process (`tests/e2e/operator_process.py`, with the
operator's default tick interval unless `--interval` says otherwise). Then it creates `--experiments`
experiments at once and measures, per experiment, with its own monotonic clock and watches:

- apply -> first child: from just before the experiment's POST to the first of its arm Deployments
  seen on a Deployment watch (creationTimestamp has 1 s resolution); also -> both arms;
- results -> verdict: from the moment the load Job's results are stored and the Job is Complete
  (the later of the two) to `status.verdict` seen on the experiment watch; also from the results
  stored alone;
- writes: the experiment's MODIFIED events from apply to its end (each status PATCH that changed
  something, and kopf's finalizer): a status patch storm would show here.

How the arms and the load get there without running anything:

- arms: kwok marks their pods Running and Ready. The verdict needs Prometheus to scrape both arms
  (Deploying waits for it; Analyzing reads the stage windows from it), and kwok's pods serve
  nothing, so this script serves a vLLM-style `/metrics` (one gauge) at each arm pod's IP, port 8000
  (kwok's pod IPs are loopback addresses), where the real Prometheus, discovering pods through the
  API server with the project's scrape config, scrapes it. Prometheus therefore reports the arms
  `up` and no vLLM counters: the verdict is judged on the load Job's records, as it is whenever a
  counter is missing.
- load: the load Jobs' pods land on an untainted CPU node `load-0` whose pods kwok leaves alone;
  this script is their kubelet and their load generator. `--load-seconds` after it sees an
  experiment's load pod (plus `rank x --spread / N`, to stagger the ends), it stores results the way
  the load pod does at its end (`results.upload`: `<exp>-results-N`, owned by the experiment and
  by the Job's uid from the pod's owner reference, annotated with the generation, the bundle digest
  the operator checks), from a synthetic run of known effect (`tests/report/synthetic.py`, speed-up
  1.3, `--requests` pairs) whose stage window ends as it is stored; then it writes the pod's
  status `Succeeded` (container exited 0), and the Job controller marks the Job Complete.
  `--spread 0` (the default) ends every load at once: the worst burst for the operator.

While it runs it samples the operator's /proc: VmRSS, VmHWM and CPU time (utime + stime). Prints
a summary and writes JSON (`--json`).

    PYTHONPATH=operator:. .venv/bin/python benchmarks/scale/many_experiments.py --experiments 50 \\
        --json benchmarks/scale/many-experiments.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.server
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for path in (REPO / "tests" / "e2e", REPO / "operator", REPO):  # the e2e harness, the package, tests/
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import kubernetes  # noqa: E402
from experiment_crd import CRD_FILE, CRD_NAME  # noqa: E402
from experiment_crd import experiment as kwok_experiment  # noqa: E402
from fake_gpu_nodes import GPUS_PER_NODE, cpu_node, gpu_node  # noqa: E402
from k8s_cluster import FEATURE_GATES, Cluster, ControlPlane, find_bin_dir, wait_for  # noqa: E402
from operator_process import OperatorProcess  # noqa: E402
from prometheus_server import Prometheus  # noqa: E402

from specdecode import results  # noqa: E402
from specdecode.controller import kube  # noqa: E402
from specdecode.experiment import keys, manifests, validation  # noqa: E402

NAMESPACE = "scale"
LOAD_NODE = "load-0"  # the load pods' node: kwok keeps it Ready, this script completes its pods
GROUP, VERSION, PLURAL = "specdecode.io", "v1alpha1", "specdecodeexperiments"
ARM_PORT = 8000  # the arms' prometheus.io/port
METRICS = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{model_name="sim/llama-8b",engine="0"} 0\n'
)


def experiment(name: str, requests: int) -> dict[str, Any]:
    """test_operator.py's kwok experiment, with `requests` pairs, long deadlines and the operator's
    Prometheus (the benchmark's)."""
    doc: dict[str, Any] = kwok_experiment(
        name,
        workload={
            "stages": [{"name": "c1", "concurrency": 1}],
            "requestsPerStage": requests,
            "warmupRequests": 0,
        },
        deadlines={"deploy": "15m", "run": "15m"},
    )
    del doc["spec"]["prometheus"]
    return doc


# ------------------------------------------------------------------------------ the arms' metrics


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(METRICS)))
        self.end_headers()
        self.wfile.write(METRICS)

    def log_message(self, *_: Any) -> None:
        pass


class ArmTargets:
    """A `/metrics` at `<pod IP>:8000` for each kwok arm pod, for the real Prometheus to scrape."""

    def __init__(self) -> None:
        self._servers: dict[str, http.server.ThreadingHTTPServer] = {}
        self._lock = threading.Lock()

    def serve(self, ip: str) -> None:
        with self._lock:
            if ip in self._servers:
                return
            server = http.server.ThreadingHTTPServer((ip, ARM_PORT), _Metrics)
            server.daemon_threads = True
            self._servers[ip] = server
        threading.Thread(target=server.serve_forever, name=f"metrics-{ip}", daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            for server in self._servers.values():
                server.shutdown()
                server.server_close()
            self._servers.clear()


# ---------------------------------------------------------------------------------- measurements


@dataclass
class Timeline:
    """One experiment's moments on this script's monotonic clock."""

    applied: float | None = None
    uid: str = ""
    arms: list[float] = field(default_factory=list)
    job_added: float | None = None
    results_stored: float | None = None
    job_complete: float | None = None
    verdict_at: float | None = None
    verdict: str | None = None
    phase: str | None = None
    reason: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    writes: int = 0  # MODIFIED events of the experiment: its status PATCHes and kopf's finalizer

    def row(self, name: str) -> dict[str, Any]:
        ready = max(self.results_stored or 0.0, self.job_complete or 0.0) or None
        return {
            "name": name,
            "applyToFirstChildS": _delta(self.applied, min(self.arms) if self.arms else None),
            "applyToBothArmsS": _delta(self.applied, max(self.arms) if len(self.arms) == 2 else None),
            "resultsToVerdictS": _delta(ready, self.verdict_at),
            "resultsStoredToVerdictS": _delta(self.results_stored, self.verdict_at),
            "jobCompleteAfterResultsS": _delta(self.results_stored, self.job_complete),
            "verdict": self.verdict,
            "phase": self.phase,
            "reason": self.reason,
            "phasesAfterApplyS": {k: _delta(self.applied, v) for k, v in self.phases.items()},
            "experimentWrites": self.writes,
        }


def _delta(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 4)


class Recorder:
    """Watches Deployments, Jobs, pods and experiments in the namespace; stores results for each load
    Job as it appears."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        files: Callable[[], dict[str, str]],
        *,
        experiments: int,
        load_seconds: float,
        spread: float,
    ) -> None:
        self.api = api
        self.core = kubernetes.client.CoreV1Api(api)
        self.files = files
        self.experiments = experiments
        self.load_seconds = load_seconds
        self.spread = spread
        self.loads: set[str] = set()
        self.lines: dict[str, Timeline] = {}
        self.lock = threading.Lock()
        self.targets = ArmTargets()
        self.stop = threading.Event()
        self.writers = ThreadPoolExecutor(max_workers=max(4, experiments), thread_name_prefix="load")
        self.errors: list[str] = []
        self.kube = kube.Kube(api)

    def line(self, name: str) -> Timeline:
        with self.lock:
            return self.lines.setdefault(name, Timeline())

    def start(self) -> None:
        core = kubernetes.client.CoreV1Api(self.api)
        apps = kubernetes.client.AppsV1Api(self.api)
        batch = kubernetes.client.BatchV1Api(self.api)
        custom = kubernetes.client.CustomObjectsApi(self.api)
        watches: list[tuple[Callable[..., Any], tuple[Any, ...], Callable[[str, dict[str, Any]], None]]] = [
            (apps.list_namespaced_deployment, (NAMESPACE,), self._deployment),
            (batch.list_namespaced_job, (NAMESPACE,), self._job),
            (core.list_namespaced_pod, (NAMESPACE,), self._pod),
            (custom.list_namespaced_custom_object, (GROUP, VERSION, NAMESPACE, PLURAL), self._experiment),
        ]
        for lister, args, handle in watches:
            threading.Thread(target=self._watch, args=(lister, args, handle), daemon=True).start()

    def _watch(
        self, lister: Callable[..., Any], args: tuple[Any, ...], handle: Callable[[str, dict[str, Any]], None]
    ) -> None:
        version = ""
        while not self.stop.is_set():
            try:
                w = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
                kwargs: dict[str, Any] = {"timeout_seconds": 60, "_request_timeout": 90}
                if version:
                    kwargs["resource_version"] = version
                for event in w.stream(lister, *args, **kwargs):  # type: ignore[no-untyped-call]
                    obj = event["object"]
                    raw = obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
                    version = raw["metadata"].get("resourceVersion") or version
                    handle(event["type"], raw)
                    if self.stop.is_set():
                        return
            except Exception as exc:  # a watch that expired (410) or broke: list again
                version = ""
                if not self.stop.is_set():
                    self.errors.append(f"watch {lister.__name__}: {exc}"[:300])
                    time.sleep(0.5)

    def _deployment(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        labels = obj["metadata"].get("labels") or {}
        exp = labels.get(keys.LABEL_EXPERIMENT)
        if kind == "ADDED" and exp:
            line = self.line(exp)
            with self.lock:
                if len(line.arms) < 2:
                    line.arms.append(now)

    def _pod(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        ip = (obj.get("status") or {}).get("podIP")
        if kind != "DELETED" and ip and labels.get("specdecode.io/arm"):
            self.targets.serve(ip)
        exp = labels.get(keys.LABEL_EXPERIMENT)
        job = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Job"), None)
        placed = (obj.get("spec") or {}).get("nodeName") == LOAD_NODE
        if kind == "DELETED" or not (exp and job and placed) or meta["name"] in self.loads:
            return
        self.loads.add(meta["name"])
        rank = int(exp.rsplit("-", 1)[1])
        due = now + self.load_seconds + rank * self.spread / max(1, self.experiments)
        self.writers.submit(self._load, exp, meta, job, due)

    def _job(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        meta = obj["metadata"]
        exp = (meta.get("labels") or {}).get(keys.LABEL_EXPERIMENT)
        if not exp or meta["name"] != manifests.Names(exp).load_job:
            return
        line = self.line(exp)
        if kind == "ADDED" and line.job_added is None:
            line.job_added = now
        conditions = (obj.get("status") or {}).get("conditions") or []
        if line.job_complete is None and any(
            c.get("type") == "Complete" and c.get("status") == "True" for c in conditions
        ):
            line.job_complete = now

    def _load(self, exp: str, pod: dict[str, Any], job: dict[str, Any], due: float) -> None:
        """The load pod's end: its results stored as cli.py stores them (`results.upload`, owned by
        the experiment and the Job), then the pod `Succeeded`, as its kubelet reports an exit 0."""
        time.sleep(max(0.0, due - time.monotonic()))
        line = self.line(exp)
        owners = [
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SpecDecodeExperiment",
                "name": exp,
                "uid": line.uid,
            },
            {"apiVersion": "batch/v1", "kind": "Job", "name": job["name"], "uid": job["uid"]},
        ]
        generation = int((pod.get("annotations") or {}).get(keys.GENERATION_ANNOTATION) or 1)
        try:
            with tempfile.TemporaryDirectory(prefix="load-results-") as tmp:
                for name, text in self.files().items():
                    Path(tmp, name).write_text(text)
                asyncio.run(
                    results.upload(
                        self.kube,
                        Path(tmp),
                        namespace=NAMESPACE,
                        prefix=manifests.Names(exp).results_prefix,
                        experiment=exp,
                        owners=owners,
                        generation=generation,
                    )
                )
            line.results_stored = time.monotonic()
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            exited = {"exitCode": 0, "reason": "Completed", "startedAt": stamp, "finishedAt": stamp}
            containers = [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": exited},
                }
                for c in self._containers(pod["name"])
            ]
            ended = {"phase": "Succeeded", "startTime": stamp, "containerStatuses": containers}
            self.core.patch_namespaced_pod_status(pod["name"], NAMESPACE, {"status": ended})
        except Exception as exc:
            self.errors.append(f"ending {exp}'s load: {exc}"[:300])

    def _containers(self, pod: str) -> list[dict[str, Any]]:
        found = self.api.sanitize_for_serialization(self.core.read_namespaced_pod(pod, NAMESPACE))  # type: ignore[no-untyped-call]
        return list(found["spec"]["containers"])

    def _experiment(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        line = self.line(obj["metadata"]["name"])
        status = obj.get("status") or {}
        phase = status.get("phase")
        with self.lock:
            line.uid = line.uid or obj["metadata"]["uid"]
            line.writes += kind == "MODIFIED"
            if phase and phase not in line.phases:
                line.phases[phase] = now
            line.phase, line.reason = phase, status.get("reason")
            if status.get("verdict") and line.verdict_at is None:
                line.verdict_at, line.verdict = now, status["verdict"]

    def close(self) -> None:
        self.stop.set()
        self.writers.shutdown(wait=True)
        self.targets.stop()


class ProcSampler:
    """The operator's VmRSS, VmHWM and CPU time, every `period` seconds, from /proc."""

    def __init__(self, pid: int, period: float = 0.25) -> None:
        self.pid = pid
        self.period = period
        self.samples: list[tuple[float, int, int, float]] = []  # (t, rss KiB, hwm KiB, cpu s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> tuple[float, int, int, float]:
        status = Path(f"/proc/{self.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / self._tick  # utime, stime (fields 14, 15)
        return time.monotonic(), _kib(fields["VmRSS"]), _kib(fields["VmHWM"]), cpu

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.samples.append(self.sample())
            except (OSError, KeyError, IndexError, ValueError):
                return

    def start(self) -> None:
        self.samples.append(self.sample())
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _kib(value: str) -> int:
    return int(value.split()[0])


# ------------------------------------------------------------------------------------------- run


def synthetic_files(requests: int) -> Callable[[], dict[str, str]]:
    """The load Job's three files of a run of known effect (speed-up 1.3); the stage windows end
    when they are stored (the load ran after Prometheus reported both arms scraped)."""
    from tests.report import synthetic

    parsed, _ = validation.parse_experiment(experiment("x", requests))
    assert parsed is not None
    recs, windows = synthetic.run(parsed, n=requests, warmup=0)
    lines = "".join(r.model_dump_json() + "\n" for r in recs)
    span = max(w.end for w in windows)
    doc_windows = [w.model_dump(mode="json") for w in windows]

    def files() -> dict[str, str]:
        anchor = {"monotonic": 0.0, "wall": time.time() - span}
        return {
            "requests.jsonl": lines,
            "windows.json": json.dumps({"anchor": anchor, "windows": doc_windows}),
            "loadgen-summary.json": json.dumps({"validity": {"valid": True, "reasons": []}}),
        }

    return files


def _outcomes(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many experiments ended how: the verdict, else the phase and reason."""
    found: dict[str, int] = {}
    for row in rows:
        key = str(row["verdict"] or f"{row['phase']}/{row['reason']}")
        found[key] = found.get(key, 0) + 1
    return found


def summary(values: Sequence[float | None]) -> dict[str, float | int | None]:
    found = sorted(v for v in values if v is not None)
    if not found:
        return {"n": 0, "median": None, "p99": None, "max": None}
    p99 = statistics.quantiles(found, n=100, method="inclusive")[98] if len(found) > 1 else found[0]
    return {
        "n": len(found),
        "median": round(statistics.median(found), 3),
        "p99": round(p99, 3),
        "max": round(found[-1], 3),
    }


@dataclass
class Harness:
    """The control plane, Prometheus and the operator, stopped in reverse order."""

    workdir: Path
    control_plane: ControlPlane | None = None
    prometheus: Prometheus | None = None
    operator: OperatorProcess | None = None

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.control_plane is not None:
            self.control_plane.stop()


def start(workdir: Path, experiments: int, interval: float, log: Callable[[str], None]) -> Harness:
    harness = Harness(workdir)
    try:
        harness.control_plane = ControlPlane(
            find_bin_dir(), workdir=workdir / "k8s", feature_gates=FEATURE_GATES, agent_nodes=(LOAD_NODE,)
        )
        cluster = harness.control_plane.start()
        log(f"control plane up in {harness.control_plane.timings['total']:.1f}s ({workdir})")
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
        wait_for(f"{CRD_NAME} Established", lambda: _established(cluster))
        gpu_nodes = max(2, math.ceil(2 * experiments / GPUS_PER_NODE))
        nodes = [gpu_node(f"kwok-gpu-{i}") for i in range(gpu_nodes)] + [cpu_node(LOAD_NODE)]
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
        )
        wait_for("the kwok nodes Ready", lambda: _ready_nodes(cluster) >= len(nodes), timeout=120)
        cluster.kubectl("create", "namespace", NAMESPACE)
        harness.prometheus = Prometheus(cluster, workdir=workdir / "prometheus")
        harness.prometheus.start()
        harness.operator = OperatorProcess(
            cluster,
            NAMESPACE,
            workdir,
            env={
                "SPECDECODE_PROMETHEUS_URL": harness.prometheus.url,
                "SPECDECODE_INTERVAL": str(interval),
                "SPECDECODE_UNSCHEDULABLE_GRACE": "60",
                "SPECDECODE_ANALYSIS_GRACE": "300",
            },
        )
        harness.operator.start()
        healthz = f"http://127.0.0.1:{harness.operator.liveness_port}/healthz"
        harness.operator.wait("the operator's liveness", lambda: _fetch(healthz), timeout=120)
    except BaseException:
        harness.stop()
        raise
    return harness


def _established(cluster: Cluster) -> bool:
    conditions = cluster.get_json(f"crd/{CRD_NAME}").get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _ready_nodes(cluster: Cluster) -> int:
    nodes = cluster.get_json("nodes")["items"]
    return sum(
        any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
        for n in nodes
    )


def _fetch(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def run(args: argparse.Namespace) -> dict[str, Any]:
    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="specdecode-scale-") as tmp:
        harness = start(Path(tmp), args.experiments, args.interval, log)
        try:
            return measure(harness, args, started, log)
        finally:
            if args.keep_logs:
                log_dir = Path(args.keep_logs)
                log_dir.mkdir(parents=True, exist_ok=True)
                assert harness.operator is not None
                (log_dir / "operator.log").write_bytes(harness.operator.log.read_bytes())
            harness.stop()


def measure(
    harness: Harness, args: argparse.Namespace, started: datetime.datetime, log: Callable[[str], None]
) -> dict[str, Any]:
    assert harness.operator is not None and harness.operator.process is not None
    cluster = harness.operator.cluster
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    recorder = Recorder(
        api,
        synthetic_files(args.requests),
        experiments=args.experiments,
        load_seconds=args.load_seconds,
        spread=args.spread,
    )
    recorder.start()
    sampler = ProcSampler(harness.operator.process.pid)
    sampler.start()
    time.sleep(2.0)  # the watches established, the operator idle: the baseline sample
    baseline = sampler.samples[-1]
    custom = kubernetes.client.CustomObjectsApi(api)
    names = [f"exp-{i:03d}" for i in range(args.experiments)]
    log(f"applying {len(names)} experiments")
    for name in names:
        recorder.line(name).applied = time.monotonic()
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, experiment(name, args.requests)
        )
    first_apply = recorder.line(names[0]).applied or 0.0
    deadline = time.monotonic() + args.timeout
    last_report = 0.0
    while time.monotonic() < deadline:
        if harness.operator.process.poll() is not None:
            raise RuntimeError(f"the operator exited:\n{harness.operator.log_tail()}")
        lines = [recorder.line(n) for n in names]
        ended = [line for line in lines if line.verdict or line.phase in ("Failed", "Completed")]
        if time.monotonic() - last_report > 15:
            phases: dict[str, int] = {}
            for line in lines:
                phases[line.phase or "-"] = phases.get(line.phase or "-", 0) + 1
            log(f"phases: {phases}; operator RSS {sampler.samples[-1][1] / 1024:.0f} MiB")
            last_report = time.monotonic()
        if len(ended) == len(names):
            break
        time.sleep(0.5)
    finished = time.monotonic()
    time.sleep(2.0)  # a little after the last verdict: the operator idle again
    sampler.stop()
    recorder.close()
    rows = [recorder.line(n).row(n) for n in names]
    samples = sampler.samples
    during = [s for s in samples if first_apply <= s[0] <= finished]
    cpu_s = samples[-1][3] - baseline[3]
    wall_s = finished - first_apply
    result = {
        "benchmark": "many experiments on one operator replica (issue 16)",
        "command": " ".join(["benchmarks/scale/many_experiments.py", *sys.argv[1:]]),
        "date": started.isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "memoryGiB": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "gpu": None,
        },
        "experiments": args.experiments,
        "operatorIntervalS": args.interval,
        "requestsPerExperiment": args.requests,
        "loadSeconds": args.load_seconds,
        "loadEndsSpreadS": args.spread,
        "applyToFirstChildS": summary([r["applyToFirstChildS"] for r in rows]),
        "applyToBothArmsS": summary([r["applyToBothArmsS"] for r in rows]),
        "resultsToVerdictS": summary([r["resultsToVerdictS"] for r in rows]),
        "resultsStoredToVerdictS": summary([r["resultsStoredToVerdictS"] for r in rows]),
        "jobCompleteAfterResultsS": summary([r["jobCompleteAfterResultsS"] for r in rows]),
        "experimentWrites": summary([r["experimentWrites"] for r in rows]),
        "outcomes": _outcomes(rows),
        "operator": {
            "rssMiBBaseline": round(baseline[1] / 1024, 1),
            "rssMiBPeak": round(max(s[1] for s in samples) / 1024, 1),
            "vmHwmMiB": round(samples[-1][2] / 1024, 1),
            "rssMiBEnd": round(samples[-1][1] / 1024, 1),
            "cpuSeconds": round(cpu_s, 2),
            "wallSeconds": round(wall_s, 1),
            "cpuPercentOfOneCore": round(100 * cpu_s / wall_s, 1) if wall_s > 0 else None,
            "samples": len(during),
        },
        "watchErrors": recorder.errors[:20],
        "perExperiment": rows,
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=50)
    parser.add_argument("--requests", type=int, default=200, help="pairs per experiment's results")
    parser.add_argument("--load-seconds", type=float, default=5.0, help="each load's run, from its pod")
    parser.add_argument("--spread", type=float, default=0.0, help="seconds over which the loads' ends spread")
    parser.add_argument("--interval", type=float, default=5.0, help="the operator's tick (its default: 5)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every verdict")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--keep-logs", help="copy the operator's log into this directory")
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    brief = {k: v for k, v in result.items() if k not in ("perExperiment",)}
    print(json.dumps(brief, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
