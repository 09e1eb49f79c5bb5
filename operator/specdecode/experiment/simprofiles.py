"""Named parameter sets of the vLLM simulator, fitted to real measurements.

Pure data (so validation can check a profile name without importing the simulator). Fitted to
`benchmarks/h200-vllm-measurements.md`: an 8B-shaped target on one H200, vLLM 0.20, k = 4.
The step model these parameters feed is described in `specdecode/simulator/scheduler.py`; the fit
(`benchmarks/simulator/fit.py`) and its residuals are recorded in benchmarks/README.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class SimParams:
    """All simulator parameters (design.md §6), in milliseconds where they are times."""

    decode_step_ms: float = 4.64
    """Target decode step at batch 1 (the batch-independent part: weight reads, launches)."""
    batch_token_ms: float = 0.011
    """Extra step time per verified decode token in the step (decode seqs x (k+1)); the compute slope."""
    prefill_token_ms: float = 0.014
    """Prefill time per prompt token (chunked under max_num_batched_tokens)."""
    request_overhead_ms: float = 12.0
    """API-server time between a request's arrival and its entry into the engine's queue (HTTP,
    tokenisation, scheduling): part of TTFT and E2E, not of TPOT. 12 ms matches the H200's TTFT at C = 1."""
    max_num_seqs: int = 256
    """Batch cap; more requests wait in a FIFO queue."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step (vLLM's flag of the same name); prompts are prefilled in chunks."""
    kv_cache_tokens: int = 500_000
    """The target's KV-cache capacity in tokens (control arm), for `vllm:kv_cache_usage_perc`,
    `vllm:cache_config_info` and the start-up log line (no preemption is modelled)."""
    draft_kv_share: float = 0.0
    """Fraction of that capacity the draft takes in the treatment (its weights and its own KV per
    token): the treatment's capacity is `kv_cache_tokens x (1 - draft_kv_share)` (issue #18)."""
    acceptance_rate: float = 0.8
    """Per-position conditional acceptance probability of a draft token (treatment)."""
    draft_cost_ratio: float = 0.1
    """One draft forward pass relative to a target decode step at the same batch."""
    draft_fixed_ms: float = 0.0
    """Fixed cost per draft pass (launches, sync), independent of the draft's size."""
    output_mismatch_rate: float = 0.0
    """Fraction of treatment requests whose text diverges from the control's (fault injection)."""
    batch_variance_rate: float = 0.0
    """Fraction of requests, in either arm, whose greedy text diverges from the deterministic one at
    a random position: real servers are not bitwise reproducible across batch compositions."""
    error_rate: float = 0.0
    """Fraction of requests answered with an error (fault injection)."""

    def kv_capacity_tokens(self, *, speculative: bool) -> int:
        """KV-cache tokens of an arm: the whole pool without a draft, less the draft's share with one."""
        share = self.draft_kv_share if speculative else 0.0
        return round(self.kv_cache_tokens * (1.0 - share))

    def with_overrides(self, overrides: dict[str, float | int]) -> SimParams:
        """A copy with some parameters replaced (unknown names raise TypeError)."""
        return replace(self, **overrides)  # type: ignore[arg-type]

    def slower(self, factor: float) -> SimParams:
        """The same engine on a host `factor` times slower (1.1: every step, draft pass and request
        overhead takes 10% longer). A uniform factor is the simplest model of a slower host: on the
        H200 the host weighs more on small drafts' launch-bound passes (issue 22)."""
        times = (
            "decode_step_ms",
            "batch_token_ms",
            "prefill_token_ms",
            "request_overhead_ms",
            "draft_fixed_ms",
        )
        return replace(self, **{name: getattr(self, name) * factor for name in times})

    def as_dict(self) -> dict[str, float | int]:
        """snake_case name -> value."""
        return asdict(self)


PROFILES: dict[str, SimParams] = {
    # Fitted by benchmarks/simulator/fit.py (residuals in benchmarks/README.md). The target's
    # decode_step_ms, batch_token_ms and prefill_token_ms are shared (the defaults above).
    # 16-layer draft: a pass costs 6.2 ms + 0.1 x the target step (about 6.7 ms at batch 1).
    # draft_kv_share is an estimate from the shapes, not a measurement: the target's KV costs 128 KiB
    # a token (32 layers x 8 KV heads x 128 x K,V x bf16), the 1B draft's 32 KiB more (16 x 8 x 64),
    # and its 2.5 GB of weights come out of the same pool: 1 - 128/160 plus ~3% = 0.23.
    "h200-8b-draft-1b": SimParams(draft_cost_ratio=0.1, draft_fixed_ms=6.2, draft_kv_share=0.23),
    # 2-layer draft: a pass costs 0.8 ms + 0.3 x the target step (about 2.2 ms at batch 1).
    # Estimated as above: 2 target-shaped layers add 8 KiB a token (1 - 128/136) plus ~0.5 GB of weights.
    "h200-8b-draft-tiny": SimParams(draft_cost_ratio=0.3, draft_fixed_ms=0.8, draft_kv_share=0.07),
}

DEFAULT_PROFILE = "h200-8b-draft-tiny"
