from __future__ import annotations

from typing import Any

import pytest

from specdecode.experiment import validation
from tests.factories import experiment_document


def problems(**overrides: Any) -> list[str]:
    return [str(p) for p in validation.check_document(experiment_document(**overrides))]


def speculative(**fields: Any) -> list[str]:
    return problems(speculative=fields)


def test_a_valid_experiment_has_no_problems() -> None:
    assert problems() == []


def test_every_problem_is_reported_at_once() -> None:
    found = problems(
        speculative={
            "method": "ngram",
            "numSpeculativeTokens": 0,
            "promptLookupMin": 5,
            "promptLookupMax": 2,
        },
        workload={"stages": [{"name": "a", "rate": 1, "concurrency": 2}], "sampling": {"maxTokens": 0}},
        analysis={"confidence": 1.5},
    )
    joined = "\n".join(found)
    for path in (
        "spec.speculative.numSpeculativeTokens",
        "spec.speculative.promptLookupMin",
        "spec.workload.stages[0]",
        "spec.workload.sampling.maxTokens",
        "spec.analysis.confidence",
    ):
        assert path in joined, joined


def test_unknown_method_names_the_field() -> None:
    (found,) = speculative(method="medusa", model="x", numSpeculativeTokens=3)
    assert found.startswith("spec.speculative.method:")
    assert "draft_model" in found


def test_deprecated_mtp_aliases_point_to_mtp() -> None:
    (found,) = speculative(method="deepseek_mtp", numSpeculativeTokens=1)
    assert "write method: mtp" in found


@pytest.mark.parametrize("k", [0, -3])
def test_num_speculative_tokens_must_be_positive(k: int) -> None:
    found = speculative(method="ngram", numSpeculativeTokens=k)
    assert any(f.startswith("spec.speculative.numSpeculativeTokens: must be greater than 0") for f in found)


def test_num_speculative_tokens_is_required_for_draft_models_but_not_for_mtp() -> None:
    assert any("numSpeculativeTokens: is required" in f for f in speculative(method="draft_model", model="d"))
    assert speculative(method="mtp") == []


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "dflash"])
def test_model_based_methods_need_a_draft_model(method: str) -> None:
    (found,) = speculative(method=method, numSpeculativeTokens=3)
    assert found.startswith("spec.speculative.model: is required")


def test_ngram_lookup_window_must_be_ordered() -> None:
    (found,) = speculative(method="ngram", numSpeculativeTokens=3, promptLookupMin=5, promptLookupMax=2)
    assert "spec.speculative.promptLookupMin: must be <= promptLookupMax" in found


def test_prompt_lookup_only_applies_to_ngram() -> None:
    (found,) = speculative(method="draft_model", model="d", numSpeculativeTokens=3, promptLookupMax=4)
    assert "only applies to ngram" in found


def test_draft_tensor_parallel_must_be_one_or_the_targets() -> None:
    assert (
        speculative(method="draft_model", model="d", numSpeculativeTokens=3, draftTensorParallelSize=1) == []
    )
    found = problems(
        engine={"args": ["--tensor-parallel-size", "4"], "resources": {"limits": {"nvidia.com/gpu": 4}}},
        speculative={
            "method": "draft_model",
            "model": "d",
            "numSpeculativeTokens": 3,
            "draftTensorParallelSize": 2,
        },
    )
    assert found == [
        "spec.speculative.draftTensorParallelSize: must be 1 or the target's tensor parallel size (4), got 2"
    ]


def test_extra_keys_are_checked_against_vllm_with_hints_for_the_traps() -> None:
    found = speculative(
        method="draft_model",
        model="d",
        numSpeculativeTokens=3,
        extra={
            "tensor_parallel_size": 2,
            "disable_by_batch_size": 8,
            "rejection_sample_methd": "x",
            "num_speculative_tokens": 4,
            "revision": "main",
        },
    )
    joined = "\n".join(found)
    assert "extra.tensor_parallel_size: vLLM refuses it" in joined and "draftTensorParallelSize" in joined
    assert (
        "extra.disable_by_batch_size: removed from vLLM; use num_speculative_tokens_per_batch_size" in joined
    )
    assert "did you mean 'rejection_sample_method'" in joined
    assert "extra.num_speculative_tokens: has a typed field: set speculative.numSpeculativeTokens" in joined
    assert "revision" not in joined


