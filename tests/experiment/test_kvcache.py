"""The KV-cache capacity parser against the strings vLLM itself emits (issue #18)."""

from __future__ import annotations

import pytest

from specdecode.experiment import kvcache, spec, status

# vLLM 0.33's /metrics: the info gauge's labels are CacheConfig fields (no model_name), value 1.
METRICS = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",\
cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",\
is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="2184",num_gpu_blocks_override="None",\
prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4"} 1.0
"""

# vLLM 0.33 logs one merged line (vllm/v1/core/kv_cache_utils.py); older releases two lines.
LOG_033 = (
    "(EngineCore_DP0 pid=812) INFO 12-01 10:00:01 [kv_cache_utils.py:1087] GPU KV cache size: "
    "34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x\n"
)
LOG_OLD = (
    "INFO 06-01 10:00:01 [kv_cache_utils.py:634] GPU KV cache size: 1,234,560 tokens\n"
    "INFO 06-01 10:00:01 [kv_cache_utils.py:637] Maximum concurrency for 2,048 tokens per request: 602.81x\n"
)
LOG_CONCURRENCY_ONLY = "INFO [executor_base.py:113] Maximum concurrency for 2048 tokens per request: 17.06x\n"


def test_metrics_give_blocks_times_block_size() -> None:
    assert kvcache.from_metrics(METRICS) == kvcache.KVCapacity(tokens=2184 * 16, block_size=16)


def test_metrics_without_the_info_gauge_or_before_profiling_give_none() -> None:
    assert kvcache.from_metrics(METRICS.replace("vllm:cache_config_info{", "vllm:other{")) is None
    assert kvcache.from_metrics(METRICS.replace('num_gpu_blocks="2184"', 'num_gpu_blocks="None"')) is None


def test_the_labels_prometheus_keeps_give_the_same_capacity_as_the_scrape() -> None:
    labels = {"block_size": "16", "num_gpu_blocks": "2184", "pod": "exp-control-1", "namespace": "llm"}
    assert kvcache.from_labels(labels) == kvcache.from_metrics(METRICS)
    assert kvcache.from_labels({**labels, "num_gpu_blocks": "None"}) is None


def test_a_host_gets_the_capacity_and_the_requests_of_the_workload_it_holds() -> None:
    host = status.Host(node="n1")
    capacity = kvcache.KVCapacity(tokens=1600, block_size=16)
    assert kvcache.with_capacity(host, capacity, 161) == status.Host(
        node="n1", kv_cache_tokens=1600, max_concurrency=9
    )
    assert kvcache.with_capacity(host, capacity, None).max_concurrency is None
    assert kvcache.with_capacity(host, None, 161) is host


def test_the_merged_033_line_and_the_older_two_lines_give_the_tokens() -> None:
    assert kvcache.from_log(LOG_033) == kvcache.KVCapacity(tokens=34_952)
    assert kvcache.from_log(LOG_OLD) == kvcache.KVCapacity(tokens=1_234_560)


def test_the_concurrency_line_alone_gives_max_model_len_times_the_factor() -> None:
    assert kvcache.from_log(LOG_CONCURRENCY_ONLY) == kvcache.KVCapacity(tokens=34_938)  # 2048 x 17.06
    assert kvcache.from_log("INFO Application startup complete.\n") is None


def test_max_concurrency_rounds_each_request_up_to_whole_blocks() -> None:
    cap = kvcache.KVCapacity(tokens=1600, block_size=16)
    assert cap.max_concurrency(160) == 10
    assert cap.max_concurrency(161) == 9  # 161 tokens take 11 blocks = 176 tokens
    assert kvcache.KVCapacity(tokens=1600).max_concurrency(161) == 9
    with pytest.raises(ValueError):
        cap.max_concurrency(0)


def test_draft_share_is_the_capacity_the_treatment_lacks() -> None:
    control = kvcache.KVCapacity(tokens=100_000, block_size=16)
    assert kvcache.draft_share(control, kvcache.KVCapacity(tokens=77_000)) == pytest.approx(0.23)
    assert kvcache.draft_share(control, kvcache.KVCapacity(tokens=120_000)) == 0.0


def hosts(control: int | None, treatment: int | None, held: tuple[int, int] | None) -> status.ArmHosts:
    c, t = held if held is not None else (None, None)
    return status.ArmHosts(
        control=status.Host(kv_cache_tokens=control, max_concurrency=c),
        treatment=status.Host(kv_cache_tokens=treatment, max_concurrency=t),
    )


def stage(name: str, verdict: status.StageVerdict, batch: float) -> status.StageResult:
    return status.StageResult(name=name, verdict=verdict, batch_size=batch)


def test_summary_words_the_share_and_what_each_arm_holds() -> None:
    lines = kvcache.summary(hosts(100_000, 77_000, (781, 601)), [])
    assert lines == [
        "memory: the draft takes 23% of the KV cache (77,000 of 100,000 tokens): the treatment holds "
        "at most 601 running requests of this workload's length (control 781)"
    ]
    assert kvcache.summary(hosts(100_000, 77_000, None), []) == [
        "memory: the draft takes 23% of the KV cache (77,000 of 100,000 tokens)"
    ]
    assert kvcache.summary(hosts(None, 77_000, None), []) == []
    assert kvcache.summary(None, []) == []


def test_a_failing_stage_beyond_the_treatments_capacity_names_the_draft_as_the_likely_cause() -> None:
    stages = [
        stage("c512", status.StageVerdict.PASS, 700),  # beyond, but not a loss
        stage("c600", status.StageVerdict.FAIL, 600),  # a loss within the capacity: not this cause
        stage("c700", status.StageVerdict.FAIL, 700),
    ]
    lines = kvcache.summary(hosts(100_000, 77_000, (781, 601)), stages)
    assert lines[1:] == [
        "stage c700: about 700 running requests exceed the 601 the treatment's KV cache holds "
        "(control 781): the capacity the draft takes is the likely cause of the loss"
    ]


def test_request_tokens_are_known_for_synthetic_prompts_only() -> None:
    synthetic = spec.WorkloadSpec.model_validate(
        {
            "dataset": {"type": "synthetic", "inputTokens": 100, "outputTokens": 28},
            "stages": [{"name": "a", "concurrency": 1}],
        }
    )
    assert kvcache.request_tokens(synthetic) == 128
    jsonl = synthetic.model_copy(update={"dataset": spec.JsonlDataset(type="jsonl", path="p.jsonl")})
    assert kvcache.request_tokens(jsonl) is None
