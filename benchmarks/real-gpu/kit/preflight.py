#!/usr/bin/env python3
"""The arms' command lines as `specdecode run --local` renders them here, checked by the installed vLLM.

    preflight.py EXP.yaml...                 print both arms' argv; parse each with vLLM's own `vllm serve`
                                             parser (and validate_parsed_serve_args); exit 1 on a refusal
    preflight.py --engine-config EXP.yaml... also build vLLM's engine config (SpeculativeConfig included;
                                             reads the model configs, no weights, no GPU memory)
    preflight.py --argv ARM EXP.yaml [PORT]  print one arm's argv as JSON (bench.sh)

Renders the way the runner does: releases.resolve(spec.engine, local=`vllm --version`) then
engines.local_argv(spec, arm, port, release); falls back to older signatures of those functions.
"""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path


_LOCAL: dict[str, str | None] = {}


def local_version() -> str | None:
    """`vllm --version` as the project reads it (engines.local_vllm_version), once: it takes ~15 s."""
    from specdecode.local import engines

    if "v" not in _LOCAL:
        _LOCAL["v"] = engines.local_vllm_version() if hasattr(engines, "local_vllm_version") else None
    return _LOCAL["v"]


def render(path: str, arm_name: str, port: int = 8000) -> tuple[list[str], str]:
    from specdecode.experiment import documents, spec
    from specdecode.local import engines

    s = documents.load_experiment(Path(path)).spec
    arm = spec.Arm(arm_name)
    note = "release: (project has no releases module)"
    release = None
    try:
        from specdecode.experiment import releases

        local = local_version()
        release = releases.resolve(s.engine, local=local)
        note = f"release: {release.describe()} (vllm --version: {local})"
    except Exception as exc:  # noqa: BLE001 - report, render without
        note = f"release: could not resolve ({exc!r})"
    params = inspect.signature(engines.local_argv).parameters
    if release is not None and len(params) >= 4:
        argv = engines.local_argv(s, arm, port, release)
    else:
        argv = engines.local_argv(s, arm, port)
    return list(argv), note


def check(argv: list[str], engine_config: bool) -> str | None:
    """None when vLLM accepts argv (`vllm serve ...`), else the refusal."""
    import contextlib
    import io

    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert argv[:2] == ["vllm", "serve"], argv[:2]
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[2:])
    except SystemExit:
        return "argparse: " + " | ".join(err.getvalue().strip().splitlines()[-2:])
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    try:
        validate_parsed_serve_args(args)
    except Exception as exc:  # noqa: BLE001
        return f"validate_parsed_serve_args: {exc!r}"
    if engine_config:
        from vllm.engine.arg_utils import AsyncEngineArgs

        try:
            AsyncEngineArgs.from_cli_args(args).create_engine_config()
        except Exception as exc:  # noqa: BLE001
            return f"create_engine_config: {type(exc).__name__}: {exc}"
    return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["--argv"]:
        cmd, _ = render(argv[2], argv[1], int(argv[3]) if len(argv) > 3 else 8000)
        print(json.dumps(cmd))
        return 0
    engine_config = argv[:1] == ["--engine-config"]
    files = argv[1:] if engine_config else argv
    try:
        import vllm  # noqa: F401

        have_vllm = True
    except ImportError:
        have_vllm = False
        print("(vLLM not importable here: argv printed, not checked)")
    bad = 0
    for path in files:
        for arm in ("control", "treatment"):
            try:
                cmd, note = render(path, arm)
            except Exception as exc:  # noqa: BLE001
                print(f"{Path(path).name} {arm}: RENDER FAILED {exc!r}")
                bad += 1
                continue
            print(f"{Path(path).name} {arm} [{note}]: {' '.join(cmd)}")
            if have_vllm:
                problem = check(cmd, engine_config)
                print(f"  -> {'vLLM accepts it' if problem is None else 'REFUSED: ' + problem}")
                bad += problem is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
