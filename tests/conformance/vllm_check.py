"""Check rendered `vllm serve` command lines with one vLLM release's own code (runs inside that release's venv).

Not a test module: `test_vllm_conformance.py` runs it as a script with the interpreter of the cached install
(`hack/install-vllm.sh`), one process per release for all cases, because importing vLLM takes seconds. It imports
nothing from specdecode. Input on stdin: `[{"id": ..., "argv": ["vllm", "serve", MODEL, ...]}, ...]`.
Output on stdout, one JSON document:
`{"release": VERSION, "options": [every option string the serve parser accepts], "speculative": {"fields":
[SpeculativeConfig fields], "literals": {field: [allowed values]}}, "results": [{"id", "ok", "stage", "error",
"ran", "not_run"}, ...]}`.

Each case goes as far as vLLM's own code goes without a GPU and without the model's Hugging Face config:
1. `parse`: the argv after `vllm` is parsed by the parser `vllm serve` builds (a top-level
   `FlexibleArgumentParser` with the `serve` subcommand from `ServeSubcommand.subparser_init`, as in
   `vllm/entrypoints/cli/main.py`); argparse's message (`unrecognized arguments: ...`) is the error.
2. `validate`: `ServeSubcommand.validate(args)` (`validate_parsed_serve_args`), as `main()` does next.
3. `engine_args`: `AsyncEngineArgs.from_cli_args(args)`, as the API server does.
4. `speculative_fields`: every key of the parsed `--speculative-config` must be a field of that release's
   `SpeculativeConfig`, and its value must pass that field's own validation (pydantic type, Literal values such
   as `rejection_sample_method`, `gt=0`, field validators such as `attention_backend`'s): `SpeculativeConfig(**config)`
   validates every field before its `__post_init__` needs the target model. For the synthetic rejection sampler, vLLM's own
   `SpeculativeConfig._resolve_synthetic_acceptance_rates` checks the rates against `num_speculative_tokens`.
5. `speculative_config`: for the methods that need no model (`ngram`, `ngram_gpu`, `suffix`), the whole
   `SpeculativeConfig` is built by `EngineArgs.create_speculative_config` (its `__post_init__` and model
   validators run), with no target model config (`suffix` only where the optional `arctic_inference` package
   that vLLM requires for it is importable: it has no wheel for this Python). Methods with a draft model or head (`draft_model`, `eagle`,
   `eagle3`, `mtp`, `dflash`, ...) need the draft's and the target's Hugging Face configs, so this stage is
   reported in `not_run` for them; likewise `VllmConfig`'s cross-config rules (e.g. "--per-request-spec-decode-metrics
   requires speculative decoding") need a `ModelConfig` and are not run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import traceback
import typing
from pathlib import Path
from typing import Any

MODEL_FREE_METHODS = {"ngram", "ngram_gpu", "suffix"}


def use_cpu_platform() -> None:
    """No GPU here: vLLM cannot infer a device, so use the CPU platform, as `vllm bench` does in main()."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()


def serve_parser() -> tuple[Any, Any, Any]:
    """The top-level parser with the `serve` subcommand, built as `vllm` builds it; and the subcommand."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    serve = command.subparser_init(subparsers)
    serve.set_defaults(dispatch_function=command.cmd)
    return parser, serve, command


def parse(parser: Any, argv: list[str]) -> Any:
    """argparse reports to stderr and exits: turn that into an exception carrying its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv)
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        message = lines[-1] if lines else f"exit status {exc.code}"
        raise ValueError(message) from None


def check_speculative_fields(config: dict[str, Any]) -> None:
    """Each key is a field of this release's SpeculativeConfig and each value passes that field's validation.

    pydantic validates every field (types, Literal values, constraints, field validators, unknown keywords)
    before `__post_init__` runs; without a target model config, `__post_init__` of a method that needs a
    model then fails on the missing config, which says nothing about the user's keys and is not reported.
    """
    from pydantic import ValidationError
    from vllm.config import SpeculativeConfig

    problems = []
    try:
        SpeculativeConfig(**config)
    except ValidationError as exc:
        for error in exc.errors():
            key = error["loc"][0] if error["loc"] else None
            if key in config:
                problems.append(f"{key}={config[key]!r}: {error['msg']}")
    except Exception:
        pass  # post-init failed without the target's config: the fields passed
    if problems:
        raise ValueError("; ".join(problems))
    if config.get("rejection_sample_method") == "synthetic":
        SpeculativeConfig._resolve_synthetic_acceptance_rates(
            config["num_speculative_tokens"],
            config.get("synthetic_acceptance_rates"),
            config.get("synthetic_acceptance_length"),
        )


