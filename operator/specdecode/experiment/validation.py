"""Validation of a SpecDecodeExperiment: every problem at once, each naming its field and the fix.

Two layers, both pure:
1. The typed models (`spec/`) check types, enums and ranges; their errors are translated here into
   one line per problem with the camelCase field path (`spec.speculative.promptLookupMin: ...`).
2. `check_spec` adds the rules that need vLLM's knowledge or more than one field: vLLM's
   SpeculativeConfig rules (`speculative_rules.py`; shared/reference/vllm-0.33-facts.md §1.3-1.8) as the
   arms' release has them (`releases.py`: keys, methods and values that came or went between 0.20 and 0.33),
   the flags the operator owns, cross-references between stages and `requireStages`, and names that must
   stay DNS labels. Every finding is a `problems.Problem`.

Each top-level section is parsed on its own as well, so a type error in `workload` does not hide a
speculative-config problem: the user sees everything in one run.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from specdecode.experiment import apiserver_rules, keys, releases, simprofiles, spec, speculative_rules
from specdecode.experiment.problems import InvalidSpecError as InvalidSpecError
from specdecode.experiment.problems import Problem as Problem
from specdecode.experiment.problems import did_you_mean, is_union_tag, kind_of, translate

# `vllm serve` flags the operator renders itself or that would break one arm (reference §1.5, §1.7, §2).
OWNED_FLAGS: dict[str, str] = {
    "--speculative-config": "the treatment's speculative config comes from spec.speculative",
    "-sc": "the treatment's speculative config comes from spec.speculative",
    "--spec-method": "set spec.speculative.method",
    "--spec-model": "set spec.speculative.model",
    "--spec-tokens": "set spec.speculative.numSpeculativeTokens",
    "--host": "the operator binds each arm to 0.0.0.0",
    "--port": "the operator serves each arm on port 8000",
    "--uds": "the arms must listen on TCP port 8000",
    "--per-request-spec-decode-metrics": "the operator sets it on the treatment only (vLLM refuses it on the control)",
    "--disable-log-stats": "it removes the vllm:* metrics the experiment reads",
    "--seed": "set spec.engine.seed",
    "--served-model-name": "set spec.servedModelName",
    "--enable-prefix-caching": "set spec.engine.prefixCaching",
    "--disable-prefix-caching": "set spec.engine.prefixCaching",
    "--no-enable-prefix-caching": "set spec.engine.prefixCaching",
    "--generation-config": "the operator sets 'vllm' in both arms (a model's default min_p breaks speculation)",
    "--api-key": "set spec.engine.apiKeySecret",
    "--config": "a config file could carry a speculative config into one arm; put flags in spec.engine.args",
    "--model": "set spec.model",
    "--speculative-model": "removed from vLLM; use spec.speculative.model",
    "--num-speculative-tokens": "removed from vLLM; use spec.speculative.numSpeculativeTokens",
    "--speculative-draft-tensor-parallel-size": "removed from vLLM; use spec.speculative.draftTensorParallelSize",
    "--speculative-max-model-len": "removed from vLLM; use speculative.extra.max_model_len",
    "--speculative-disable-by-batch-size": "removed from vLLM; use speculative.extra.num_speculative_tokens_per_batch_size",
    "--ngram-prompt-lookup-max": "removed from vLLM; use spec.speculative.promptLookupMax",
    "--ngram-prompt-lookup-min": "removed from vLLM; use spec.speculative.promptLookupMin",
    "--spec-decoding-acceptance-method": "removed from vLLM; use speculative.extra.rejection_sample_method",
    "--speculative-disable-mqa-scorer": "removed from vLLM",
    "--speculative-model-quantization": "removed from vLLM; use speculative.extra.quantization",
    "--speculative-disable-log-stats": "removed from vLLM",
}

_TP_FLAGS = ("--tensor-parallel-size", "-tp")

_M = TypeVar("_M", bound=BaseModel)


# ------------------------------------------------------------------------------------ entry points


def parse_experiment(document: Any, *, source: str = "") -> tuple[spec.ExperimentSpec, str]:
    """Validate a whole resource (apiVersion, kind, metadata, spec); return the spec and the name.

    Raises InvalidSpecError with every problem found.
    """
    problems = list(check_document(document))
    if problems:
        raise InvalidSpecError(problems)
    assert isinstance(document, Mapping)
    name = str(document["metadata"]["name"])
    return spec.ExperimentSpec.model_validate(document["spec"]), name


def check_document(document: Any) -> list[Problem]:
    """Every problem of a whole resource, in document order."""
    if not isinstance(document, Mapping):
        return [Problem("(document)", f"expected a mapping (a Kubernetes resource), got {kind_of(document)}")]
    problems: list[Problem] = []
    api_version = document.get("apiVersion")
    expected = keys.GROUP_VERSION
    if api_version != expected:
        problems.append(Problem("apiVersion", f"must be {expected!r}, got {api_version!r}"))
    if document.get("kind") != keys.KIND:
        problems.append(Problem("kind", f"must be {keys.KIND!r}, got {document.get('kind')!r}"))
    metadata = document.get("metadata")
    if not isinstance(metadata, Mapping):
        problems.append(Problem("metadata", "is required, with at least a name"))
    else:
        problems.extend(check_name(metadata.get("name")))
    unexpected = sorted(set(document) - {"apiVersion", "kind", "metadata", "spec", "status"})
    for key in unexpected:
        problems.append(Problem(key, "unknown top-level field; the experiment goes under spec"))
    if "spec" not in document:
        problems.append(Problem("spec", "is required"))
    else:
        problems.extend(check_spec(document["spec"]))
    return problems


def check_name(name: Any) -> list[Problem]:
    """The experiment name must leave room for its children's names (`<name>-treatment`, ...)."""
    if not isinstance(name, str) or not name:
        return [Problem("metadata.name", "is required")]
    problems = []
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        problems.append(
            Problem(
                "metadata.name",
                f"{name!r} must be a DNS-1035 label (lower-case letters, digits "
                "and '-', starting with a letter), because the arms' Services are named after it",
            )
        )
    if len(name) > spec.MAX_NAME_LENGTH:
        problems.append(
            Problem(
                "metadata.name",
                f"is {len(name)} characters; at most {spec.MAX_NAME_LENGTH} "
                f"so that '{name[:20]}...-treatment' stays a 63-character DNS label",
            )
        )
    return problems


