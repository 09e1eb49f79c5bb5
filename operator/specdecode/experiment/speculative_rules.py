"""vLLM's SpeculativeConfig rules, as the arms' release has them (`releases.py`), checked before any GPU
is used: the methods and `speculative.extra` keys a release knows, the keys vLLM refuses, synthetic
acceptance, the batch-size schedule, and what `analysis.confirm` needs of them
(shared/reference/vllm-0.33-facts.md §1.2-1.8). `validation.check_spec` calls them with the rest.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from specdecode.experiment import releases, spec
from specdecode.experiment.problems import Problem, did_you_mean

# SpeculativeConfig fields a user may set through `speculative.extra` in some supported release
# (reference §1.2; which release has which: `releases.py`), minus the ones that have a typed field
# of their own here and the engine-internal ones.
SPECULATIVE_EXTRA_KEYS: frozenset[str] = frozenset(
    {
        "enforce_eager",
        "quantization",
        "revision",
        "code_revision",
        "max_model_len",
        "draft_load_config",
        "moe_backend",
        "attention_backend",
        "kv_cache_dtype",
        "index_share_for_mtp_iteration",
        "disable_padded_drafter_batch",
        "disable_eagle_block_drop",
        "disable_lookahead_block_hashes",
        "draft_lm_head_quantization",
        "use_local_argmax_reduction",
        "use_heterogeneous_vocab",
        "parallel_drafting",
        "num_speculative_tokens_per_batch_size",
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
        "rejection_sample_method",
        "draft_sample_method",
        "synthetic_acceptance_rates",
        "synthetic_acceptance_length",
        "fly_window_size",
        "fly_entropy_threshold",
        "fly_entropy_top_k",
        "enable_adaptive_verification",
        "dspark_draft_topk",
        "xpress_topc",
        "speculative_token_tree",
    }
)

# SpeculativeConfig keys that have a typed field: hint the user towards it.
TYPED_SPECULATIVE_KEYS: dict[str, str] = {
    "method": "speculative.method",
    "model": "speculative.model",
    "num_speculative_tokens": "speculative.numSpeculativeTokens",
    "draft_tensor_parallel_size": "speculative.draftTensorParallelSize",
    "prompt_lookup_min": "speculative.promptLookupMin",
    "prompt_lookup_max": "speculative.promptLookupMax",
}

# Keys vLLM refuses with a specific message, or that are gone: the hint says what to use instead.
SPECULATIVE_KEY_TRAPS: dict[str, str] = {
    "tensor_parallel_size": "vLLM refuses it in the speculative config; use speculative.draftTensorParallelSize",
    "disable_by_batch_size": "removed from vLLM; use num_speculative_tokens_per_batch_size, e.g. [[1, 32, 4], [33, 4096, 0]]",
    "acceptance_method": "removed from vLLM; use rejection_sample_method (standard is lossless)",
    "draft_model": "not a key; set speculative.model (and speculative.method: draft_model)",
    "target_model_config": "set by vLLM itself; remove it",
    "target_parallel_config": "set by vLLM itself; remove it",
    "draft_model_config": "set by vLLM itself; remove it",
    "draft_parallel_config": "set by vLLM itself; remove it",
}


def check_speculative(
    sp: spec.SpeculativeSpec, *, target_tp: int | None, release: releases.Release | None = None
) -> list[Problem]:
    """The release's SpeculativeConfig rules that can be checked without the models' HF configs.

    `release` defaults to the newest supported one."""
    path = "spec.speculative"
    release = release or releases.Release(releases.NEWEST, releases.Source.ASSUMED)
    problems: list[Problem] = []
    method = sp.method
    if not release.has_method(method):
        problems.append(
            Problem(
                f"{path}.method",
                f"{method.value!r} does not exist in {release.short} (the arms' release, "
                f"{release.describe()}); it needs vLLM >= {release.method_since(method)}",
            )
        )
    elif method.is_deprecated_mtp_alias:
        problems.append(
            Problem(
                f"{path}.method",
                f"{method.value!r} is deprecated in vLLM and replaced by 'mtp'; write method: mtp",
            )
        )
    if sp.num_speculative_tokens is None and not method.k_has_default:
        problems.append(
            Problem(
                f"{path}.numSpeculativeTokens",
                f"is required for method {method.value!r} "
                "(vLLM: num_speculative_tokens must be provided); set it to k > 0, e.g. 4",
            )
        )
    if method.needs_draft_model and not sp.model:
        problems.append(
            Problem(
                f"{path}.model",
                f"is required for method {method.value!r}: name the draft "
                "model or head (vLLM: num_speculative_tokens was provided but without "
                "speculative model)",
            )
        )
    if (
        method is spec.SpeculativeMethod.CUSTOM_CLASS
        and sp.model
        and ("." not in sp.model or "/" in sp.model)
    ):
        problems.append(
            Problem(
                f"{path}.model",
                "custom_class needs a dotted import path of the proposer, e.g. my_module.MyProposer",
            )
        )
    lookup_set = sp.prompt_lookup_min is not None or sp.prompt_lookup_max is not None
    if lookup_set and not method.is_ngram:
        field = "promptLookupMin" if sp.prompt_lookup_min is not None else "promptLookupMax"
        problems.append(
            Problem(f"{path}.{field}", f"only applies to ngram methods, not {method.value!r}; remove it")
        )
    if (
        sp.prompt_lookup_min is not None
        and sp.prompt_lookup_max is not None
        and sp.prompt_lookup_min > sp.prompt_lookup_max
    ):
        problems.append(
            Problem(
                f"{path}.promptLookupMin",
                f"must be <= promptLookupMax (vLLM: prompt_lookup_min="
                f"{sp.prompt_lookup_min} must be <= prompt_lookup_max={sp.prompt_lookup_max})",
            )
        )
    if sp.draft_tensor_parallel_size is not None:
        allowed = {1, target_tp or 1}
        if sp.draft_tensor_parallel_size not in allowed:
            problems.append(
                Problem(
                    f"{path}.draftTensorParallelSize",
                    f"must be 1 or the target's tensor parallel "
                    f"size ({target_tp or 1}), got {sp.draft_tensor_parallel_size}",
                )
            )
    problems.extend(_check_extra(sp, release))
    return problems


def _check_extra(sp: spec.SpeculativeSpec, release: releases.Release) -> list[Problem]:
    path = "spec.speculative.extra"
    problems: list[Problem] = []
    k = sp.num_speculative_tokens
    for key in sp.extra:
        normalized = key.replace("-", "_")
        if normalized in SPECULATIVE_KEY_TRAPS:
            problems.append(Problem(f"{path}.{key}", SPECULATIVE_KEY_TRAPS[normalized]))
        elif normalized in TYPED_SPECULATIVE_KEYS:
            problems.append(
                Problem(f"{path}.{key}", f"has a typed field: set {TYPED_SPECULATIVE_KEYS[normalized]}")
            )
        elif normalized not in SPECULATIVE_EXTRA_KEYS:
            problems.append(
                Problem(
                    f"{path}.{key}",
                    "is not a vLLM SpeculativeConfig field"
                    + did_you_mean(normalized, SPECULATIVE_EXTRA_KEYS),
                )
            )
        elif not release.has_key(normalized):
            problems.append(
                Problem(
                    f"{path}.{key}",
                    f"does not exist in {release.short} (the arms' release, {release.describe()}); "
                    f"it needs {release.key_range(normalized)}: remove it or set spec.engine.vllmVersion "
                    "/ the image to a release that has it",
                )
            )
    extra = {key.replace("-", "_"): value for key, value in sp.extra.items()}
    method = sp.method.value
    allowed = release.rejection_methods
    rejection = extra.get("rejection_sample_method", allowed[0])
    if rejection not in allowed:
        problems.append(
            Problem(
                f"{path}.rejection_sample_method",
                f"must be one of {', '.join(allowed)} in {release.short} ({allowed[0]} is lossless)",
            )
        )
    samplers = release.draft_sample_methods
    if samplers and extra.get("draft_sample_method", samplers[0]) not in samplers:
        problems.append(
            Problem(f"{path}.draft_sample_method", f"must be {' or '.join(samplers)} in {release.short}")
        )
    rates, length = extra.get("synthetic_acceptance_rates"), extra.get("synthetic_acceptance_length")
    if rejection == "synthetic":
        if (rates is None) == (length is None):
            problems.append(
                Problem(
                    f"{path}.rejection_sample_method",
                    "synthetic needs exactly one of "
                    "synthetic_acceptance_rates or synthetic_acceptance_length",
                )
            )
        problems.extend(_check_synthetic(path, rates, length, k))
    elif rates is not None or length is not None:
        key = "synthetic_acceptance_rates" if rates is not None else "synthetic_acceptance_length"
        problems.append(Problem(f"{path}.{key}", "is only valid with rejection_sample_method: synthetic"))
    if rejection == "fly" and k is not None:
        if k < 2:
            problems.append(Problem("spec.speculative.numSpeculativeTokens", "FLy needs at least 2"))
        window = extra.get("fly_window_size")
        if isinstance(window, int) and window >= k:
            problems.append(
                Problem(f"{path}.fly_window_size", f"must be smaller than numSpeculativeTokens ({k})")
            )
    if extra.get("use_heterogeneous_vocab"):
        if method != "draft_model":
            problems.append(Problem(f"{path}.use_heterogeneous_vocab", "only works with method: draft_model"))
        if extra.get("draft_sample_method") == "probabilistic":
            problems.append(
                Problem(
                    f"{path}.use_heterogeneous_vocab",
                    "only supports greedy draft sampling; remove draft_sample_method: probabilistic",
                )
            )
    if extra.get("index_share_for_mtp_iteration") is not None and method != "mtp":
        problems.append(
            Problem(f"{path}.index_share_for_mtp_iteration", "is only supported with method: mtp")
        )
    if extra.get("draft_lm_head_quantization") is not None:
        if method not in ("eagle", "eagle3", "mtp"):
            problems.append(
                Problem(
                    f"{path}.draft_lm_head_quantization",
                    f"is not supported for method {method!r} (only eagle, eagle3, mtp)",
                )
            )
        elif extra["draft_lm_head_quantization"] not in ("fp8", "nvfp4"):
            problems.append(Problem(f"{path}.draft_lm_head_quantization", "must be fp8 or nvfp4"))
    if extra.get("enable_adaptive_verification") and method != "dspark":
        problems.append(Problem(f"{path}.enable_adaptive_verification", "is dspark only"))
    if "num_speculative_tokens_per_batch_size" in extra:
        problems.extend(
            check_batch_schedule(
                extra["num_speculative_tokens_per_batch_size"],
                path=f"{path}.num_speculative_tokens_per_batch_size",
            )
        )
    return problems


def _check_synthetic(path: str, rates: Any, length: Any, k: int | None) -> list[Problem]:
    problems: list[Problem] = []
    if rates is not None:
        if not isinstance(rates, list) or not all(isinstance(r, int | float) for r in rates):
            return [Problem(f"{path}.synthetic_acceptance_rates", "must be a list of numbers")]
        if k is not None and len(rates) != k:
            problems.append(Problem(f"{path}.synthetic_acceptance_rates", f"must have length k = {k}"))
        if any(not 0 <= r <= 1 for r in rates):
            problems.append(Problem(f"{path}.synthetic_acceptance_rates", "entries must be in [0, 1]"))
        if any(b > a for a, b in itertools.pairwise(rates)):
            problems.append(Problem(f"{path}.synthetic_acceptance_rates", "must be non-increasing"))
    if length is not None:
        if not isinstance(length, int | float):
            problems.append(Problem(f"{path}.synthetic_acceptance_length", "must be a number"))
        elif k is not None and not 1 <= length <= k + 1:
            problems.append(
                Problem(f"{path}.synthetic_acceptance_length", f"must be in [1, k+1] = [1, {k + 1}]")
            )
    return problems


def check_batch_schedule(schedule: Any, *, path: str) -> list[Problem]:
    """vLLM's `num_speculative_tokens_per_batch_size` rules (reference §1.6)."""
    if not isinstance(schedule, list) or not schedule:
        return [
            Problem(
                path, "must be a non-empty list of [start, end, k] entries, e.g. [[1, 32, 4], [33, 4096, 0]]"
            )
        ]
    problems: list[Problem] = []
    previous_end = 0
    for i, entry in enumerate(schedule):
        where = f"{path}[{i}]"
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(v, int) for v in entry)):
            problems.append(Problem(where, "must be a list of three integers [start, end, k]"))
            continue
        start, end, k = entry
        if start <= 0 or end <= 0 or start > end:
            problems.append(Problem(where, "needs 0 < start <= end"))
        if k < 0:
            problems.append(Problem(where, "k must be >= 0 (0 turns speculation off for that range)"))
        if i == 0 and start != 1:
            problems.append(Problem(where, "the first range must start at 1"))
        if start <= previous_end:
            problems.append(Problem(where, f"overlaps the previous range (which ends at {previous_end})"))
        previous_end = max(previous_end, end)
    return problems


