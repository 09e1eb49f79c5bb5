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
    """KV-cache capacity in tokens, only for `vllm:kv_cache_usage_perc` (no preemption is modelled)."""
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
    "h200-8b-draft-1b": SimParams(draft_cost_ratio=0.1, draft_fixed_ms=6.2),
    # 2-layer draft: a pass costs 0.8 ms + 0.3 x the target step (about 2.2 ms at batch 1).
    "h200-8b-draft-tiny": SimParams(draft_cost_ratio=0.3, draft_fixed_ms=0.8),
}

DEFAULT_PROFILE = "h200-8b-draft-tiny"
