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
    _add_sim(sub)
    return parser


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check experiment files as the operator would")
    p.add_argument("files", nargs="+", metavar="FILE", help="experiment YAML files (multi-document allowed)")
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from specdecode.experiment import documents

    return documents.validate_files(args.files, out=sys.stdout, err=sys.stderr)


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
