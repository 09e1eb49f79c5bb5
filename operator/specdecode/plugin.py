"""`kubectl specdecode`: the experiments of a cluster from the command line (a kubectl plugin, as
Argo Rollouts' `kubectl argo rollouts`).

The console script `kubectl-specdecode` is found by kubectl's plugin discovery when the package's
bin directory is on PATH. Every read and write goes through the real `kubectl` (`$KUBECTL`, else
`kubectl` on PATH), so the kubeconfig, context, credentials plugins and RBAC are kubectl's own;
`--context`, `--kubeconfig`, `-n`/`--namespace` and `-A` are passed on to it.

    get [NAME]         phase, verdict and the speed-up of every stage (one experiment: in detail)
    report NAME        writes the report (report.html) from the report ConfigMap of status.resultsRef
    watch NAME         phase changes and the stages the load finished, until Completed or Failed
    abort NAME         ends the experiment: Failed, reason Aborted, arms and load Job deleted

Exit statuses: 0 done; 1 kubectl failed (its message is printed) or there is nothing to show yet
(no report before the verdict); 2 usage; 3 the report file cannot be written
(`exit_status.ResultsUnwritable`); 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import gzip
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from specdecode import exit_status
from specdecode.experiment import fairness, keys, kvcache, loadpods, spec, status, telemetry

RESOURCE = f"{keys.PLURAL}.{keys.API_GROUP}"
REPORT_KEY = "report.html.gz"
"""The report ConfigMap's binaryData key (controller/collect.py: report_config_map)."""


class KubectlError(Exception):
    """`kubectl` failed; the message is its own (stderr), or why it could not run."""


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl with the user's connection flags."""

    binary: str
    flags: tuple[str, ...] = ()
    namespace: str | None = None

    def run(self, *args: str, namespaced: bool = True) -> str:
        where = ("-n", self.namespace) if namespaced and self.namespace else ()
        try:
            done = subprocess.run(
                [self.binary, *self.flags, *where, *args], capture_output=True, text=True, check=False
            )
        except OSError as exc:
            raise KubectlError(f"cannot run {self.binary}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            raise KubectlError(done.stderr.strip() or f"kubectl {' '.join(args)} exited {done.returncode}")
        return done.stdout

    def get(self, *args: str) -> dict[str, Any]:
        """`kubectl get ARGS -o json`, parsed."""
        loaded: dict[str, Any] = json.loads(self.run("get", *args, "-o", "json"))
        return loaded

    def watch(self, *args: str) -> _Watched:
        """`kubectl get ARGS -o json --watch` in the background: every version of the object, in order."""
        where = ("-n", self.namespace) if self.namespace else ()
        return _Watched([self.binary, *self.flags, *where, "get", *args, "-o", "json", "--watch"])


class _Watched:
    """The objects a `kubectl get --watch` prints (JSON documents one after another), read by a
    thread of its own: `kubectl specdecode watch` shows every phase the API server stored, even one
    shorter than its interval (Analyzing, when the judging takes less than a look). A watch that
    cannot run or ends leaves the looks to carry on alone."""

    def __init__(self, argv: list[str]) -> None:
        self.objects: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        try:
            self.process: subprocess.Popen[str] | None = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        except OSError:
            self.process = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream = self.process.stdout if self.process is not None else None
        if stream is None:
            return
        decoder, buffer = json.JSONDecoder(), ""
        for line in stream:
            buffer += line
            if not line.rstrip().endswith("}"):
                continue  # no object can end on this line: decode only where one may
            while buffer := buffer.lstrip():
                try:
                    obj, end = decoder.raw_decode(buffer)
                except ValueError:
                    break  # an object not yet complete
                buffer = buffer[end:]
                if isinstance(obj, dict):
                    self.objects.put(obj)

    def drain(self) -> list[dict[str, Any]]:
        """The objects seen since the last drain, oldest first."""
        seen = []
        while True:
            try:
                seen.append(self.objects.get_nowait())
            except queue.Empty:
                return seen

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)