def check_spec(raw: Any) -> list[Problem]:
    """Every problem of `spec`, typed and semantic."""
    if not isinstance(raw, Mapping):
        return [Problem("spec", f"expected a mapping, got {kind_of(raw)}")]
    try:
        parsed = spec.ExperimentSpec.model_validate(raw)
    except ValidationError as exc:
        problems = translate(exc, prefix="spec", model=spec.ExperimentSpec)
        reported = {problem.path for problem in problems}
        return problems + [p for p in _semantic_on_sections(raw) if not _overlaps(p.path, reported)]
    return semantic_problems(parsed)


def semantic_problems(s: spec.ExperimentSpec) -> list[Problem]:
    """The rules beyond types and ranges, on a fully parsed spec."""
    release = releases.resolve(s.engine)
    return [
        *check_engine(s.engine),
        *check_release(s.engine),
        *speculative_rules.check_speculative(
            s.speculative, target_tp=target_tensor_parallel(s.engine.args), release=release
        ),
        *check_workload(s.workload),
        *check_analysis(s.analysis, s.workload),
        *speculative_rules.check_confirm(s, release),
        *check_gpus(s.engine),
        *apiserver_rules.check(s),  # what the API server would refuse of the arms and the spec ConfigMap
    ]


def _semantic_on_sections(raw: Mapping[str, Any]) -> list[Problem]:
    """Semantic rules of each section that parses on its own (the full parse failed elsewhere)."""
    engine = _parse_section(spec.EngineSpec, raw.get("engine", {}))
    speculative = _parse_section(spec.SpeculativeSpec, raw.get("speculative"))
    workload = _parse_section(spec.WorkloadSpec, raw.get("workload"))
    analysis = _parse_section(spec.AnalysisSpec, raw.get("analysis", {}))
    problems: list[Problem] = []
    if engine is not None:
        problems += check_engine(engine) + check_release(engine) + check_gpus(engine)
    if speculative is not None:
        tp = target_tensor_parallel(engine.args) if engine is not None else None
        release = releases.resolve(engine) if engine is not None else None
        problems += speculative_rules.check_speculative(speculative, target_tp=tp, release=release)
    if workload is not None:
        problems += check_workload(workload)
        if analysis is not None:
            problems += check_analysis(analysis, workload)
    return problems


