"""vLLM 0.33's Prometheus metrics for the simulator, rendered by hand (no prometheus_client).

Names, types, labels and default buckets follow `vllm/v1/metrics/loggers.py` of vLLM 0.33
(reference: shared/reference/vllm-0.33-facts.md §3): every series has the labels
`model_name` (first served name) and `engine="0"`; counters are exposed with `_total`;
histograms with `_bucket{le}`, `_sum`, `_count`. The `vllm:spec_decode_*` counters exist only
when speculation is configured, as in vLLM. `_created` samples are omitted (readers ignore them).
Rendering by hand keeps an observation to a list increment, which matters at 10k chunks/s.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from specdecode.simulator.dcgm import DcgmGpu

CONTENT_TYPE = b"text/plain; version=1.0.0; charset=utf-8"

BLOCK_SIZE = 16
"""Tokens per KV-cache block: vLLM's default on CUDA (`--block-size` is accepted and ignored)."""

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def request_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to max_model_len."""
    out: list[float] = []
    base = 1
    while True:
        for m in (1, 2, 5):
            v = m * base
            if v > max_model_len:
                return tuple(out)
            out.append(v)
        base *= 10


def _num(v: float) -> str:
    return repr(float(v))


class Histogram:
    """One histogram series."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Record one sample."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, labels: str, out: list[str]) -> None:
        """Append the `_bucket`, `_count` and `_sum` lines."""
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append(f'{name}_bucket{{{labels},le="{bound!r}"}} {_num(acc)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {_num(self.count)}')
        out.append(f"{name}_count{{{labels}}} {_num(self.count)}")
        out.append(f"{name}_sum{{{labels}}} {_num(self.sum)}")


FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class EngineMetrics:
    """The engine's counters, gauges and histograms; the scheduler updates them, `/metrics` renders them."""

    def __init__(
        self,
        *,
        model_name: str,
        num_spec_tokens: int,
        max_model_len: int = 2048,
        kv_cache_tokens: int = 0,
        prefix_caching: bool = False,
        dcgm: DcgmGpu | None = None,
    ) -> None:
        self.model_name = model_name
        self.dcgm = dcgm
        """The GPU's DCGM exporter series, served along (`--dcgm`); None: not served."""
        self.k = num_spec_tokens
        self.num_gpu_blocks = kv_cache_tokens // BLOCK_SIZE
        """KV-cache blocks of this arm, as `vllm:cache_config_info{num_gpu_blocks}` (0: not exposed)."""
        self.prefix_caching = prefix_caching
        # gauges
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        # counters
        self.prompt_tokens = 0
        self.prompt_tokens_computed = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.preemptions = 0
        self.success: dict[str, int] = dict.fromkeys(FINISH_REASONS, 0)
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.spec_accepted_per_pos = [0] * num_spec_tokens
        # histograms
        tokens = request_token_buckets(max_model_len)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)
        self.queue_time = Histogram(LATENCY_BUCKETS)
        self.prefill_time = Histogram(LATENCY_BUCKETS)
        self.decode_time = Histogram(LATENCY_BUCKETS)
        self.inference_time = Histogram(LATENCY_BUCKETS)
        self.request_prompt_tokens = Histogram(tokens)
        self.request_generation_tokens = Histogram(tokens)
        self.request_max_tokens = Histogram(tokens)
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)

    def kv_cache_log_line(self, max_model_len: int) -> str:
        """The start-up line vLLM 0.33 logs once (`vllm/v1/core/kv_cache_utils.py`)."""
        tokens = self.num_gpu_blocks * BLOCK_SIZE
        return (
            f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for {max_model_len:,} "
            f"tokens per request: {tokens / max_model_len:.2f}x"
        )

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        lab = f'model_name="{self.model_name}",engine="0"'
        out: list[str] = []

        def head(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")

        def gauge(name: str, help_: str, value: float) -> None:
            head(name, "gauge", help_)
            out.append(f"{name}{{{lab}}} {_num(value)}")

        def counter(name: str, help_: str, value: float) -> None:
            head(name, "counter", help_)
            out.append(f"{name}_total{{{lab}}} {_num(value)}")

        def hist(name: str, help_: str, h: Histogram) -> None:
            head(name, "histogram", help_)
            h.render(name, lab, out)

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", self.running)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting)
        head("vllm:num_requests_waiting_by_reason", "gauge", "Number of requests waiting, by reason.")
        out.append(f'vllm:num_requests_waiting_by_reason{{{lab},reason="capacity"}} {_num(self.waiting)}')
        out.append(f'vllm:num_requests_waiting_by_reason{{{lab},reason="deferred"}} 0.0')
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage)
        if self.num_gpu_blocks:
            # An info gauge: the CacheConfig fields as labels, no model_name (vLLM's `log_metrics_info`).
            head("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
            out.append(
                f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",cache_dtype="auto",'
                f'enable_prefix_caching="{self.prefix_caching}",engine="0",'
                f'gpu_memory_utilization="0.9",num_cpu_blocks="None",'
                f'num_gpu_blocks="{self.num_gpu_blocks}",num_gpu_blocks_override="None"}} 1.0'
            )
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", self.preemptions)
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        head("vllm:prompt_tokens_by_source", "counter", "Number of prompt tokens by source.")
        cached = self.prompt_tokens - self.prompt_tokens_computed
        for source, v in (
            ("local_compute", self.prompt_tokens_computed),
            ("local_cache_hit", cached),
            ("external_kv_transfer", 0),
        ):
            out.append(f'vllm:prompt_tokens_by_source_total{{{lab},source="{source}"}} {_num(v)}')
        counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", cached)
        counter("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens)
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            self.prefix_cache_queries,
        )
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            self.prefix_cache_hits,
        )
        head("vllm:request_success", "counter", "Count of successfully processed requests.")
        for reason, v in self.success.items():
            out.append(f'vllm:request_success_total{{{lab},finished_reason="{reason}"}} {_num(v)}')
        hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", self.request_prompt_tokens)
        hist(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            self.request_generation_tokens,
        )
        hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            self.iteration_tokens,
        )
        hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            self.request_max_tokens,
        )
        hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft)
        hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl)
        hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            self.tpot,
        )
        hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e)
        hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            self.queue_time,
        )
        hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            self.inference_time,
        )
        hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            self.prefill_time,
        )
        hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            self.decode_time,
        )
        if self.k > 0:
            counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", self.spec_drafts)
            counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", self.spec_draft_tokens)
            counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", self.spec_accepted)
            head(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "counter",
                "Accepted tokens per draft position.",
            )
            for pos, v in enumerate(self.spec_accepted_per_pos):
                out.append(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{pos}"}} {_num(v)}'
                )
        if self.dcgm is not None:
            self.dcgm.render(self.running, out)
        out.append("")
        return "\n".join(out).encode()