def build_parser() -> argparse.ArgumentParser:
    """The plugin's command line."""
    parser = argparse.ArgumentParser(
        prog="kubectl specdecode", description="Speculative-decoding experiments on this cluster."
    )
    _connection_flags(parser, default=None)
    # Also after the command (`kubectl specdecode get -n llm`); SUPPRESS keeps a flag given before it.
    connection = argparse.ArgumentParser(add_help=False)
    _connection_flags(connection, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    get = sub.add_parser("get", parents=[connection], help="phase, verdict and per-stage speed-ups")
    get.add_argument("name", nargs="?", metavar="NAME", help="one experiment, in detail")
    get.add_argument("-A", "--all-namespaces", action="store_true", help="list every namespace's")
    report = sub.add_parser("report", parents=[connection], help="write the report (report.html)")
    report.add_argument("name", metavar="NAME")
    report.add_argument(
        "-o", "--output", default="report.html", metavar="FILE", help="where (default: %(default)s)"
    )
    watch = sub.add_parser("watch", parents=[connection], help="live progress until Completed or Failed")
    watch.add_argument("name", metavar="NAME")
    watch.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between looks (default: 2)"
    )
    abort = sub.add_parser("abort", parents=[connection], help="stop it now: Failed, reason Aborted")
    abort.add_argument("name", metavar="NAME")
    return parser


