"""How the two arms are compared and judged (`spec.analysis`): metric, guardrails, SLOs, modes."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from specdecode.experiment.spec.base import Model, cel, cel_extra

# ------------------------------------------------------------------------------------------- analysis


class PrimaryMetric(StrEnum):
    """The metric whose speed-up decides the verdict."""

    TPOT = "tpot"
    """Time per output token after the first: the decode speed speculation is meant to improve."""
    E2E = "e2e"
    """End-to-end request latency."""
    TTFT = "ttft"
    """Time to first token."""
    THROUGHPUT = "throughput"
    """Output tokens per second over the stage."""


class Guardrails(Model):
    """Limits that block a promotion whatever the speed-up."""

    max_ttft_regression: float | None = Field(default=0.10, ge=0, le=100)
    """p90 TTFT may get worse by at most this fraction (0.10 = +10%), unless it rises by no more than
    `ttftToleranceMs`; null disables."""
    ttft_tolerance_ms: float = Field(default=50.0, ge=0, le=3_600_000)
    """A TTFT regression counts only when p90 TTFT also rises by more than this many milliseconds:
    speculation adds a draft prefill, so TTFT rises a little almost always (H200: +9 ms), which no
    user perceives next to a faster decode. 0 judges the ratio alone."""
    max_goodput_drop: float | None = Field(default=0.02, ge=0, le=1)
    """With `analysis.slo` set: goodput (the fraction of requests meeting every SLO) must not surely
    drop (its interval's upper bound below 0 blocks a Pass), nor surely drop by more than this
    (0.02 = 2 points: fails the stage); null disables."""
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    """Highest tolerated fraction of failed requests in the treatment arm."""
    min_output_match: float = Field(default=0.99, ge=0, le=1)
    """Lowest fraction of treatment outputs equal to the control's under greedy sampling (lossless check)."""
    baseline_mismatch_rate: float | None = Field(default=None, ge=0, le=1)
    """The rate at which two identical servers already give different greedy outputs (the
    `suggestedBaselineMismatchRate` of a `NoiseFloor` run). Set: the output-match limit becomes
    `minOutputMatch - baselineMismatchRate` and only a sure breach (the whole interval below it)
    fails; a breach of the estimate alone blocks a Pass. Unset: any breach is critical."""
    min_acceptance_rate: float | None = Field(default=None, ge=0, le=1)
    """Lowest acceptable draft acceptance rate; null disables."""


class SloLimits(Model):
    """Latency limits of one metric, in milliseconds, per percentile: `p90: 500` = 90% of requests
    within 500 ms."""

    model_config = ConfigDict(
        json_schema_extra=cel_extra(
            cel(
                "has(self.p50) || has(self.p90) || has(self.p95) || has(self.p99)",
                "set at least one of p50, p90, p95, p99",
            )
        )
    )

    p50: float | None = Field(default=None, gt=0, le=3_600_000)
    """Median limit, ms."""
    p90: float | None = Field(default=None, gt=0, le=3_600_000)
    """p90 limit, ms."""
    p95: float | None = Field(default=None, gt=0, le=3_600_000)
    """p95 limit, ms."""
    p99: float | None = Field(default=None, gt=0, le=3_600_000)
    """p99 limit, ms."""

    @model_validator(mode="after")
    def _one_set(self) -> SloLimits:
        if not self.limits():
            raise ValueError("set at least one of p50, p90, p95, p99")
        return self

    def limits(self) -> list[tuple[int, float]]:
        """(percentile, ms) of each limit set, lowest percentile first."""
        pairs = ((50, self.p50), (90, self.p90), (95, self.p95), (99, self.p99))
        return [(p, ms) for p, ms in pairs if ms is not None]


class Slo(Model):
    """Service-level objectives: what the platform promises its users, per metric and percentile.

    They judge each arm absolutely: an SLO guardrail per limit (the treatment must not miss one the
    control meets) and goodput (the fraction of requests meeting every SLO) per arm and stage."""

    ttft: SloLimits | None = None
    """Time to first token, ms."""
    tpot: SloLimits | None = None
    """Time per output token after the first, ms."""
    e2e: SloLimits | None = None
    """End-to-end request latency, ms."""

    def limits(self) -> list[tuple[str, int, float]]:
        """(metric, percentile, ms) of every limit set."""
        return [
            (metric, p, ms)
            for metric, limits in (("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e))
            if limits is not None
            for p, ms in limits.limits()
        ]


RequireStages = Literal["all", "any"] | list[str]


class Crossover(StrEnum):
    """Whether to repeat the stages with the arms' placements swapped, to measure the placement effect
    (issue 22; `crossover.py`)."""

    OFF = "Off"
    """No repeat: when the arms ran on different hosts, the speed-up includes the placement, so no pass
    is promoted (`PlacementUnseparated`)."""
    IF_APART = "IfApart"
    """Repeat only when the arms' hosts differ (`status.environment.hostDifferences` not empty)."""
    ALWAYS = "Always"
    """Repeat whenever the arms have placements that can be swapped."""


class AnalysisMode(StrEnum):
    """What the run measures."""

    COMPARE = "Compare"
    """Control against the speculative treatment: the verdict."""
    NOISE_FLOOR = "NoiseFloor"
    """An A/A pre-flight: both arms without speculation, the same analysis; reports per stage the
    smallest speed-up measurable at that load and how often identical servers disagree on greedy
    outputs (`status.noiseFloor`). Always Inconclusive with reason `NoiseFloor`."""


class Fairness(StrEnum):
    """What a difference between the arms' live pods beyond speculation does (issue 18;
    `experiment/fairness.py`): another image digest, GPU product, resources, args or env."""

    WARN = "Warn"
    """Measure anyway: a Warning event, the condition ArmsDiffer and `status.armDifferences` name it."""
    FAIL = "Fail"
    """Fail with reason ArmsDiffer before the load (the arms are released per `spec.cleanup`)."""


class AnalysisSpec(Model):
    """How the verdict is reached."""

    mode: AnalysisMode = AnalysisMode.COMPARE
    """`Compare` (default): control against treatment. `NoiseFloor`: an A/A pre-flight, both arms
    without speculation (the speculative config is still validated, not used); every stage runs
    its full request count."""
    primary_metric: PrimaryMetric = PrimaryMetric.TPOT
    """The metric whose speed-up decides."""
    min_speedup: float = Field(default=1.10, gt=0, le=100)
    """Promote only if the lower confidence bound of the speed-up clears this (1.10 = 10% faster)."""
    confidence: float = Field(default=0.95, gt=0, lt=1)
    """Confidence level of the intervals, in (0, 1)."""
    guardrails: Guardrails = Field(default_factory=Guardrails)
    """Limits that block a promotion whatever the speed-up."""
    slo: Slo = Field(default_factory=Slo)
    """Latency SLOs per metric and percentile (ms); none by default, since they depend on the model,
    the hardware and the prompts. Setting one adds its guardrail and goodput."""
    require_stages: RequireStages = Field(
        default="all", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """`all`, `any`, or a list of stage names that must pass for Promote."""
    sequential: bool = True
    """Stop a stage early once its decision can no longer change (error guarantee holds under the looks)."""
    crossover: Crossover = Crossover.OFF
    """`Off` (default), `IfApart` or `Always`: after the stages, repeat each with the arms' placements
    swapped (the control where the treatment ran and back), estimate the placement effect from the two
    rounds, and turn a stage that would pass into Inconclusive (`PlacementEffect`) when that effect is
    comparable to its margin over minSpeedup. The operator swaps the arms' nodes (each arm's pod
    pinned to the other's node: `status.rounds`); `specdecode run --local` swaps the arms' GPU sets.
    Arms on one node have nothing to swap (`SamePlacement`)."""
    crossover_fraction: float = Field(default=0.5, gt=0, le=1)
    """The swapped round's share of each stage's requests, in (0, 1] (0.5: half as many pairs; at least
    10 requests a stage)."""
    confirm: bool = False
    """After the stages, restart the treatment with the recommended `num_speculative_tokens_per_batch_size`
    and run the stages against the control again; `status.recommendation.confirmed` is true only if no
    stage of that round Fails (stages where the schedule turns speculation off are judged as
    non-inferior, speed-up >= 0.98). In a cluster the treatment's Deployment is rendered again with
    the schedule on its node (`status.rounds`); the stages' verdict stands whatever the round finds."""

    fairness: Fairness = Fairness.WARN
    """`Warn` (default) or `Fail`: what the operator does when, once both arms are Ready, their pods
    differ in anything but the speculative flags (image digest, node GPU product, resources, args,
    env). `specdecode run --local` starts both arms from one command line and does not check."""

    @field_validator("require_stages")
    @classmethod
    def _non_empty(cls, value: RequireStages) -> RequireStages:
        if isinstance(value, list) and not value:
            raise ValueError("must name at least one stage (or be 'all' or 'any')")
        return value
