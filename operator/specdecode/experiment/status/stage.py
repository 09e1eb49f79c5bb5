"""One stage's results (`status.stages[]`): per-arm quantiles, speed-ups, guardrails, acceptance,
break-even, categories, placement and GPU."""

from __future__ import annotations

from pydantic import Field

from specdecode.experiment.status.base import ReasonCode, StageVerdict, StatusModel, e2e_field


class Goodput(StatusModel):
    """Requests of one arm in one stage that met every configured SLO (`analysis.slo`).

    A request is good when it succeeded and each metric with an SLO is within that metric's
    largest limit (with `p50: 200, p99: 1000`, within 1000 ms: the limits say how many requests
    may exceed the smaller ones, which the SLO guardrails judge); failed requests are never good."""

    requests: int = 0
    """Requests sent."""
    good: int = 0
    """Requests that met every SLO."""
    fraction: float | None = None
    """good / requests."""
    ci_low: float | None = None
    """Lower bound of `fraction` (Wilson score interval at the analysis confidence)."""
    ci_high: float | None = None
    """Upper bound of `fraction`."""
    per_second: float | None = None
    """Good requests per second of the arm's active time (its first send → its last response)."""


class ArmSummary(StatusModel):
    """One arm's measurements in one stage (client side, warm-up excluded)."""

    requests: int = 0
    """Requests sent."""
    errors: int = 0
    """Requests that failed."""
    ttft_p50: float | None = None
    """Time to first token, median, ms."""
    ttft_p90: float | None = None
    """Time to first token, p90, ms."""
    ttft_p99: float | None = None
    """Time to first token, p99, ms."""
    tpot_p50: float | None = None
    """Time per output token, median, ms."""
    tpot_p90: float | None = None
    """Time per output token, p90, ms."""
    tpot_p99: float | None = None
    """Time per output token, p99, ms."""
    e2e_p50: float | None = e2e_field("e2eP50")
    """End-to-end latency, median, ms."""
    e2e_p90: float | None = e2e_field("e2eP90")
    """End-to-end latency, p90, ms."""
    e2e_p99: float | None = e2e_field("e2eP99")
    """End-to-end latency, p99, ms."""
    output_tokens_per_second: float | None = None
    """Output tokens of successful requests per second of this arm's own active time in the stage
    (its first request sent → its last response finished), so a faster arm shows more."""
    goodput: Goodput | None = None
    """Requests meeting every SLO (only with `analysis.slo` set)."""
    prefix_cache_hit_rate: float | None = None
    """Fraction of the arm's prompt tokens served from vLLM's prefix cache in the stage
    (Δ vllm:prefix_cache_hits / Δ vllm:prefix_cache_queries; only with prefix caching on, e.g.
    multi-turn sessions, and server metrics read)."""


class Speedup(StatusModel):
    """Control over treatment for the primary metric (> 1 means speculation is faster)."""

    metric: str
    """tpot, e2e, ttft or throughput."""
    estimate: float | None = None
    """Point estimate, inside its interval: `groupSequential`, the median-unbiased estimate at the look
    that decided the stage (the plain mean there is biased away from minSpeedup by stopping early);
    `pairedT`, the geometric mean of the paired ratios."""
    ci_low: float | None = None
    """Lower confidence bound."""
    ci_high: float | None = None
    """Upper confidence bound."""
    p_value: float | None = None
    """p-value of "no speed-up at minSpeedup"."""
    n: int = 0
    """Valid pairs of the stage."""
    method: str | None = None
    """How the interval was computed: `groupSequential` (valid under the sequential looks) or `pairedT` (fixed horizon)."""
    decided_at: int | None = None
    """`groupSequential`: pairs at the look that decided the stage, which the estimate and interval
    use (pairs that finished after it were in flight at the stop)."""
    min_detectable: float | None = None
    """The noise floor at this load: the smallest true speed-up the stage's design (its request
    bound, minSpeedup, confidence) promotes with 90% probability at the noise measured here (the
    spread of the paired ratios). A speed-up below it was unlikely to be shown: measure more
    requests per stage, or accept a lower minSpeedup."""


class QuantileSpeedup(StatusModel):
    """Speed-up of one quantile of a metric (tails), control quantile over treatment quantile."""

    metric: str
    """tpot, e2e or ttft."""
    quantile: float
    """0.5, 0.9 or 0.99."""
    estimate: float | None = None
    """Point estimate."""
    ci_low: float | None = None
    """Lower bound (paired bootstrap, percentile)."""
    ci_high: float | None = None
    """Upper bound."""