def _connection_flags(parser: argparse.ArgumentParser, *, default: Any) -> None:
    """kubectl's own flags, passed on to it."""
    parser.add_argument(
        "-n", "--namespace", default=default, help="the experiments' namespace (default: kubectl's)"
    )
    parser.add_argument("--context", default=default, help="the kubeconfig context")
    parser.add_argument("--kubeconfig", default=default, help="the kubeconfig file")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kubectl-specdecode` console script."""
    args = build_parser().parse_args(argv)
    flags = [f"--{key}={getattr(args, key)}" for key in ("context", "kubeconfig") if getattr(args, key)]
    kubectl = Kubectl(os.environ.get("KUBECTL", "kubectl"), tuple(flags), args.namespace)
    commands = {"get": _get, "report": _report, "watch": _watch, "abort": _abort}
    try:
        return commands[args.command](kubectl, args, sys.stdout)
    except KubectlError as exc:
        print(f"kubectl specdecode {args.command}: {exc}", file=sys.stderr)
        return 1
    except exit_status.ResultsUnwritable as exc:
        print(f"kubectl specdecode {args.command}: {exc}", file=sys.stderr)
        return exit_status.FAILED
    except KeyboardInterrupt:
        return exit_status.INTERRUPTED


# ------------------------------------------------------------------------------------------- get


def _get(kubectl: Kubectl, args: argparse.Namespace, out: TextIO) -> int:
    if args.name:
        print(describe(kubectl.get(RESOURCE, args.name)), file=out)
        return exit_status.OK
    every = ("--all-namespaces",) if args.all_namespaces else ()
    items = kubectl.get(RESOURCE, *every)["items"]
    if not items:
        where = "any namespace" if args.all_namespaces else f"namespace {kubectl.namespace or '(current)'}"
        print(f"No experiments found in {where}.", file=sys.stderr)
        return exit_status.OK
    print(table(items, namespaces=args.all_namespaces), file=out, end="")
    return exit_status.OK


def _status(obj: dict[str, Any]) -> status.ExperimentStatus:
    return status.ExperimentStatus.model_validate(obj.get("status") or {})


def stage_speedups(st: status.ExperimentStatus) -> str:
    """`c1 1.18x Pass, c16 0.97x Fail`: each judged stage's speed-up and verdict."""
    parts = []
    for stage in st.stages:
        estimate = stage.speedup.estimate if stage.speedup is not None else None
        speed = f"{estimate:.2f}x" if estimate is not None else "n/a"
        parts.append(f"{stage.name} {speed} {stage.verdict.value}")
    return ", ".join(parts)


def table(items: Sequence[dict[str, Any]], *, namespaces: bool = False, now: datetime | None = None) -> str:
    """One row per experiment, as `kubectl get` prints them."""
    now = now or datetime.now(UTC)
    head = ["NAME", "PHASE", "VERDICT", "REASON", "STAGES (SPEED-UP, VERDICT)", "AGE"]
    rows = []
    for obj in items:
        st = _status(obj)
        meta = obj["metadata"]
        rows.append(
            [
                str(meta["name"]),
                st.phase.value,
                st.verdict.value if st.verdict is not None else "-",
                st.reason or "-",
                stage_speedups(st) or "-",
                _age(meta.get("creationTimestamp"), now),
            ]
        )
        if namespaces:
            rows[-1].insert(0, str(meta.get("namespace", "")))
    if namespaces:
        head.insert(0, "NAMESPACE")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [head, *rows]
    ]
    return "\n".join(lines) + "\n"


def describe(obj: dict[str, Any]) -> str:
    """One experiment in detail: phase, verdict, message, a table of stages, where the report is."""
    st = _status(obj)
    meta = obj["metadata"]
    lines = [
        f"Name:        {meta['name']}",
        f"Namespace:   {meta.get('namespace', '')}",
        f"Phase:       {st.phase.value}",
        f"Verdict:     {st.verdict.value if st.verdict is not None else '-'}",
        f"Reason:      {st.reason or '-'}",
        f"Message:     {st.message or '-'}",
    ]
    if st.arm_differences:
        lines.append(f"Arms differ: {fairness.summary(st.arm_differences)}")
    if st.stages:
        lines += ["Stages:", *_stage_table(st.stages)]
        # The draft's memory cost and the arms' GPUs (issue #18), as the report says them.
        arms = st.environment.arms if st.environment is not None else None
        lines += [f"  {line}" for line in [*kvcache.summary(arms, st.stages), *telemetry.summary(st.stages)]]
    if st.recommendation is not None and st.recommendation.beneficial_up_to:
        lines.append(f"Beneficial up to: {st.recommendation.beneficial_up_to}")
    if st.results_ref is not None and st.results_ref.config_map:
        lines.append(
            f"Report:      ConfigMap {st.results_ref.config_map} "
            f"(kubectl specdecode report {meta['name']} -n {meta.get('namespace', '')})"
        )
    return "\n".join(lines)


def _stage_table(stages: Sequence[status.StageResult]) -> list[str]:
    head = ["STAGE", "LOAD", "SPEED-UP", "95% CI", "REQUESTS C/T", "VERDICT"]
    rows = []
    for stage in stages:
        s = stage.speedup
        estimate = f"{s.estimate:.2f}x" if s is not None and s.estimate is not None else "n/a"
        ci = (
            f"[{s.ci_low:.2f}, {s.ci_high:.2f}]"
            if s is not None and s.ci_low is not None and s.ci_high is not None
            else "-"
        )
        requests = f"{stage.control.requests}/{stage.treatment.requests}"
        early = " (stopped early)" if stage.stopped_early else ""
        rows.append([stage.name, stage.load or "-", estimate, ci, requests, stage.verdict.value + early])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return [
        "  " + "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [head, *rows]
    ]


def _age(created: str | None, now: datetime) -> str:
    if not created:
        return "-"
    seconds = int((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


# ---------------------------------------------------------------------------------------- report


def _report(kubectl: Kubectl, args: argparse.Namespace, out: TextIO) -> int:
    st = _status(kubectl.get(RESOURCE, args.name))
    name = st.results_ref.config_map if st.results_ref is not None else None
    if not name:
        why = f"phase {st.phase.value}" + (f", reason {st.reason}" if st.reason else "")
        print(
            f"kubectl specdecode report: {args.name} has no report yet ({why}); it is written with the "
            "verdict, or when a failed run had finished stages",
            file=sys.stderr,
        )
        return 1
    data = (kubectl.get("configmap", name).get("binaryData") or {}).get(REPORT_KEY)
    if not data:
        print(f"kubectl specdecode report: ConfigMap {name} holds no {REPORT_KEY}", file=sys.stderr)
        return 1
    try:
        html = gzip.decompress(base64.b64decode(data, validate=True))
    except (binascii.Error, OSError, EOFError) as exc:
        print(
            f"kubectl specdecode report: ConfigMap {name}: {REPORT_KEY} is corrupt ({exc})", file=sys.stderr
        )
        return 1
    target = Path(args.output)
    with exit_status.writing_results(target):
        target.write_bytes(html)
    print(f"wrote {target} ({len(html) // 1024} KiB) from ConfigMap {name}", file=out)
    return exit_status.OK


# ----------------------------------------------------------------------------------------- abort


def _abort(kubectl: Kubectl, args: argparse.Namespace, out: TextIO) -> int:
    obj = kubectl.get(RESOURCE, args.name)
    st = _status(obj)
    if st.phase.is_terminal and st.observed_generation == obj["metadata"].get("generation"):
        print(f"{args.name} has already ended ({st.phase.value}); nothing to abort", file=out)
        return exit_status.OK
    generation = str(obj["metadata"].get("generation") or 1)
    kubectl.run("annotate", RESOURCE, args.name, f"{keys.ABORT_ANNOTATION}={generation}", "--overwrite")
    print(
        f"{args.name}: abort requested (generation {generation}); the operator ends it as Failed/Aborted "
        "and deletes its arms and load Job",
        file=out,
    )
    return exit_status.OK


# ----------------------------------------------------------------------------------------- watch


def _watch(kubectl: Kubectl, args: argparse.Namespace, out: TextIO) -> int:
    watched = kubectl.watch(RESOURCE, args.name)
    try:
        return _follow(kubectl, args, out, watched)
    finally:
        watched.stop()


def _follow(kubectl: Kubectl, args: argparse.Namespace, out: TextIO, watched: _Watched) -> int:
    seen: tuple[str, str, str] | None = None
    stages_seen: set[str] = set()
    shown = -1  # the newest resourceVersion shown: the watch may lag behind a look
    while True:
        obj = kubectl.get(RESOURCE, args.name)
        st = _status(obj)
        now = datetime.now(UTC).strftime("%H:%M:%S")
        # the versions stored since the last look (a phase shorter than a look among them), then this one
        for version in [*watched.drain(), obj]:
            revision = _revision(version)
            if revision is not None and revision <= shown:
                continue
            shown = revision if revision is not None else shown
            vs = _status(version)
            state = (vs.phase.value, vs.reason or "", vs.message or "")
            if state != seen:
                said = (
                    f"{vs.reason}: {vs.message}"
                    if vs.reason and vs.message
                    else vs.reason or vs.message or "-"
                )
                print(f"{now}  {vs.phase.value:<10} {said}", file=out, flush=True)
                seen = state
        if st.phase is status.Phase.RUNNING:
            for line in _finished_stages(kubectl, obj, stages_seen):
                print(f"{now}  {'':<10} {line}", file=out, flush=True)
        if st.phase.is_terminal and st.observed_generation == obj["metadata"].get("generation"):
            print(describe(obj), file=out)
            return exit_status.OK
        time.sleep(args.interval)


def _revision(obj: dict[str, Any]) -> int | None:
    """The object's resourceVersion as a number (etcd's revision, as the API server writes it), or
    None where it is not one (opaque by contract: then every version is shown)."""
    value = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else None


def _finished_stages(kubectl: Kubectl, obj: dict[str, Any], seen: set[str]) -> list[str]:
    """A line per stage the load stored since the last look (the load Job stores its results
    after every stage: ConfigMaps `<name>-results-<i>`, or `<name>-results-pod<k>-<i>` from each
    of `workload.loadPods` pods). Results caught mid-upload are skipped until the next look."""
    from specdecode import results

    name, generation = obj["metadata"]["name"], str(obj["metadata"].get("generation") or 1)
    prefix = f"{name}-results-"
    pods = int(((obj.get("spec") or {}).get("workload") or {}).get("loadPods") or 1)
    try:
        items = kubectl.get("configmap", "-l", f"{keys.LABEL_RESULTS}={name}")["items"]
        bundles: dict[str, dict[int, bytes]] = {}  # by load pod ("" for one, "pod<k>" for k of N)
        for cm in items:
            pod, _, index = str(cm["metadata"]["name"]).removeprefix(prefix).rpartition("-")
            annotations = cm["metadata"].get("annotations") or {}
            data = results.part_data(cm)
            if index.isdigit() and data and annotations.get(keys.GENERATION_ANNOTATION) == generation:
                bundles.setdefault(pod, {})[int(index)] = base64.b64decode(data)
        shards = []
        for pod in [""] if pods == 1 else [f"pod{k}" for k in range(pods)]:
            parts = bundles.get(pod) or {}
            if not parts or sorted(parts) != list(range(len(parts))):
                return []
            shards.append(results.parse(results.unpack(parts[i] for i in sorted(parts))))
        recs, _, windows, _ = loadpods.merge(shards)
    except (KubectlError, results.ResultsError, ValueError, binascii.Error):
        return []
    # a stage is measured once every load pod finished its shard of it
    windows = [w for w in windows if all(any(v.stage == w.stage for v in s[2]) for s in shards)]
    stages = [str(s.get("name")) for s in ((obj.get("spec") or {}).get("workload") or {}).get("stages") or []]
    lines = []
    for window in windows:
        if window.stage in seen or window.stage not in stages:  # the warm-up rounds are no stage
            continue
        seen.add(window.stage)
        measured = [r for r in recs if r.stage == window.stage and not r.warmup]
        pairs = min(sum(r.arm == arm for r in measured) for arm in spec.Arm)
        early = ", stopped early" if window.stopped_early else ""
        lines.append(
            f"stage {window.stage} measured: {pairs} pairs in {window.end - window.start:.1f} s{early}"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