def batch_schedule_k(schedule: Sequence[Sequence[int]], batch: int, *, k: int) -> int:
    """k at `batch` running requests under a valid schedule, as vLLM looks it up (reference §1.6): the
    last range starting at or below `batch` applies (gaps and the tail carry its k forward), capped
    at `k`; `k` itself under an empty schedule."""
    found = k
    for start, _end, ranged in sorted(tuple(entry) for entry in schedule):
        if start > batch:
            break
        found = min(ranged, k)
    return found


def check_confirm(s: spec.ExperimentSpec, release: releases.Release) -> list[Problem]:
    """`analysis.confirm` needs a batch-size schedule that vLLM honours and that the first round does not set."""
    if not s.analysis.confirm:
        return []
    path = "spec.analysis.confirm"
    sp = s.speculative
    if s.analysis.mode is not spec.AnalysisMode.COMPARE:
        return [
            Problem(
                path, f"a {s.analysis.mode.value} run does not speculate, so it has no schedule to confirm"
            )
        ]
    problems: list[Problem] = []
    if sp.num_speculative_tokens is None:
        problems.append(
            Problem(path, "needs speculative.numSpeculativeTokens: the recommended schedule is built from k")
        )
    if not (sp.method in _SCHEDULE_METHODS or sp.method.is_deprecated_mtp_alias):
        problems.append(
            Problem(
                path,
                f"vLLM may drop num_speculative_tokens_per_batch_size for method {sp.method.value!r} (it "
                f"honours it for {', '.join(sorted(m.value for m in _SCHEDULE_METHODS))}), so the "
                "recommended schedule cannot be confirmed; remove confirm",
            )
        )
    if not release.batch_schedule:
        problems.append(
            Problem(
                path,
                f"{release.short} has no num_speculative_tokens_per_batch_size (vLLM >= "
                f"{releases.minor(releases.BATCH_SCHEDULE_SINCE)}), so there is no schedule to confirm",
            )
        )
    if "num_speculative_tokens_per_batch_size" in sp.extra:
        problems.append(
            Problem(
                path,
                "speculative.extra.num_speculative_tokens_per_batch_size is set: the stages would not measure "
                "speculation at every load, and the confirmation replaces that schedule; remove one of them",
            )
        )
    return problems


#: methods whose batch-size schedule vLLM honours on every runner (reference §1.6: the V1 runner drops
#: it for the others); the model-specific `*_mtp` names become `mtp`
_SCHEDULE_METHODS = frozenset(
    {
        spec.SpeculativeMethod.NGRAM,
        spec.SpeculativeMethod.EAGLE,
        spec.SpeculativeMethod.EAGLE3,
        spec.SpeculativeMethod.MTP,
        spec.SpeculativeMethod.DRAFT_MODEL,
        spec.SpeculativeMethod.DFLASH,
    }
)
