"""The `specdecode` command (design.md §4): one subcommand per job, each a thin wrapper.

Exit statuses are a contract: 0 success; 1 `--fail-on-reject` and the verdict is not Promote;
2 invalid input (one line per problem); 3 could not measure, or could not write the results
(`exit_status.ResultsUnwritable`, one line).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from specdecode import __version__, exit_status

if TYPE_CHECKING:
    from specdecode.experiment import spec
    from specdecode.results import s3

T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="specdecode",
        description="Measure whether vLLM speculative decoding makes your model faster.",
    )
    parser.add_argument("--version", action="version", version=f"specdecode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_validate(sub)
    _add_report(sub)
    _add_operator(sub)
    _add_run(sub)
    _add_demo(sub)
    _add_sim(sub)
    _add_loadgen(sub)
    return parser


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check experiment files as the operator would")
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="experiment YAML files (multi-document; other kinds are skipped; - reads stdin)",
    )
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from specdecode import results
    from specdecode.experiment import documents

    def operator_limits(s: spec.ExperimentSpec) -> tuple[str | None, str | None]:
        # The operator's own check (handlers._subject), at its defaults: refused beyond what it reads
        # even from S3; said where it needs the chart's S3 store or a larger ConfigMap budget.
        refused, needs = (
            results.check_size(s, limits) for limits in (results.Limits(s3=True), results.Limits())
        )
        at = "at the operator's default limits: "
        return (at + refused if refused else None), (at + needs if needs else None)

    return documents.validate_files(
        args.files, out=sys.stdout, err=sys.stderr, stdin=sys.stdin, operator_limits=operator_limits
    )


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="render the report from a results directory")
    p.add_argument(
        "directory", metavar="DIR", help="holds result.json, requests.jsonl, windows.json, experiment.yaml"
    )
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:

    from specdecode.report import results, terminal

    try:
        with exit_status.writing_results(Path(args.directory) / results.REPORT):
            loaded = results.render_directory(Path(args.directory))
    except results.ResultsError as exc:
        print(exc, file=sys.stderr)
        return exit_status.INVALID
    terminal.console().print(
        terminal.render_terminal(loaded.status, require_stages=loaded.spec.analysis.require_stages)
    )
    print(f"wrote {Path(args.directory) / results.REPORT}")
    return exit_status.OK


def _add_operator(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("operator", help="run the Kubernetes operator (kopf)")
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        dest="namespaces",
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="no peering with other operator instances (the chart runs exactly one replica)",
    )
    p.add_argument(
        "--liveness", metavar="URL", help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve the operator's Prometheus metrics")
    p.add_argument(
        "--log-format", choices=["json", "plain"], default="json", help="log format (default: json)"
    )
    p.add_argument("--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=_operator)


def _operator(args: argparse.Namespace) -> int:
    from specdecode.controller import run

    run.run(
        namespaces=args.namespaces,
        standalone=args.standalone,
        liveness=args.liveness,
        metrics_port=args.metrics_port,
        log_format=args.log_format,
        verbose=args.verbose,
    )
    return exit_status.OK


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run an experiment (with --local: on this machine, no Kubernetes)")
    p.add_argument("file", metavar="FILE", help="the experiment YAML")
    p.add_argument(
        "--local", action="store_true", help="run both arms here (the simulator, local vLLM, or URLs)"
    )
    p.add_argument(
        "--out", default="specdecode-out", metavar="DIR", help="results directory (default: %(default)s)"
    )
    p.add_argument("--fail-on-reject", action="store_true", help="exit 1 unless the verdict is Promote")
    p.add_argument(
        "--control-url", metavar="URL", help="an already running control server (with --treatment-url)"
    )
    p.add_argument("--treatment-url", metavar="URL", help="an already running treatment server")
    p.add_argument(
        "--results-store",
        metavar="s3://BUCKET/PREFIX",
        help="also store the results bundle and result.json in this S3 bucket (the server, keys and "
        "region from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION); checked "
        "before the run starts",
    )
    _add_display(p)
    p.set_defaults(func=_run)


def _add_display(p: argparse.ArgumentParser) -> None:
    display = p.add_mutually_exclusive_group()
    display.add_argument("--quiet", action="store_const", const="quiet", dest="mode", help="a line per stage")
    display.add_argument(
        "--json", action="store_const", const="json", dest="mode", help="JSON lines on stdout"
    )
    p.set_defaults(mode="live")


def _run(args: argparse.Namespace) -> int:

    if not args.local:
        print(
            "specdecode run: only --local runs here; on a cluster, apply the file instead: kubectl apply -f "
            f"{args.file} (the operator runs it)",
            file=sys.stderr,
        )
        return exit_status.INVALID
    from specdecode.local import command, runner
    from specdecode.results import s3

    store: s3.Location | None = None
    if args.results_store:
        try:  # a bucket that is wrong fails now, not after the GPUs have measured
            store = s3.Location.from_url(args.results_store, os.environ)
            _in_bucket(store, lambda bucket: bucket.check())
        except s3.ResultsStoreError as exc:
            print(f"specdecode run: --results-store: {exc}", file=sys.stderr)
            return exit_status.INVALID
    options = runner.Options(
        out=Path(args.out),
        control_url=args.control_url,
        treatment_url=args.treatment_url,
        fail_on_reject=args.fail_on_reject,
        mode=args.mode,
    )
    code = command.run(Path(args.file), options)
    if store is None or not (Path(args.out) / "result.json").is_file():
        return code
    return _store_run(store, Path(args.out), Path(args.file).stem) or code


def _in_bucket(location: s3.Location, use: Callable[[s3.Store], Awaitable[T]]) -> T:
    """`use` a store of `location` (keys from the AWS_* environment; its own client, closed after)."""
    import asyncio

    from specdecode.results import s3

    async def go() -> T:
        bucket = s3.Store(location, s3.Credentials.from_env(os.environ, location.settings))
        try:
            return await use(bucket)
        finally:
            await bucket.aclose()

    return asyncio.run(go())


def _store_run(location: s3.Location, out: Path, name: str) -> int | None:
    """Upload a local run's bundle and result.json under `<prefix>/<name>/<UTC time>/`; None when
    stored, else exit 3 with one line (the local files stay as they are)."""
    from datetime import UTC, datetime

    from specdecode.report import results as written
    from specdecode.results import s3

    folder = location.key(name, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))

    async def put(bucket: s3.Store) -> list[str]:
        return [
            await bucket.put(f"{folder}/{file}", (out / file).read_bytes())
            for file in (written.PACKED, "result.json")
            if (out / file).is_file()
        ]

    try:
        urls = _in_bucket(location, put)
    except s3.ResultsStoreError as exc:
        print(f"specdecode run: the results are in {out}, but not in the bucket: {exc}", file=sys.stderr)
        return exit_status.FAILED
    print(f"stored the results in {', '.join(urls)}", file=sys.stderr)
    return None


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run the shipped example on the simulator (speculation wins, then loses)")
    p.add_argument(
        "--out", default="demo-out", metavar="DIR", help="results directory (default: %(default)s)"
    )
    _add_display(p)
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from importlib import resources

    from specdecode.local import command, runner

    example = resources.files("specdecode.local").joinpath("demo.yaml")
    with resources.as_file(example) as path:
        return command.run(Path(path), runner.Options(out=Path(args.out), mode=args.mode))


def _add_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from specdecode.simulator import options  # argparse + parameter data only; the server loads in _sim

    p = sub.add_parser(
        "sim", help="the built-in vLLM simulator as a server (an OpenAI-compatible stand-in for vllm serve)"
    )
    options.add_arguments(p)
    p.set_defaults(func=_sim)


def _sim(args: argparse.Namespace) -> int:
    from specdecode.simulator import server

    return server.main(args)


def _add_loadgen(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("loadgen", help="load both arms with the experiment's workload (the load Job)")
    p.add_argument("--experiment", required=True, type=Path, metavar="FILE", help="experiment YAML file")
    p.add_argument(
        "--control-url", required=True, metavar="URL", help="control arm base URL (http://host:port)"
    )
    p.add_argument("--treatment-url", required=True, metavar="URL", help="treatment arm base URL")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="results directory")
    p.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    p.add_argument(
        "--scrape-metrics",
        action="store_true",
        help="read each arm's /metrics at stage boundaries (counter deltas per stage)",
    )
    p.add_argument(
        "--control-metrics-url", metavar="URL", help="where to scrape the control (default: its URL)"
    )
    p.add_argument("--treatment-metrics-url", metavar="URL", help="where to scrape the treatment")
    p.add_argument(
        "--dataset-file",
        type=Path,
        metavar="FILE",
        help="JSONL prompts (e.g. the mounted ConfigMap key of a configMap dataset)",
    )
    p.add_argument("--salt", help="nonce salt of the prompts (default: seed and time)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    job = p.add_argument_group("in the load Job: store the results for the operator")
    job.add_argument(
        "--results-configmap", metavar="PREFIX", help="write the results into ConfigMaps PREFIX-<n>"
    )
    job.add_argument("--owner-uid", metavar="UID", help="the experiment's uid (the ConfigMaps' owner)")
    job.add_argument("--generation", type=int, metavar="N", help="the experiment generation measured")
    job.add_argument(
        "--load-pods",
        type=int,
        default=1,
        metavar="N",
        help="one of N load pods (an Indexed Job; its index from JOB_COMPLETION_INDEX): send the "
        "pod's shard of the schedule and store its results as PREFIX-pod<index>-<n>",
    )
    p.set_defaults(func=_loadgen)


def _loadgen(args: argparse.Namespace) -> int:
    refused = _other_generation(args) or _load_pod(args) or _results_store_refused(args)
    if refused:
        print(f"specdecode loadgen: {refused}", file=sys.stderr)
        return exit_status.INVALID
    with _terminate_as_interrupt():
        if not args.results_configmap:
            return _load(args)
        try:
            # After every measured stage (a Job killed later keeps what it finished) and at the end,
            # also after a failure or an interruption: what was measured is never lost.
            return _load(args, after_stage=lambda stage: _upload_between_stages(args, stage))
        finally:
            _upload_finally(args)


def _results_store_refused(args: argparse.Namespace, *, attempts: int = 3) -> str | None:
    """Why the operator's S3 bucket (SPECDECODE_RESULTS_S3_*) cannot take this load's results (None:
    it can, or results go to ConfigMaps): checked before the first request, not after the run. An
    endpoint that does not answer is asked again (1, 2 s) before the load is refused."""
    import time

    from specdecode.results import s3

    if not args.results_configmap:
        return None
    for attempt in range(attempts):
        try:
            location = s3.from_env()
            if location is not None:
                _in_bucket(location, lambda bucket: bucket.check())
            return None
        except s3.ResultsStoreError as exc:
            if not exc.transient or attempt == attempts - 1:
                return f"cannot store the results: {exc}"
            time.sleep(2**attempt)
    return None


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a pod deleted, a Job past its deadline) stops the load as Ctrl-C does: in-flight
    requests are recorded as cancelled, the files written, and the final upload runs. By default
    SIGTERM would end the process at once, skipping both."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _upload_finally(args: argparse.Namespace, *, attempts: int = 4, first_wait: float = 1.0) -> None:
    """The final upload, retried with backoff (1, 2, 4 s): an API server blip here would otherwise
    fail the Job, and the experiment as LoadJobFailed, after every stage was measured."""
    import time

    for attempt in range(attempts):
        try:
            _upload_results(args)
            return
        except Exception as exc:
            if attempt == attempts - 1:
                raise
            wait = first_wait * 2**attempt
            print(f"could not store the results ({exc}); trying again in {wait:.0f} s", file=sys.stderr)
            time.sleep(wait)


def _load_pod(args: argparse.Namespace) -> str | None:
    """Why this is not a load pod of `--load-pods` (None: it is, as `args.load_pod`, or the only one)."""
    import os

    from specdecode.experiment import keys

    args.load_pod = None
    if args.load_pods == 1:
        return None
    index = os.environ.get(keys.JOB_COMPLETION_INDEX_ENV, "")
    if args.load_pods < 1 or not index.isdigit() or int(index) >= args.load_pods:
        return (
            f"--load-pods {args.load_pods} needs more than one pod and its index 0..{args.load_pods - 1} "
            f"in {keys.JOB_COMPLETION_INDEX_ENV} (set by an Indexed Job), got {index!r}"
        )
    args.load_pod = (int(index), args.load_pods)
    return None


def _other_generation(args: argparse.Namespace) -> str | None:
    """Why the experiment file is not the `--generation` this Job measures (None: it is, or no
    generation was asked for): the load never measures one spec while its results are filed under
    another."""
    if args.generation is None:
        return None
    from specdecode.experiment import documents, manifests

    try:
        docs = documents.load_documents(args.experiment)
    except documents.UnreadableFileError as exc:
        return str(exc)
    found = manifests.document_generation(docs[0]) if docs and isinstance(docs[0], dict) else None
    if found == args.generation:
        return None
    return (
        f"{args.experiment} holds the experiment of generation {found if found is not None else '(none)'}, "
        f"but this load measures generation {args.generation} (--generation): refusing to measure "
        "another spec than the one its results would be filed under"
    )


def _upload_between_stages(args: argparse.Namespace, stage: str) -> None:
    """Store the results so far from inside the load's event loop (on a thread: its own loop)."""
    import threading

    def store() -> None:
        try:
            _upload_results(args, note=f"after stage {stage}")
        except Exception as exc:  # the final upload tries again; the load goes on
            print(f"could not store the results after stage {stage}: {exc}", file=sys.stderr)

    thread = threading.Thread(target=store, name="store-results")
    thread.start()
    thread.join()