def test_synthetic_rejection_sampling_rules() -> None:
    base = {"method": "draft_model", "model": "d", "numSpeculativeTokens": 3}
    assert (
        speculative(
            **base,
            extra={"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.8, 0.6, 0.4]},
        )
        == []
    )
    assert any(
        "exactly one of" in f for f in speculative(**base, extra={"rejection_sample_method": "synthetic"})
    )
    assert any(
        "non-increasing" in f
        for f in speculative(
            **base,
            extra={"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.6, 0.4]},
        )
    )
    assert any(
        "length k = 3" in f
        for f in speculative(
            **base, extra={"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5]}
        )
    )
    assert any(
        "only valid with rejection_sample_method: synthetic" in f
        for f in speculative(**base, extra={"synthetic_acceptance_length": 2.0})
    )


def test_fly_needs_two_draft_tokens() -> None:
    found = speculative(
        method="draft_model", model="d", numSpeculativeTokens=1, extra={"rejection_sample_method": "fly"}
    )
    assert any("FLy needs at least 2" in f for f in found)


@pytest.mark.parametrize(
    ("schedule", "fragment"),
    [
        ([[1, 32, 4], [33, 4096, 0]], None),
        ([[2, 32, 4]], "must start at 1"),
        ([[1, 32, 4], [30, 64, 0]], "overlaps"),
        ([[1, 32, -1]], "k must be >= 0"),
        ([[1, 1, 4], [2, 4096, 0]], None),  # a range of one batch size: start == end is allowed
        ([[1, 32, 4], [64, 33, 0]], "needs 0 < start <= end"),  # a range that ends before it starts
        ([[1, 32]], "three integers"),
        ([], "non-empty list"),
    ],
)
def test_batch_size_schedule_follows_vllm_rules(schedule: list[Any], fragment: str | None) -> None:
    found = speculative(
        method="draft_model",
        model="d",
        numSpeculativeTokens=4,
        extra={"num_speculative_tokens_per_batch_size": schedule},
    )
    if fragment is None:
        assert found == []
    else:
        assert any(fragment in f for f in found), found


@pytest.mark.parametrize(
    "arg",
    [
        "--speculative-config",
        "--speculative_config={}",
        "-sc",
        "--speculative-config.method",
        "--spec-method",
        "--spec-tok",
        "--host",
        "--port=9000",
        "--per-request-spec-decode-metrics",
        "--disable-log-stats",
        "--seed",
        "--served-model-name",
        "--enable-prefix-caching",
        "--generation-config",
        "--api-key",
        "--speculative-model",
        "--num-speculative-tokens",
        "--config",
    ],
)
def test_engine_args_may_not_carry_flags_the_operator_owns(arg: str) -> None:
    found = problems(engine={"args": [arg, "x"]})
    assert (
        len(found) == 1
        and found[0].startswith("spec.engine.args[0]: ")
        and "owned by the operator" in found[0]
    )


def test_ordinary_engine_args_pass() -> None:
    assert (
        problems(engine={"args": ["--max-model-len", "8192", "--max_num_seqs=64", "--dtype", "bfloat16"]})
        == []
    )


CACHE = {"claimName": "hf-models"}


def test_a_model_cache_with_a_token_offline_passes() -> None:
    engine = {
        "modelCache": {**CACHE, "subPath": "hf/cache", "readOnly": True},
        "hfTokenSecret": {"name": "hf", "key": "token"},
        "offline": True,
    }
    assert problems(engine=engine) == []


@pytest.mark.parametrize("claim", ["Models", "hf_models", "-models", "models-", "a..b"])
def test_a_model_cache_claim_must_be_a_dns_1123_name(claim: str) -> None:
    (found,) = problems(engine={"modelCache": {"claimName": claim}})
    assert found.startswith(
        f"spec.engine.modelCache.claimName: {claim!r} is not a PersistentVolumeClaim name"
    )
    assert "DNS-1123" in found


def test_a_model_cache_claim_name_is_required() -> None:
    assert problems(engine={"modelCache": {"subPath": "hf"}}) == [
        "spec.engine.modelCache.claimName: is required"
    ]


@pytest.mark.parametrize("sub_path", ["/hf", "../hf", "hf/../../etc", ".."])
def test_a_model_cache_sub_path_stays_inside_the_volume(sub_path: str) -> None:
    (found,) = problems(engine={"modelCache": {**CACHE, "subPath": sub_path}})
    assert found.startswith("spec.engine.modelCache.subPath: ")
    assert "relative path inside the volume" in found


def test_offline_without_a_model_cache_is_refused_naming_the_field() -> None:
    (found,) = problems(engine={"offline": True})
    assert found.startswith("spec.engine.offline: needs spec.engine.modelCache")


def test_a_read_only_model_cache_needs_offline() -> None:
    (found,) = problems(engine={"modelCache": {**CACHE, "readOnly": True}})
    assert found.startswith(
        "spec.engine.modelCache.readOnly: a read-only cache needs spec.engine.offline: true"
    )


def test_a_token_secret_needs_a_name_and_a_key() -> None:
    assert problems(engine={"hfTokenSecret": {"name": "hf"}}) == [
        "spec.engine.hfTokenSecret.key: is required"
    ]
    assert problems(engine={"hfTokenSecret": {"name": "", "key": "token"}}) == [
        "spec.engine.hfTokenSecret.name: String should have at least 1 character (got '')"
    ]


def test_download_dir_is_refused_with_a_model_cache() -> None:
    args = ["--max-model-len", "8192", "--download_dir=/data"]
    (found,) = problems(engine={"modelCache": CACHE, "args": args})
    assert found.startswith("spec.engine.args[2]: --download-dir would put the weights outside")
    assert problems(engine={"args": args}) == []  # without a cache it is the user's choice


def test_engine_env_may_not_set_what_the_model_source_fields_set() -> None:
    env = [{"name": n, "value": "x"} for n in ("HF_HOME", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE")]
    engine = {"modelCache": CACHE, "hfTokenSecret": {"name": "hf", "key": "t"}, "offline": True, "env": env}
    assert problems(engine=engine) == [
        "spec.engine.env[0]: 'HF_HOME' is set by the operator from spec.engine.modelCache; remove it",
        "spec.engine.env[1]: 'HF_TOKEN' is set by the operator from spec.engine.hfTokenSecret; remove it",
        "spec.engine.env[2]: 'HF_HUB_OFFLINE' is set by the operator from spec.engine.offline; remove it",
        "spec.engine.env[3]: 'HF_HUB_CACHE' is set by the operator from spec.engine.modelCache; remove it",
    ]
    # without those fields the variables are the user's own (e.g. weights baked into the image)
    assert problems(engine={"env": env}) == []


def test_tensor_parallel_needs_as_many_gpus() -> None:
    found = problems(engine={"args": ["-tp", "2"], "resources": {"limits": {"nvidia.com/gpu": 1}}})
    assert found == [
        "spec.engine.resources.limits.nvidia.com/gpu: is 1 but --tensor-parallel-size is 2; "
        "each arm needs at least 2 GPUs"
    ]


def test_per_stage_lengths_need_a_synthetic_dataset_and_name_the_field() -> None:
    stages = [
        {"name": "short", "rate": 1, "inputTokens": 128},
        {"name": "long", "rate": 1, "outputTokens": 64},
    ]
    assert problems(workload={"stages": stages, "dataset": {"type": "synthetic"}}) == []
    found = problems(workload={"stages": stages, "dataset": {"type": "builtin"}})
    assert found == [
        "spec.workload.stages[0].inputTokens: only applies to a synthetic dataset (dataset.type is builtin)",
        "spec.workload.stages[1].outputTokens: only applies to a synthetic dataset (dataset.type is builtin)",
    ]


def test_stages_need_exactly_one_load_and_unique_names() -> None:
    found = problems(
        workload={
            "stages": [{"name": "a"}, {"name": "a", "rate": 1}, {"name": "b", "rate": 1, "concurrency": 2}]
        }
    )
    assert "spec.workload.stages[0]: needs exactly one of rate" in found[0]
    assert any(f.startswith("spec.workload.stages[1].name: 'a' is used by an earlier stage") for f in found)
    assert any(f.startswith("spec.workload.stages[2]: needs exactly one") for f in found)


def test_at_least_one_stage() -> None:
    assert problems(workload={"stages": []}) == [
        "spec.workload.stages: List should have at least 1 item after validation, not 0 (got [])"
    ]


def test_require_stages_must_name_stages() -> None:
    found = problems(analysis={"requireStages": ["loww"]})
    assert found == ["spec.analysis.requireStages[0]: 'loww' is not a stage (did you mean 'low'?)"]


@pytest.mark.parametrize(("field", "value"), [("confidence", 0), ("confidence", 1), ("minSpeedup", 0)])
def test_analysis_ranges(field: str, value: float) -> None:
    assert any(f.startswith(f"spec.analysis.{field}:") for f in problems(analysis={field: value}))


def test_slo_limits_name_the_field_and_need_a_percentile() -> None:
    found = problems(
        analysis={
            "slo": {"ttft": {}, "tpot": {"p90": 0}, "e2e": {"p999": 3}},
            "guardrails": {"ttftToleranceMs": -1, "maxGoodputDrop": 2},
        }
    )
    joined = "\n".join(found)
    assert "spec.analysis.slo.ttft: set at least one of p50, p90, p95, p99" in joined
    assert "spec.analysis.slo.tpot.p90: must be greater than 0" in joined
    assert "spec.analysis.slo.e2e.p999" in joined
    assert "spec.analysis.guardrails.ttftToleranceMs: must be greater than or equal to 0" in joined
    assert "spec.analysis.guardrails.maxGoodputDrop: must be less than or equal to 1" in joined
    assert problems(analysis={"slo": {"ttft": {"p90": 500}, "e2e": {"p50": 2000, "p99": 10000}}}) == []


def test_simulator_parameters_are_range_checked_and_profiles_known() -> None:
    found = problems(engine={"simulator": {"profile": "nope", "acceptanceRate": 1.5, "maxNumSeqs": 0}})
    joined = "\n".join(found)
    assert "spec.engine.simulator.acceptanceRate: must be less than or equal to 1" in joined
    assert "spec.engine.simulator.maxNumSeqs: must be greater than or equal to 1" in joined
    assert "spec.engine.simulator.profile: unknown profile 'nope'" in joined


def test_jsonl_dataset_needs_one_source() -> None:
    found = problems(workload={"stages": [{"name": "a", "rate": 1}], "dataset": {"type": "jsonl"}})
    assert found == [
        "spec.workload.dataset: a jsonl dataset needs exactly one of configMap (in a cluster) or path "
        "(local runs)"
    ]


def test_unknown_fields_suggest_the_right_name() -> None:
    (found,) = problems(analysis={"guardrails": {"maxErrorRat": 0.1}})
    assert found.startswith(
        "spec.analysis.guardrails.maxErrorRat: unknown field (did you mean 'maxErrorRate'?)"
    )


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("1exp", "DNS-1035"),
        ("Exp", "DNS-1035"),
        ("a" * 54, "at most 53"),
        ("", "is required"),
    ],
)
def test_names_must_leave_room_for_children(name: str, fragment: str) -> None:
    document = experiment_document()
    document["metadata"]["name"] = name
    found = [str(p) for p in validation.check_document(document)]
    assert any(f.startswith("metadata.name:") and fragment in f for f in found), found


def test_wrong_kind_and_api_version_are_named() -> None:
    document = experiment_document()
    document["kind"], document["apiVersion"] = "Deployment", "apps/v1"
    found = [str(p) for p in validation.check_document(document)]
    assert found[:2] == [
        "apiVersion: must be 'specdecode.io/v1alpha1', got 'apps/v1'",
        "kind: must be 'SpecDecodeExperiment', got 'Deployment'",
    ]


def test_parse_experiment_raises_with_every_problem() -> None:
    document = experiment_document(speculative={"method": "ngram"}, analysis={"confidence": 2})
    with pytest.raises(validation.InvalidSpecError) as caught:
        validation.parse_experiment(document)
    assert len(caught.value.problems) == 2


def test_a_synthetic_acceptance_length_may_be_k_plus_one_and_no_more() -> None:
    """k = 4: 1 and 5 (every draft token accepted, plus the bonus token) are lengths vLLM accepts, 5.5
    is not (mutation benchmark survivor in validation: the upper bound as `is not k + 1`)."""
    base = {"method": "ngram", "numSpeculativeTokens": 4}

    def length_problems(length: float) -> list[str]:
        extra = {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": length}
        return [p for p in speculative(**base, extra=extra) if "synthetic_acceptance_length" in p]

    assert length_problems(1) == [] and length_problems(5) == [] and length_problems(2.5) == []
    assert length_problems(5.5) == [
        "spec.speculative.extra.synthetic_acceptance_length: must be in [1, k+1] = [1, 5]"
    ]


def test_a_draft_may_share_the_target_s_tensor_parallel_size() -> None:
    """Draft TP 1 or the target's (here 2), nothing else (mutation benchmark survivor in validation: the
    target's size dropped from what is allowed)."""
    engine = {"args": ["--tensor-parallel-size", "2"]}
    draft = {"method": "draft_model", "model": "d", "numSpeculativeTokens": 3}
    tp = [
        p
        for p in problems(engine=engine, speculative={**draft, "draftTensorParallelSize": 2})
        if "Parallel" in p
    ]
    assert tp == []
    refused = problems(engine=engine, speculative={**draft, "draftTensorParallelSize": 4})
    assert any(
        "draftTensorParallelSize: must be 1 or the target's tensor parallel size (2)" in p for p in refused
    )