def check(parser: Any, command: Any, argv: list[str]) -> dict[str, Any]:
    """Run the stages in order; stop at the first that refuses."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.import_utils import has_arctic_inference

    ran: list[str] = []
    not_run: list[str] = []
    stage = "parse"
    try:
        if argv[:2] != ["vllm", "serve"]:
            raise ValueError(f"not a `vllm serve` command line: {argv[:2]}")
        args = parse(parser, argv[1:])
        ran.append(stage)
        stage = "validate"
        command.validate(args)
        ran.append(stage)
        stage = "engine_args"
        engine_args = AsyncEngineArgs.from_cli_args(args)
        ran.append(stage)
        config = engine_args.speculative_config
        if config is not None:
            stage = "speculative_fields"
            check_speculative_fields(dict(config))
            ran.append(stage)
            stage = "speculative_config"
            method = config.get("method")
            if method not in MODEL_FREE_METHODS:
                not_run.append(f"{stage}: method {method!r} needs the draft's and the target's HF configs")
            elif method == "suffix" and not has_arctic_inference():
                not_run.append(f"{stage}: suffix needs the optional arctic_inference package (no wheel here)")
            else:
                engine_args.create_speculative_config(None, None)
                ran.append(stage)
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return {"ok": False, "stage": stage, "error": detail, "ran": ran, "not_run": not_run}
    return {"ok": True, "stage": None, "error": None, "ran": ran, "not_run": not_run}


def literal_values(annotation: Any) -> list[str]:
    """The strings of a (nested, optional) Literal annotation, e.g. SpeculativeConfig.method's."""
    values: list[str] = []
    for arg in typing.get_args(annotation):
        values += [arg] if isinstance(arg, str) else literal_values(arg)
    return values


def speculative_facts() -> dict[str, Any]:
    """The release's SpeculativeConfig fields and the values of its Literal fields."""
    from vllm.config import SpeculativeConfig

    fields = SpeculativeConfig.__pydantic_fields__
    literals = {name: sorted(set(literal_values(f.annotation))) for name, f in fields.items()}
    return {
        "fields": sorted(fields),
        "literals": {name: values for name, values in literals.items() if values},
    }


def metric_families() -> dict[str, str]:
    """The `vllm:` metric families the release registers, name -> kind (counter, gauge, histogram), read
    from its source: the stat loggers create them only inside a running engine, which needs a GPU. A
    counter `vllm:x` is exposed as `vllm:x_total`; the info gauges are registered by a variable name."""
    import vllm

    families: dict[str, str] = {}
    for path in Path(vllm.__file__).parent.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        for kind, name in re.findall(r'_(counter|gauge|histogram)_cls\(\s*name\s*=\s*"(vllm:\w+)"', text):
            families[name] = kind
        for name in re.findall(r'^\s*name\s*=\s*"(vllm:\w+_info)"', text, re.MULTILINE):
            families.setdefault(name, "gauge")
        # 0.33's spec-decode counters: `counter_specs = [(name, doc), ...]`, then `_counter_cls(name=name)`
        for block in re.findall(r"counter_specs\s*=\s*\[(.*?)\n\s*\]", text, re.DOTALL):
            for name in re.findall(r'\(\s*"(vllm:\w+)"\s*,', block):
                families[name] = "counter"
    return families


def cache_config_fields() -> list[str]:
    """The labels of `vllm:cache_config_info` (CacheConfig.metrics_info: its attributes)."""
    from vllm.config import CacheConfig

    return sorted(CacheConfig.__pydantic_fields__) if hasattr(CacheConfig, "__pydantic_fields__") else []


def main() -> None:
    cases = json.load(sys.stdin)
    # Whatever vLLM logs goes to stderr; stdout carries only the JSON answer.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    use_cpu_platform()
    import vllm

    parser, serve, command = serve_parser()
    results = [{"id": case["id"], **check(parser, command, case["argv"])} for case in cases]
    answer = {
        "release": vllm.__version__,
        "python": sys.version.split()[0],
        "options": sorted(serve._option_string_actions),
        "speculative": speculative_facts(),
        "metrics": metric_families(),
        "cache_config_fields": cache_config_fields(),
        "results": results,
    }
    sys.stdout = real_stdout
    json.dump(answer, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # vLLM may leave non-daemon threads behind; nothing else is left to do


if __name__ == "__main__":
    main()
