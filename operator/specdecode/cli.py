"""The `specdecode` command (design.md §4): one subcommand per job, each a thin wrapper.

Exit statuses are a contract: 0 success; 1 `--fail-on-reject` and the verdict is not Promote;
2 invalid input (one line per problem); 3 could not measure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

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
    _add_loadgen(sub)
    return parser


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check experiment files as the operator would")
    p.add_argument("files", nargs="+", metavar="FILE", help="experiment YAML files (multi-document allowed)")
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from specdecode.experiment import documents

    return documents.validate_files(args.files, out=sys.stdout, err=sys.stderr)


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
    p.set_defaults(func=_loadgen)


def _loadgen(args: argparse.Namespace) -> int:
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
        err=sys.stderr,
    )


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