def _parse_section(model: type[_M], raw: Any) -> _M | None:
    """Parse one section leniently: values that fail are dropped (their errors are already reported),
    so the rest of the section still gets its semantic checks."""
    if not isinstance(raw, Mapping):
        return None
    current: Any = copy.deepcopy(dict(raw))
    for _ in range(50):
        try:
            return model.model_validate(current)
        except ValidationError as exc:
            dropped = [
                _drop(current, [p for p in err["loc"] if not is_union_tag(p)])
                for err in exc.errors()
                if err["type"] != "missing"
            ]
            if not any(dropped):
                return None
    return None


def _drop(tree: Any, loc: Sequence[str | int]) -> bool:
    """Delete the mapping key at `loc` (the failing value); False when there is none to delete."""
    for part in loc[:-1]:
        tree = _child(tree, part)
        if tree is None:
            return False
    if loc and isinstance(tree, dict) and loc[-1] in tree:
        del tree[loc[-1]]
        return True
    return False


def _child(tree: Any, part: str | int) -> Any:
    if isinstance(tree, Mapping):
        return tree.get(part)
    if isinstance(tree, list) and isinstance(part, int) and part < len(tree):
        return tree[part]
    return None


def _overlaps(path: str, reported: set[str]) -> bool:
    return any(
        path == r or r.startswith(path + ".") or r.startswith(path + "[") or path.startswith(r + ".")
        for r in reported
    )


# ------------------------------------------------------------------------------------- the rules


def check_engine(engine: spec.EngineSpec) -> list[Problem]:
    """Flags in `engine.args` that the operator owns, simulator settings, and where weights come from."""
    problems: list[Problem] = []
    for i, arg in enumerate(engine.args):
        flag = owned_flag(arg)
        if flag is not None:
            problems.append(
                Problem(
                    f"spec.engine.args[{i}]",
                    f"{arg!r} is owned by the operator: {OWNED_FLAGS[flag]}; remove it",
                )
            )
    tp = target_tensor_parallel(engine.args)
    if tp is not None and tp < 1:
        problems.append(Problem("spec.engine.args", "--tensor-parallel-size must be a positive integer"))
    names = [e.name for e in engine.env]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(Problem("spec.engine.env", f"{dup!r} is set more than once"))
    if engine.simulator is not None and engine.simulator.profile not in simprofiles.PROFILES:
        problems.append(
            Problem(
                "spec.engine.simulator.profile",
                f"unknown profile {engine.simulator.profile!r}; "
                f"known: {', '.join(sorted(simprofiles.PROFILES))}",
            )
        )
    problems.extend(check_model_source(engine))
    return problems


def model_source_env_names(engine: spec.EngineSpec) -> dict[str, str]:
    """The environment variables the operator sets on the arms (`manifests.model_source_env`), each
    with the field it comes from."""
    fields = {
        "spec.engine.modelCache": ("HF_HOME", "HF_HUB_CACHE") if engine.model_cache is not None else (),
        "spec.engine.hfTokenSecret": ("HF_TOKEN",) if engine.hf_token_secret is not None else (),
        "spec.engine.offline": ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if engine.offline else (),
    }
    return {name: field for field, names in fields.items() for name in names}