class GuardrailResult(StatusModel):
    """One guardrail of one stage: the estimate, its uncertainty and what it decided."""

    name: str
    """ttftRegression, errorRate, outputMatch, acceptanceRate, goodput, or an SLO such as sloTtftP90."""
    limit: float
    """The configured limit (an SLO's in ms, its estimate the treatment's percentile; goodput's
    `maxGoodputDrop`, its estimate the change of the goodput fraction, treatment - control)."""
    estimate: float | None = None
    """Point estimate."""
    ci_low: float | None = None
    """Lower confidence bound."""
    ci_high: float | None = None
    """Upper confidence bound."""
    outcome: str = "Holds"
    """Holds, Breached (estimate beyond the limit: blocks a Pass), SurelyBreached (the bound is beyond
    it: fails the stage), Undecided (errorRate, outputMatch, goodput: the estimate is within the
    limit, its one-sided bound not yet; blocks a Pass) or NotEvaluated."""
    tolerance: float | None = None
    """ttftRegression: `ttftToleranceMs`; the regression counts only when p90 TTFT also rose by more.
    outputMatch: `baselineMismatchRate`, already taken off `limit`; only SurelyBreached fails then."""
    difference: float | None = None
    """ttftRegression: treatment p90 TTFT - control p90 TTFT, ms."""
    difference_ci_low: float | None = None
    """Lower confidence bound of `difference` (paired bootstrap)."""
    difference_ci_high: float | None = None
    """Upper confidence bound of `difference`."""
    note: str | None = None
    """Why it decided as it did, when that is not plain from the numbers."""


class Acceptance(StatusModel):
    """Draft acceptance of the treatment arm, and where each estimate came from."""

    rate: float | None = None
    """Accepted / proposed draft tokens."""
    mean_length: float | None = None
    """Tokens per verify step, bonus token included."""
    per_position: list[float] = Field(default_factory=list)
    """Acceptance rate at each draft position."""
    source: str | None = None
    """Where `rate` came from: prometheus, perRequest or clientProxy."""
    sources: dict[str, float] = Field(default_factory=dict)
    """The rate estimated each available way."""
    agreement: bool | None = None
    """Whether the available estimates agree."""


class BreakEven(StatusModel):
    """The draft acceptance a failing stage needed to reach minSpeedup, next to the measured one (#18).

    From the measured step costs: speed-up scales with the mean acceptance length 1 + k * rate
    (`experiment/breakeven.py`); exact for a TPOT primary metric, approximate for E2E and throughput."""

    k: int
    """numSpeculativeTokens of the treatment."""
    acceptance_rate: float
    """Accepted / drafted tokens at which this stage's speed-up would reach minSpeedup (> 1: none does)."""
    ci_low: float | None = None
    """Lower bound of `acceptanceRate`, from the speed-up's upper confidence bound."""
    ci_high: float | None = None
    """Upper bound of `acceptanceRate`, from the speed-up's lower confidence bound."""
    mean_length: float
    """Mean acceptance length (tokens per step) at `acceptanceRate`."""
    per_token: float | None = None
    """Independent per-token acceptance giving `meanLength` ((1 - a^(k+1)) / (1 - a)); None when unreachable."""
    reachable: bool = True
    """False when even full acceptance would not pay at this load."""
    measured_rate: float | None = None
    """The acceptance rate measured on the experiment's prompts."""
    measured_ci_low: float | None = None
    """Lower confidence bound of `measuredRate` (Clopper-Pearson on token counts)."""
    measured_ci_high: float | None = None
    """Upper confidence bound of `measuredRate`."""
    measured_mean_length: float | None = None
    """The mean acceptance length measured."""


class CategoryResult(StatusModel):
    """One prompt category within one stage (datasets whose prompts carry a `category`).

    Informative, like the tails: the interval is a fixed-horizon paired t interval on the category's
    pairs, not adjusted for the sequential looks or for comparing several categories; the stage's
    verdict does not depend on it."""

    name: str
    """The category (chat, code, summarisation, math, ...)."""
    pairs: int = 0
    """Pairs of this category where both arms succeeded."""
    speedup: float | None = None
    """Primary-metric speed-up: the geometric mean of the paired ratios."""
    ci_low: float | None = None
    """Lower bound (paired t at the analysis confidence; from 3 pairs)."""
    ci_high: float | None = None
    """Upper bound."""
    acceptance_rate: float | None = None
    """Draft acceptance of the category's treatment requests (per-request counts, else the client proxy)."""
    mean_length: float | None = None
    """Tokens per verify step, bonus token included."""


