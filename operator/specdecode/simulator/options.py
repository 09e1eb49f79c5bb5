"""The `specdecode sim` command line: vLLM's flag names where they overlap, plus the simulator's.

It accepts exactly what the experiment core renders for a simulator arm:

    specdecode sim MODEL --served-model-name NAME --host 0.0.0.0 --port 8000 --seed 42
      --disable-prefix-caching|--enable-prefix-caching --generation-config vllm [--api-key K]
      [--speculative-config '<json>' --per-request-spec-decode-metrics summary] --profile NAME
      [--decode-step-ms X --batch-token-ms X ... --error-rate X]

Other `vllm serve` flags that users put in `engine.args` (`--max-model-len`, `--dtype`,
`--tensor-parallel-size`, ...) are accepted and ignored (logged at startup), in either spelling
(`--max_model_len`). `--speculative-config` is parsed as vLLM does: a JSON object whose
`num_speculative_tokens` is k; `method`/`model` are validated as present-or-absent strings but do
not change timing; `synthetic_acceptance_rates` (vLLM's benchmarking mode) sets the per-position
acceptance instead of `--acceptance-rate`; `num_speculative_tokens_per_batch_size` (validated by vLLM's
rules, reference §1.6) sets k per step by the running batch size (0: no speculation at that size).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specdecode.experiment import degradations, speculative_rules
from specdecode.experiment.simprofiles import DEFAULT_PROFILE, PROFILES, SimParams
from specdecode.simulator.scheduler import SpecConfig

#: vLLM flags taking one value that the simulator accepts and ignores.
IGNORED_VALUE_FLAGS = (
    "gpu-memory-utilization",
    "device-memory-utilization",
    "tensor-parallel-size",
    "pipeline-parallel-size",
    "data-parallel-size",
    "dtype",
    "kv-cache-dtype",
    "quantization",
    "revision",
    "tokenizer",
    "tokenizer-revision",
    "code-revision",
    "download-dir",
    "load-format",
    "attention-backend",
    "kv-cache-memory-bytes",
    "max-log-len",
    "uvicorn-log-level",
    "log-level",
    "disable-access-log-for-endpoints",
    "override-generation-config",
    "custom-histogram-buckets",
    "prefix-caching-hash-algo",
    "stream-interval",
    "performance-mode",
    "optimization-level",
    "shutdown-timeout",
    "api-server-count",
    "fingerprint-mode",
    "chat-template",
    "tool-call-parser",
    "reasoning-parser",
    "block-size",
    "swap-space",
    "cpu-offload-gb",
    "hf-overrides",
    "compilation-config",
    "limit-mm-per-prompt",
    "sse-keep-alive-interval",
    "root-path",
    "max-loras",
    "max-lora-rank",
    "distributed-executor-backend",
    "show-hidden-metrics-for-version",
    "max-num-partial-prefills",
    "long-prefill-token-threshold",
    "scheduling-policy",
    "config",
)
IGNORED_SHORT_VALUE_FLAGS = ("-tp", "-pp", "-dp", "-q", "-O", "-asc")
#: vLLM boolean flags the simulator accepts and ignores.
IGNORED_SWITCHES = (
    "enforce-eager",
    "no-enforce-eager",
    "trust-remote-code",
    "no-trust-remote-code",
    "enable-chunked-prefill",
    "disable-chunked-prefill",
    "no-enable-chunked-prefill",
    "async-scheduling",
    "no-async-scheduling",
    "disable-log-stats",
    "enable-log-requests",
    "disable-log-requests",
    "enable-log-outputs",
    "disable-uvicorn-access-log",
    "enable-force-include-usage",
    "enable-prompt-tokens-details",
    "enable-per-request-metrics",
    "disable-per-request-metrics",
    "enable-auto-tool-choice",
    "kv-cache-metrics",
    "enable-mfu-metrics",
    "enable-lora",
    "enable-server-load-tracking",
    "enable-request-id-headers",
    "disable-fastapi-docs",
    "disable-frontend-multiprocessing",
)

PARAM_FLAGS: dict[str, type] = {
    "decode_step_ms": float,
    "batch_token_ms": float,
    "prefill_token_ms": float,
    "request_overhead_ms": float,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "kv_cache_tokens": int,
    "draft_kv_share": float,
    "acceptance_rate": float,
    "draft_cost_ratio": float,
    "draft_fixed_ms": float,
    "output_mismatch_rate": float,
    "batch_variance_rate": float,
    "error_rate": float,
}


#: The simulated host's speed factor when `--speed-factor` is not given: set per "node" (by a node
#: agent, or per process in `run --local` tests), so that one spec runs on hosts of different speeds.
SPEED_FACTOR_ENV = "SPECDECODE_SIM_SPEED_FACTOR"


class OptionsError(ValueError):
    """A command line vLLM would refuse (its message is printed, exit status 2)."""


class _Ignored(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        ns: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        ignored: list[str] = getattr(ns, "ignored", None) or []
        ignored.append(f"{option_string} {values}" if values else str(option_string))
        ns.ignored = ignored


def _spellings(name: str) -> list[str]:
    dashed = f"--{name}"
    under = f"--{name.replace('-', '_')}"
    return [dashed] if dashed == under else [dashed, under]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the simulator's options to `p` (the `specdecode sim` subparser or a standalone parser)."""
    p.add_argument(
        "model", nargs="?", default="Qwen/Qwen3-0.6B", metavar="MODEL", help="model name (only reported)"
    )
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME", help="first name is used")
    p.add_argument("--host", default=None, help="bind address (default: all IPv4, 0.0.0.0)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--seed", type=int, default=0, help="seeds the text and the acceptance draws")
    prefix = p.add_mutually_exclusive_group()
    prefix.add_argument(
        "--enable-prefix-caching",
        *_spellings("enable-prefix-caching")[1:],
        dest="prefix_caching",
        action="store_true",
        default=False,
    )
    prefix.add_argument(
        "--disable-prefix-caching", "--no-enable-prefix-caching", dest="prefix_caching", action="store_false"
    )
    p.add_argument("--generation-config", default="auto", help="accepted; the simulator has neutral defaults")
    p.add_argument(
        "--api-key", nargs="+", default=None, metavar="KEY", help="required on /v1 (env VLLM_API_KEY)"
    )
    p.add_argument(
        "--speculative-config", *_spellings("speculative-config")[1:], default=None, metavar="JSON"
    )
    p.add_argument(
        "--per-request-spec-decode-metrics",
        *_spellings("per-request-spec-decode-metrics")[1:],
        choices=("none", "summary", "detailed"),
        default="none",
    )
    p.add_argument("--max-model-len", *_spellings("max-model-len")[1:], type=int, default=2048)
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="named parameter set (see --list-profiles)")
    p.add_argument("--list-profiles", action="store_true", help="print the profiles and exit")
    for name, typ in PARAM_FLAGS.items():
        flag = name.replace("_", "-")
        p.add_argument(
            *_spellings(flag),
            dest=f"param_{name}",
            type=typ,
            default=None,
            metavar="X",
            help=f"override the profile's {name}",
        )
    p.add_argument(
        "--speed-factor",
        type=float,
        default=None,
        metavar="X",
        help=f"the simulated host's speed: every time parameter x X (1.1 = a 10%% slower host); "
        f"default ${SPEED_FACTOR_ENV} or 1",
    )
    p.add_argument(
        "--dcgm",
        action="store_true",
        help="also serve NVIDIA DCGM exporter series of one simulated GPU on /metrics, labelled as "
        "dcgm-exporter's Kubernetes pod mapping labels them: pod $POD_NAME (else the hostname), "
        "namespace $POD_NAMESPACE",
    )
    faults = p.add_argument_group("fault injection and ground truth")
    faults.add_argument(
        "--startup-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds of 'model loading': /health answers 503 until then",
    )
    faults.add_argument(
        "--log-degradation",
        action="append",
        default=None,
        choices=[k.value for k in degradations.Kind],
        metavar="KIND",
        help="with --speculative-config: log at start-up the line real vLLM logs when it weakens "
        "speculation this way (repeatable; kinds: %(choices)s)",
    )
    faults.add_argument(
        "--crash-after",
        type=float,
        default=None,
        metavar="S",
        help="exit with status 1 after S seconds of serving (the crash switch)",
    )
    faults.add_argument(
        "--disconnect-rate",
        type=float,
        default=0.0,
        metavar="X",
        help="fraction of streams the server drops halfway (deterministic per request)",
    )
    faults.add_argument(
        "--ground-truth",
        type=Path,
        default=None,
        metavar="FILE",
        help="append one JSON line per finished request (also at GET /sim/ground_truth)",
    )
    faults.add_argument("--wake-margin-ms", type=float, default=1.5, help=argparse.SUPPRESS)
    ignored = p.add_argument_group("vLLM flags accepted and ignored")
    for name in IGNORED_VALUE_FLAGS:
        ignored.add_argument(*_spellings(name), action=_Ignored, dest="ignored", help=argparse.SUPPRESS)
    for short in IGNORED_SHORT_VALUE_FLAGS:
        ignored.add_argument(short, action=_Ignored, dest="ignored", help=argparse.SUPPRESS)
    for name in IGNORED_SWITCHES:
        ignored.add_argument(
            *_spellings(name), action=_Ignored, nargs=0, dest="ignored", help=argparse.SUPPRESS
        )


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser (`python -m specdecode.simulator`)."""
    p = argparse.ArgumentParser(prog="specdecode sim", description="The vLLM simulator as a server.")
    add_arguments(p)
    return p


@dataclass(frozen=True)
class SimOptions:
    """The parsed, validated command line."""

    model: str
    served_model_name: str
    host: str
    port: int
    seed: int
    prefix_caching: bool
    api_keys: tuple[str, ...]
    spec: SpecConfig | None
    speculative_config: dict[str, Any] | None
    per_request_metrics: str
    max_model_len: int
    profile: str
    params: SimParams
    speed_factor: float
    """The simulated host's speed factor (already applied to `params`)."""
    startup_delay: float
    degradations: tuple[str, ...]
    """Kinds whose vLLM start-up line to log (`--log-degradation`; with speculation only)."""
    crash_after: float | None
    disconnect_rate: float
    ground_truth: Path | None
    wake_margin_s: float
    ignored: tuple[str, ...]
    dcgm: bool = False
    """Serve DCGM exporter series of the simulated GPU on `/metrics` (`simulator/dcgm.py`)."""