def check_model_source(engine: spec.EngineSpec) -> list[Problem]:
    """Where the arms get their weights: the cache claim, offline mode, and what would contradict them."""
    path = "spec.engine.modelCache"
    problems: list[Problem] = []
    cache = engine.model_cache
    if cache is not None:
        if not re.fullmatch(spec.DNS_SUBDOMAIN, cache.claim_name):
            problems.append(
                Problem(
                    f"{path}.claimName",
                    f"{cache.claim_name!r} is not a PersistentVolumeClaim name: use lower-case letters, "
                    "digits, '-' and '.', starting and ending with a letter or digit (a DNS-1123 subdomain)",
                )
            )
        parts = cache.sub_path.split("/")
        if cache.sub_path.startswith("/") or ".." in parts:
            problems.append(
                Problem(
                    f"{path}.subPath",
                    f"{cache.sub_path!r} must be a relative path inside the volume without '..', e.g. hf",
                )
            )
        if cache.read_only and not engine.offline:
            problems.append(
                Problem(
                    f"{path}.readOnly",
                    "a read-only cache needs spec.engine.offline: true (an online Hugging Face client "
                    "writes lock files into the cache even for cached models, and could not download "
                    "a missing one); set offline: true, or readOnly: false",
                )
            )
        for i, arg in enumerate(engine.args):
            if arg.split("=", 1)[0].replace("_", "-") == "--download-dir":
                problems.append(
                    Problem(
                        f"spec.engine.args[{i}]",
                        "--download-dir would put the weights outside spec.engine.modelCache, which the "
                        f"arms use as HF_HOME ({spec.MODEL_CACHE_MOUNT}); remove it",
                    )
                )
    elif engine.offline:
        problems.append(
            Problem(
                "spec.engine.offline",
                "needs spec.engine.modelCache: an air-gapped arm can only load models that a cache "
                "volume already holds; set modelCache.claimName to a PersistentVolumeClaim with the "
                "target and draft models",
            )
        )
    owned = model_source_env_names(engine)
    for i, env in enumerate(engine.env):
        if env.name in owned:
            problems.append(
                Problem(
                    f"spec.engine.env[{i}]",
                    f"{env.name!r} is set by the operator from {owned[env.name]}; remove it",
                )
            )
    return problems


def check_release(engine: spec.EngineSpec) -> list[Problem]:
    """The arms' vLLM release must be one this project renders and validates for."""
    release = releases.resolve(engine)
    if engine.vllm_version is not None and releases.parse(engine.vllm_version) is None:
        return [
            Problem(
                "spec.engine.vllmVersion", f"{engine.vllm_version!r} is not a vLLM release such as 0.20.0"
            )
        ]
    if release.version >= releases.OLDEST or engine.simulator is not None:
        return []  # a newer release than the newest supported gets the newest rules (status says so)
    where = "spec.engine.vllmVersion" if release.source is releases.Source.SPEC else "spec.engine.image"
    return [
        Problem(
            where,
            f"vLLM {releases.fmt(release.version)} ({release.source.value}) is older than the oldest supported "
            f"release {releases.fmt(releases.OLDEST)} (supported: {releases.fmt(releases.OLDEST)} to "
            f"{releases.fmt(releases.NEWEST)}); use a newer image, or set spec.engine.vllmVersion to the "
            "release whose rules apply",
        )
    ]


def check_gpus(engine: spec.EngineSpec) -> list[Problem]:
    """vLLM needs as many GPUs as its tensor parallel size."""
    tp = target_tensor_parallel(engine.args)
    if engine.simulator is not None or tp is None or tp < 1:
        return []
    gpus = engine.resources.limits.get("nvidia.com/gpu")
    try:
        count = int(gpus) if gpus is not None else None
    except ValueError:
        return [
            Problem("spec.engine.resources.limits.nvidia.com/gpu", f"must be a whole number, got {gpus!r}")
        ]
    if count is not None and count < tp:
        return [
            Problem(
                "spec.engine.resources.limits.nvidia.com/gpu",
                f"is {count} but --tensor-parallel-size is {tp}; each arm needs at least {tp} GPUs",
            )
        ]
    return []