class StagePlacement(StatusModel):
    """The placement effect of one stage, from the crossover (`analysis.crossover`, `crossover.py`).

    Round 1 is the stage as measured; round 2 repeats it with the arms' placements swapped. With r1
    and r2 the two rounds' speed-ups, `speedup` = sqrt(r1 * r2) (the host factor cancels) and `effect`
    = sqrt(r1 / r2) (how much faster round 1's treatment placement made the treatment look)."""

    effect: float | None = None
    """The placement effect in round 1: > 1 means the placement made the treatment look faster."""
    ci_low: float | None = None
    """Lower confidence bound of `effect`."""
    ci_high: float | None = None
    """Upper confidence bound of `effect`."""
    speedup: float | None = None
    """The speed-up without the placement: the geometric mean of both rounds' speed-ups."""
    speedup_ci_low: float | None = None
    """Lower confidence bound of `speedup`."""
    speedup_ci_high: float | None = None
    """Upper confidence bound of `speedup`."""
    swapped: Speedup | None = None
    """Round 2's speed-up (placements swapped; fixed-horizon paired interval)."""
    demoted: bool = False
    """The stage would have passed; the placement effect turned it Inconclusive (`PlacementEffect`)."""


class ArmGpu(StatusModel):
    """One arm's GPUs over one stage window, from NVIDIA's DCGM exporter through Prometheus (issue #18).

    Per GPU: with several GPUs (tensor parallelism) each figure is the mean over them, `memoryUsedMaxMib`
    the highest on any of them."""

    gpus: int = 0
    """The arm's GPUs the exporter reported in the stage (series of `DCGM_FI_DEV_GPU_UTIL`)."""
    utilization_mean: float | None = None
    """Mean GPU utilisation over the stage, % (`DCGM_FI_DEV_GPU_UTIL`)."""
    memory_used_mean_mib: float | None = None
    """Mean framebuffer memory used, MiB (`DCGM_FI_DEV_FB_USED`; vLLM takes its KV cache up front, so
    this is about `gpu_memory_utilization` of the GPU whatever the load)."""
    memory_used_max_mib: float | None = None
    """Highest framebuffer memory used, MiB."""
    power_mean_watts: float | None = None
    """Mean power draw, W (`DCGM_FI_DEV_POWER_USAGE`)."""


class StageGpu(StatusModel):
    """Both arms' GPU telemetry over one stage (issue #18)."""

    source: str
    """`dcgm-exporter` when Prometheus held the exporter's series for an arm's pods; `absent` when it
    held none for either (no exporter, or one without its Kubernetes pod mapping)."""
    control: ArmGpu | None = None
    """The control arm's GPUs (None: no series for its pods)."""
    treatment: ArmGpu | None = None
    """The treatment arm's GPUs (None: no series for its pods)."""


class StageResult(StatusModel):
    """Results and verdict of one load stage."""

    name: str
    """Stage name."""
    load: str | None = None
    """`4 req/s` or `concurrency 16`."""
    control: ArmSummary = Field(default_factory=ArmSummary)
    """The control arm."""
    treatment: ArmSummary = Field(default_factory=ArmSummary)
    """The treatment arm."""
    speedup: Speedup | None = None
    """Speed-up of the primary metric."""
    acceptance: Acceptance | None = None
    """Draft acceptance."""
    output_match: float | None = None
    """Fraction of paired outputs that are identical."""
    verdict: StageVerdict = StageVerdict.INCONCLUSIVE
    """Pass, Fail or Inconclusive."""
    reasons: list[str] = Field(default_factory=list)
    """Why: one short line per finding (guardrails, evidence)."""
    code: ReasonCode | None = None
    """The machine reason of `verdict` (the code of the first line of `reasons`)."""
    stopped_early: bool = False
    """Sequential analysis ended the stage before `requestsPerStage`."""
    tails: list[QuantileSpeedup] = Field(default_factory=list)
    """Speed-ups of the primary metric's p50, p90 and p99 (informative; they do not decide)."""
    guardrails: list[GuardrailResult] = Field(default_factory=list)
    """Each guardrail's estimate, bounds and outcome."""
    batch_size: float | None = None
    """Estimated running requests in the treatment: the concurrency (closed loop), or rate × mean E2E
    (open loop, Little's law); maps the stage onto vLLM's batch-size schedule."""
    categories: list[CategoryResult] = Field(default_factory=list)
    """Speed-up and acceptance per prompt category (only when the prompts carry categories)."""
    turns: list[CategoryResult] = Field(default_factory=list)
    """Multi-turn sessions: speed-up and acceptance per turn index (`name`: the turn, from 1), informative
    like the categories."""
    placement: StagePlacement | None = None
    """The placement effect and the speed-up without it (only when the crossover ran)."""
    break_even: BreakEven | None = None
    """Failing stages: the acceptance that would have paid at this load, next to the measured one."""
    gpu: StageGpu | None = None
    """GPU utilisation, memory and power of each arm's pods in the stage (the operator, from NVIDIA's
    DCGM exporter through Prometheus; `run --local` reads no exporter and leaves it unset)."""
    started_at: str | None = None
    """When the stage's first request was due (RFC 3339; set by the operator, which exports it as
    `specdecode_stage_start_time_seconds` for the dashboard's stage markers)."""
    finished_at: str | None = None
    """When the stage's last response finished (RFC 3339; set by the operator)."""