def parse_speculative_config(raw: str, *, acceptance_rate: float) -> tuple[dict[str, Any], SpecConfig]:
    """vLLM's `--speculative-config` JSON -> (the dict, the simulator's speculation)."""
    try:
        cfg = json.loads(raw)
    except ValueError as e:
        raise OptionsError(f"--speculative-config: invalid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise OptionsError("--speculative-config must be a JSON object")
    k = cfg.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise OptionsError("--speculative-config: num_speculative_tokens must be a positive integer")
    for key in ("method", "model"):
        if key in cfg and cfg[key] is not None and not isinstance(cfg[key], str):
            raise OptionsError(f"--speculative-config: {key} must be a string")
    rates = cfg.get("synthetic_acceptance_rates")
    if rates is not None:
        if not (
            isinstance(rates, list) and len(rates) == k and all(isinstance(r, int | float) for r in rates)
        ):
            raise OptionsError("--speculative-config: synthetic_acceptance_rates must be k numbers")
        spec = SpecConfig.from_unconditional([float(r) for r in rates])
    else:
        spec = SpecConfig.constant(k, acceptance_rate)
    schedule = cfg.get("num_speculative_tokens_per_batch_size")
    if schedule is not None:
        problems = speculative_rules.check_batch_schedule(
            schedule, path="--speculative-config: num_speculative_tokens_per_batch_size"
        )
        if problems:
            raise OptionsError("; ".join(str(p) for p in problems))
        spec = replace(spec, schedule=tuple((int(a), int(b), int(c)) for a, b, c in schedule))
    return cfg, spec


def resolve(ns: argparse.Namespace) -> SimOptions:
    """Validate the parsed flags as vLLM would and fill parameters from the profile."""
    if ns.profile not in PROFILES:
        raise OptionsError(f"unknown --profile {ns.profile!r}; known: {', '.join(sorted(PROFILES))}")
    overrides = {name: getattr(ns, f"param_{name}") for name in PARAM_FLAGS}
    params = PROFILES[ns.profile].with_overrides({k: v for k, v in overrides.items() if v is not None})
    speed_factor = _speed_factor(ns.speed_factor)
    params = params.slower(speed_factor)
    spec_cfg: dict[str, Any] | None = None
    spec: SpecConfig | None = None
    if ns.speculative_config is not None:
        spec_cfg, spec = parse_speculative_config(
            ns.speculative_config, acceptance_rate=params.acceptance_rate
        )
    if ns.per_request_spec_decode_metrics != "none" and spec is None:
        raise OptionsError(
            "--per-request-spec-decode-metrics requires speculative decoding to be enabled "
            "(via --speculative-config)."
        )
    keys = ns.api_key or ([os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY") else [])
    return SimOptions(
        model=ns.model,
        served_model_name=(ns.served_model_name or [ns.model])[0],
        host=ns.host or "0.0.0.0",
        port=ns.port,
        seed=ns.seed,
        prefix_caching=ns.prefix_caching,
        api_keys=tuple(keys),
        spec=spec,
        speculative_config=spec_cfg,
        per_request_metrics=ns.per_request_spec_decode_metrics,
        max_model_len=ns.max_model_len,
        profile=ns.profile,
        params=params,
        speed_factor=speed_factor,
        startup_delay=ns.startup_delay,
        degradations=tuple(ns.log_degradation or ()) if spec is not None else (),
        crash_after=ns.crash_after,
        disconnect_rate=ns.disconnect_rate,
        ground_truth=ns.ground_truth,
        wake_margin_s=ns.wake_margin_ms / 1000.0,
        ignored=tuple(getattr(ns, "ignored", None) or ()),
        dcgm=ns.dcgm,
    )


def _speed_factor(flag: float | None) -> float:
    source, value = "--speed-factor", flag
    if value is None:
        raw = os.environ.get(SPEED_FACTOR_ENV, "").strip()
        if not raw:
            return 1.0
        source = SPEED_FACTOR_ENV
        try:
            value = float(raw)
        except ValueError:
            raise OptionsError(
                f"{source}: {raw!r} is not a number; give e.g. 1.1 for a 10% slower host"
            ) from None
    if not 0.01 <= value <= 100:
        raise OptionsError(f"{source}: {value:g} is out of range; give a factor in [0.01, 100] (1 = nominal)")
    return value


def profiles_table() -> str:
    """`--list-profiles` output."""
    names = list(SimParams().as_dict())
    lines = ["profile".ljust(22) + " ".join(n for n in names)]
    for pname, params in PROFILES.items():
        lines.append(pname.ljust(22) + " ".join(f"{params.as_dict()[n]!s:>{len(n)}}" for n in names))
    return "\n".join(lines)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Parse with the standalone parser."""
    return build_parser().parse_args(list(argv))