def _upload_results(args: argparse.Namespace, *, note: str = "") -> None:
    import asyncio
    import os

    from specdecode import results
    from specdecode.controller import kube
    from specdecode.experiment import documents, keys, manifests
    from specdecode.results import s3

    name = str(documents.load_documents(args.experiment)[0]["metadata"]["name"])
    namespace = os.environ.get("POD_NAMESPACE", "default")
    owners = []
    if args.owner_uid:
        owners.append(
            {
                "apiVersion": keys.GROUP_VERSION,
                "kind": keys.KIND,
                "name": name,
                "uid": args.owner_uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        )
    job_uid = os.environ.get(manifests.JOB_UID_ENV)
    if job_uid:
        # The operator trusts only parts its load Job owns (specdecode/results.py).
        owners.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": os.environ.get(manifests.JOB_NAME_ENV) or manifests.Names(name).load_job,
                "uid": job_uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        )
    where = f" {note}" if note else ""
    bucket = s3.from_env()
    if bucket is not None:  # the operator's S3 store (chart values resultsStore.s3): one object
        url = asyncio.run(
            s3.upload(
                bucket,
                args.out,
                namespace=namespace,
                experiment=name,
                prefix=args.results_configmap,
                generation=args.generation or 1,
                job_uid=job_uid or "none",
                pod=args.load_pod,
            )
        )
        print(f"stored the results{where} in {url}", file=sys.stderr)
        return
    client = kube.Kube.from_environment()
    try:
        count = asyncio.run(
            results.upload(
                client,
                args.out,
                namespace=namespace,
                prefix=args.results_configmap,
                experiment=name,
                owners=owners,
                generation=args.generation,
                pod=args.load_pod,
            )
        )
    finally:
        client.close()
    prefix = results.pod_prefix(args.results_configmap, args.load_pod)
    print(f"stored the results{where} in {count} ConfigMap(s) {prefix}-*", file=sys.stderr)


def _load(args: argparse.Namespace, after_stage: Callable[[str], None] | None = None) -> int:
    from specdecode.loadgen import command

    return command.main(
        experiment=args.experiment,
        control_url=args.control_url,
        treatment_url=args.treatment_url,
        out=args.out,
        api_key_env=args.api_key_env,
        scrape_metrics=args.scrape_metrics,
        quiet=args.quiet,
        control_metrics_url=args.control_metrics_url,
        treatment_metrics_url=args.treatment_metrics_url,
        dataset_file=args.dataset_file,
        salt=args.salt,
        load_pod=args.load_pod,
        err=sys.stderr,
        after_stage=after_stage,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `specdecode` console script."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return exit_status.INTERRUPTED
    except exit_status.ResultsUnwritable as exc:
        print(f"specdecode {args.command}: {exc}", file=sys.stderr)
        return exit_status.FAILED
    return code


if __name__ == "__main__":
    sys.exit(main())
