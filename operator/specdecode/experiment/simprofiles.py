"""Named parameter sets of the vLLM simulator, fitted to real measurements.

Pure data (so validation can check a profile name without importing the simulator). Fitted to
`shared/reference/h200-vllm-measurements.md`: an 8B-shaped target on one H200, vLLM 0.20, k = 4.
The fit and its residuals are recorded in benchmarks/README.md (simulator calibration).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class SimParams:
    """All simulator parameters (design.md §6), in milliseconds where they are times."""

    decode_step_ms: float = 4.6
    batch_token_ms: float = 0.024
    prefill_token_ms: float = 0.04
    max_num_seqs: int = 256
    acceptance_rate: float = 0.8
    draft_cost_ratio: float = 0.1
    draft_fixed_ms: float = 0.0
    output_mismatch_rate: float = 0.0
    error_rate: float = 0.0

    def with_overrides(self, overrides: dict[str, float | int]) -> SimParams:
        """A copy with some parameters replaced (unknown names raise TypeError)."""
        return replace(self, **overrides)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, float | int]:
        """snake_case name -> value."""
        return asdict(self)


PROFILES: dict[str, SimParams] = {
    # Initial estimates from the reference's derived figures; refined by the calibration fit.
    "h200-8b-draft-1b": SimParams(draft_cost_ratio=1.6, draft_fixed_ms=0.0, acceptance_rate=0.8),
    "h200-8b-draft-tiny": SimParams(draft_cost_ratio=0.1, draft_fixed_ms=0.0, acceptance_rate=0.8),
}

DEFAULT_PROFILE = "h200-8b-draft-tiny"
