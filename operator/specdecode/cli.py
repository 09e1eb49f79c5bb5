"""The `specdecode` command (design.md §4): one subcommand per job, each a thin wrapper.

Exit statuses are a contract: 0 success; 1 `--fail-on-reject` and the verdict is not Promote;
2 invalid input (one line per problem); 3 could not measure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from specdecode import __version__

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_INVALID = 2
EXIT_FAILED = 3


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
    return parser


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check experiment files as the operator would")
    p.add_argument("files", nargs="+", metavar="FILE", help="experiment YAML files (multi-document allowed)")
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from specdecode.experiment import documents

    return documents.validate_files(args.files, out=sys.stdout, err=sys.stderr)


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="render the report from a results directory")
    p.add_argument(
        "directory", metavar="DIR", help="holds result.json, requests.jsonl, windows.json, experiment.yaml"
    )
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from specdecode.report import results, terminal

    try:
        loaded = results.render_directory(Path(args.directory))
    except results.ResultsError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    Console().print(terminal.render_terminal(loaded.status))
    print(f"wrote {Path(args.directory) / results.REPORT}")
    return EXIT_OK


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
    return EXIT_OK


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run an experiment (with --local: on this machine, no Kubernetes)")
    p.add_argument("file", metavar="FILE", help="the experiment YAML")
    p.add_argument("--local", action="store_true", help="run both arms here (the simulator, local vLLM, or URLs)")
    p.add_argument("--out", default="specdecode-out", metavar="DIR", help="results directory (default: %(default)s)")
    p.add_argument("--fail-on-reject", action="store_true", help="exit 1 unless the verdict is Promote")
    p.add_argument("--control-url", metavar="URL", help="an already running control server (with --treatment-url)")
    p.add_argument("--treatment-url", metavar="URL", help="an already running treatment server")
    _add_display(p)
    p.set_defaults(func=_run)


def _add_display(p: argparse.ArgumentParser) -> None:
    display = p.add_mutually_exclusive_group()
    display.add_argument("--quiet", action="store_const", const="quiet", dest="mode", help="a line per stage")
    display.add_argument("--json", action="store_const", const="json", dest="mode", help="JSON lines on stdout")
    p.set_defaults(mode="live")


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    if not args.local:
        print(
            "specdecode run: only --local runs here; on a cluster, apply the file instead: kubectl apply -f "
            f"{args.file} (the operator runs it)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    from specdecode.local import runner

    options = runner.Options(
        out=Path(args.out),
        control_url=args.control_url,
        treatment_url=args.treatment_url,
        fail_on_reject=args.fail_on_reject,
        mode=args.mode,
    )
    return runner.run(Path(args.file), options)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run the shipped example on the simulator (speculation wins, then loses)")
    p.add_argument("--out", default="demo-out", metavar="DIR", help="results directory (default: %(default)s)")
    _add_display(p)
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from importlib import resources
    from pathlib import Path

    from specdecode.local import runner

    example = resources.files("specdecode.local").joinpath("demo.yaml")
    with resources.as_file(example) as path:
        return runner.run(Path(path), runner.Options(out=Path(args.out), mode=args.mode))
def _add_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from specdecode.simulator import options  # argparse + parameter data only; the server loads in _sim

    p = sub.add_parser("sim", help="the vLLM simulator as a server (design.md §6)")
    options.add_arguments(p)
    p.set_defaults(func=_sim)


def _sim(args: argparse.Namespace) -> int:
    from specdecode.simulator import server

    return server.main(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `specdecode` console script."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