#: why a multi-turn stage cannot be open loop (issue 17)
MULTI_TURN_CLOSED_LOOP = (
    "multi-turn sessions run closed loop (a turn waits for the reply to the one before): set "
    "concurrency, the number of sessions in flight, instead of rate"
)


def check_workload(workload: spec.WorkloadSpec) -> list[Problem]:
    """Stages: each exactly one of rate or concurrency; unique names; per-stage lengths only with a
    synthetic dataset; multi-turn sessions closed loop only."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, stage in enumerate(workload.stages):
        where = f"spec.workload.stages[{i}]"
        if (stage.rate is None) == (stage.concurrency is None):
            problems.append(
                Problem(
                    where, "needs exactly one of rate (open loop, requests/s) or concurrency (closed loop)"
                )
            )
        if stage.name in seen:
            problems.append(
                Problem(f"{where}.name", f"{stage.name!r} is used by an earlier stage; names must be unique")
            )
        seen.add(stage.name)
        if isinstance(workload.dataset, spec.MultiTurnDataset) and stage.rate is not None:
            problems.append(Problem(f"{where}.rate", MULTI_TURN_CLOSED_LOOP))
        if not isinstance(workload.dataset, spec.SyntheticDataset):
            for field, value in (("inputTokens", stage.input_tokens), ("outputTokens", stage.output_tokens)):
                if value is not None:
                    problems.append(
                        Problem(
                            f"{where}.{field}",
                            f"only applies to a synthetic dataset (dataset.type is {workload.dataset.type})",
                        )
                    )
    dataset = workload.dataset
    if isinstance(dataset, spec.JsonlDataset) and (dataset.config_map is None) == (dataset.path is None):
        problems.append(
            Problem(
                "spec.workload.dataset",
                "a jsonl dataset needs exactly one of configMap (in a cluster) or path (local runs)",
            )
        )
    if isinstance(dataset, spec.TraceDataset) and workload.arrival is not spec.Arrival.POISSON:
        problems.append(
            Problem(
                "spec.workload.arrival", "does not apply to a trace dataset: the trace sets the send times"
            )
        )
    if isinstance(dataset, spec.MultiTurnDataset) and workload.search is not None and workload.search.rate:
        problems.append(Problem("spec.workload.search.rate", MULTI_TURN_CLOSED_LOOP))
    if workload.arrival is not spec.Arrival.GAMMA and workload.burstiness != 1.0:
        problems.append(Problem("spec.workload.burstiness", "only applies to arrival: gamma"))
    return problems + _check_load_pods(workload)


def _check_load_pods(workload: spec.WorkloadSpec) -> list[Problem]:
    """More than one load pod: every closed-loop load keeps at least one request in flight per pod,
    and no multi-turn sessions (`experiment/loadpods.py`)."""
    pods = workload.load_pods
    if pods == 1:
        return []
    problems: list[Problem] = []
    if isinstance(workload.dataset, spec.MultiTurnDataset):
        problems.append(
            Problem(
                "spec.workload.loadPods",
                f"is {pods}, but a multi-turn dataset is sent by one load pod (a session's turns go in "
                "order through one client); set loadPods: 1",
            )
        )
    bounds: list[tuple[str, int | None]] = [("spec.workload.requestsPerStage", workload.requests_per_stage)]
    bounds += [(f"spec.workload.stages[{i}].requests", s.requests) for i, s in enumerate(workload.stages)]
    if workload.search is not None:
        bounds.append(("spec.workload.search.requestsPerProbe", workload.search.requests_per_probe))
    problems += [
        Problem(
            where,
            f"is {n}, fewer than spec.workload.loadPods ({pods}): a pod would have no request to send; "
            "raise it or lower loadPods",
        )
        for where, n in bounds
        if n is not None and n < pods
    ]
    fewer = f"fewer concurrent requests than spec.workload.loadPods ({pods}), which share them out"
    for i, stage in enumerate(workload.stages):
        if stage.concurrency is not None and stage.concurrency < pods:
            problems.append(
                Problem(
                    f"spec.workload.stages[{i}].concurrency",
                    f"is {stage.concurrency}, {fewer}; raise it or lower loadPods",
                )
            )
    searched = workload.search.concurrency if workload.search is not None else None
    if searched is not None and searched.from_ < pods:
        problems.append(
            Problem(
                "spec.workload.search.concurrency.from",
                f"is {searched.from_:g}, {fewer}; raise it or lower loadPods",
            )
        )
    return problems


#: why the operator refuses a trace by `path` (issue 17)
TRACE_PATH_LOCAL_ONLY = (
    "a trace file path is read by `specdecode run --local` only; in a cluster put the trace in a "
    "ConfigMap (dataset: {type: trace, configMap: {name, key}}) or use builtin: bursty"
)


#: why the operator refuses conversations by `path` (issue 17)
CONVERSATIONS_PATH_LOCAL_ONLY = (
    "a conversations file path is read by `specdecode run --local` only; in a cluster put it in a "
    "ConfigMap (dataset: {type: multiTurn, configMap: {name, key}}) or use builtin: conversations"
)


def check_operator_support(s: spec.ExperimentSpec) -> list[Problem]:
    """What a valid spec asks that only `run --local` does (the operator fails such a run InvalidSpec)."""
    problems: list[Problem] = []
    dataset = s.workload.dataset
    if isinstance(dataset, spec.TraceDataset) and dataset.path is not None:
        problems.append(Problem("spec.workload.dataset.path", TRACE_PATH_LOCAL_ONLY))
    if isinstance(dataset, spec.MultiTurnDataset) and dataset.path is not None:
        problems.append(Problem("spec.workload.dataset.path", CONVERSATIONS_PATH_LOCAL_ONLY))
    return problems


def check_analysis(analysis: spec.AnalysisSpec, workload: spec.WorkloadSpec) -> list[Problem]:
    """`requireStages` must name existing stages; a break-even search needs a comparison."""
    problems: list[Problem] = []
    if workload.search is not None and analysis.mode is spec.AnalysisMode.NOISE_FLOOR:
        problems.append(
            Problem("spec.workload.search", "needs analysis.mode Compare: an A/A run has no break-even")
        )
    if not isinstance(analysis.require_stages, list):
        return problems
    names = [stage.name for stage in workload.stages]
    return problems + [
        Problem(f"spec.analysis.requireStages[{i}]", f"{name!r} is not a stage" + did_you_mean(name, names))
        for i, name in enumerate(analysis.require_stages)
        if name not in names
    ]


# ---------------------------------------------------------------------------------------- helpers


def owned_flag(arg: str) -> str | None:
    """The operator-owned flag that `arg` sets, also spelled with `_`, `=value`, dotted or abbreviated."""
    if not arg.startswith("-"):
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    if name in OWNED_FLAGS:
        return name
    if name.startswith("--speculative-config."):
        return "--speculative-config"
    if len(name) > 3 and name.startswith("--"):
        # argparse accepts unambiguous prefixes (allow_abbrev), so `--spec-tok 3` sets --spec-tokens.
        for owned in OWNED_FLAGS:
            if owned.startswith(name) and owned != name:
                return owned
    return None


def target_tensor_parallel(args: Sequence[str]) -> int | None:
    """`--tensor-parallel-size`/`-tp` from the extra engine args; None when absent; 0 when garbled."""
    for i, arg in enumerate(args):
        name, _, inline = arg.partition("=")
        if name.replace("_", "-") in _TP_FLAGS:
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            try:
                return int(value)
            except ValueError:
                return 0
    return None
