"""The `SpecDecodeExperiment` status: phases, verdicts and the measured results.

This is also the schema of `result.json` written by `specdecode run --local` (design.md §4), so
a pipeline reads the same fields from a cluster and from a laptop. Latencies are milliseconds,
rates per second, ratios plain numbers (1.31 = 31% faster).

Owned fields: the operator's reconcile loop is the only writer of `phase` (style.md §3); the
verdict module fills `stages`, `verdict`, `reason`, `message` and `recommendation`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from specdecode.experiment.validity import Validity


def _e2e_field(name: str) -> Any:
    """`e2eP50` on the wire; `e2EP50` (the camel-casing of `e2e_p50` written before 2026-12) still read."""
    return Field(
        default=None,
        serialization_alias=name,
        validation_alias=AliasChoices(name, name.replace("e2eP", "e2EP"), name.replace("e2eP", "e2e_p")),
    )


class StatusModel(BaseModel):
    """Base of the status models: camelCase on the wire; tolerant of fields written by newer versions."""

    model_config = ConfigDict(
        extra="ignore",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-ready dict with camelCase keys and no nulls."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Phase(StrEnum):
    """Where an experiment is in its life."""

    PENDING = "Pending"
    """Accepted, nothing deployed yet."""
    DEPLOYING = "Deploying"
    """The arms are being created and are not Ready yet."""
    RUNNING = "Running"
    """Both arms are Ready and the load is running."""
    ANALYZING = "Analyzing"
    """The load finished; results are being collected and judged."""
    COMPLETED = "Completed"
    """Measured and decided: `verdict` is set."""
    FAILED = "Failed"
    """Could not measure (invalid spec, infrastructure failure, deadline): no verdict."""

    @property
    def is_terminal(self) -> bool:
        """Nothing more will happen for this generation."""
        return self in {Phase.COMPLETED, Phase.FAILED}

    @property
    def is_active(self) -> bool:
        """The reconcile loop still has work to do."""
        return not self.is_terminal


class Verdict(StrEnum):
    """The answer to "does speculative decoding make this faster?" (set only when Completed)."""

    PROMOTE = "Promote"
    """Faster by at least `minSpeedup` with confidence where required, and no guardrail failed."""
    REJECT = "Reject"
    """Surely not fast enough somewhere required, or a guardrail surely failed."""
    INCONCLUSIVE = "Inconclusive"
    """Too little evidence either way; never promoted."""

    @property
    def promotes(self) -> bool:
        """Only Promote gates a rollout open."""
        return self is Verdict.PROMOTE


class ReasonCode(StrEnum):
    """CamelCase machine reasons: of the overall verdict (`status.reason`) and of each stage's verdict
    (`stages[].code`, the code of its first reason line)."""

    SPEEDUP_CONFIRMED = "SpeedupConfirmed"
    """Every required stage passed."""
    SLOWER_THAN_REQUIRED = "SlowerThanRequired"
    """A required stage is surely below minSpeedup."""
    GUARDRAIL_FAILED = "GuardrailFailed"
    """A guardrail surely failed at a required stage."""
    OUTPUT_MISMATCH = "OutputMismatch"
    """Greedy outputs of the treatment differ from the control's (critical, whatever the speed)."""
    INSUFFICIENT_EVIDENCE = "InsufficientEvidence"
    """Neither confirmed nor refuted at a required stage."""
    INVALID_MEASUREMENT = "InvalidMeasurement"
    """The load generator marked the measurement untrustworthy."""
    NO_DATA = "NoData"
    """Nothing (or too little) was measured."""
    NOISE_FLOOR = "NoiseFloor"
    """An A/A run (`analysis.mode: NoiseFloor`): measured, not judged; see `status.noiseFloor`."""
    PLACEMENT_EFFECT = "PlacementEffect"
    """The crossover found the pass comparable to the placement effect (`status.crossover`)."""


class StageVerdict(StrEnum):
    """The outcome of one load stage."""

    PASS = "Pass"
    """Speed-up lower bound ≥ minSpeedup and no guardrail failed."""
    FAIL = "Fail"
    """Speed-up upper bound < minSpeedup, or a guardrail surely failed."""
    INCONCLUSIVE = "Inconclusive"
    """Neither, or too little valid data."""


class Condition(StatusModel):
    """A kstatus-style condition."""

    type: str
    """Ready, Reconciling, Stalled, Completed or Promoted."""
    status: str
    """"True", "False" or "Unknown"."""
    reason: str = ""
    """CamelCase machine reason."""
    message: str = ""
    """One human line."""
    observed_generation: int | None = None
    """The generation this condition was computed for."""
    last_transition_time: str | None = None
    """RFC 3339 time of the last status change."""


class ArmRef(StatusModel):
    """The child Deployment of one arm."""

    deployment: str = ""
    """Deployment name."""
    ready_replicas: int = 0
    """Ready replicas."""
    pod: str | None = None
    """The Ready pod; from Running on, the pod the load measures: another in its place voids the run."""
    url: str | None = None
    """Where the load reached it."""


class Arms(StatusModel):
    """Both arms' children."""

    control: ArmRef = Field(default_factory=ArmRef)
    """The arm without speculative decoding."""
    treatment: ArmRef = Field(default_factory=ArmRef)
    """The arm with speculative decoding."""


class Host(StatusModel):
    """Where one arm ran: the facts of its host that can move a latency (issue 22)."""

    node: str | None = None
    """Node name (in `run --local`: the hostname)."""
    gpu_product: str | None = None
    """GPU product (`nvidia.com/gpu.product`, or nvidia-smi's name)."""
    gpu_uuids: list[str] | None = None
    """UUIDs of the arm's GPUs (known in `run --local`; Kubernetes does not publish them)."""
    driver_version: str | None = None
    """NVIDIA driver version."""
    cuda_version: str | None = None
    """CUDA version the driver supports (GPU Feature Discovery's runtime label, or nvidia-smi's header)."""
    cpu_model: str | None = None
    """CPU model (/proc/cpuinfo's model name, or NFD's vendor/family/model id)."""
    cpu_count: int | None = None
    """CPUs of the host (the node's capacity)."""
    instance_type: str | None = None
    """The node's `node.kubernetes.io/instance-type` label, where present."""
    vllm_version: str | None = None
    """The engine's version (`/version`, or the declared `engine.vllmVersion`)."""
    speed_factor: float | None = None
    """Simulator only: the simulated host's speed factor (1 = nominal, 1.1 = every step 10% slower)."""
    kv_cache_tokens: int | None = None
    """The arm's KV-cache capacity in tokens (`vllm:cache_config_info`: num_gpu_blocks x block_size);
    the treatment's is smaller by what the draft takes (issue #18)."""
    max_concurrency: int | None = None
    """Requests of the workload's length (a synthetic dataset's inputTokens + outputTokens) the arm's
    KV cache holds at once, each rounded up to whole blocks; unknown for prompts of varying length."""


class ArmHosts(StatusModel):
    """Where each arm ran."""

    control: Host | None = None
    """The control arm's host."""
    treatment: Host | None = None
    """The treatment arm's host."""


class Environment(StatusModel):
    """Provenance: what was actually measured."""

    image: str | None = None
    """Engine image (a cluster run of vLLM; `run --local` and the simulator use none)."""
    engine_command: str | None = None
    """`run --local`: the command line that started the control arm (the treatment's adds the
    speculative config), recorded instead of an image."""
    image_digest: str | None = None
    """Engine image digest, as the kubelet resolved it."""
    gpu_product: str | None = None
    """GPU product label of the nodes."""
    nodes: list[str] = Field(default_factory=list)
    """Nodes the arms ran on."""
    vllm_version: str | None = None
    """`/version` of the engine."""
    vllm_rules: str | None = None
    """The vLLM release whose flags and speculative-config rules the arms were rendered and validated
    with, and where it came from: `0.20.0 (image tag)`, `(spec.engine.vllmVersion)`, `(vllm --version)`,
    or `(assumed: ...)` when it could not be known and the newest supported release's rules applied."""
    model_revision: str | None = None
    """Target model revision."""
    draft_model: str | None = None
    """Draft model (or method, for model-free methods)."""
    simulator: dict[str, Any] | None = None
    """Simulator parameters, when the arms were simulated."""
    prefix_caching: bool | None = None
    """True when both arms ran with vLLM's prefix caching (`--enable-prefix-caching`): multi-turn
    sessions, or `engine.prefixCaching`; absent when off (the default, `--no-enable-prefix-caching`)."""
    arms: ArmHosts | None = None
    """Where each arm ran (node, GPU, driver, CUDA, CPU, instance type, engine version)."""
    host_differences: list[str] = Field(default_factory=list)
    """The host facts in which the arms differ (`node`, `cpuModel`, ...): when not empty, the speed-up
    may partly be the placement, which the paired interval cannot see."""


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
    e2e_p50: float | None = _e2e_field("e2eP50")
    """End-to-end latency, median, ms."""
    e2e_p90: float | None = _e2e_field("e2eP90")
    """End-to-end latency, p90, ms."""
    e2e_p99: float | None = _e2e_field("e2eP99")
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
    it: fails the stage) or NotEvaluated."""
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


class ConfirmationStage(StatusModel):
    """One stage of the confirmation round (`analysis.confirm`): the treatment with the recommended
    schedule against the control, on the stage's prompts and schedule again."""

    name: str
    """Stage name."""
    k: int
    """The schedule's k at the stage's batch size (from the first round); 0: speculation off there."""
    threshold: float
    """What the speed-up is judged against: minSpeedup where the schedule speculates (k > 0), the
    non-inferiority margin 0.98 where it does not (the treatment must not be slower than the control)."""
    speedup: Speedup | None = None
    """Speed-up of the primary metric in the confirmation round."""
    verdict: StageVerdict = StageVerdict.INCONCLUSIVE
    """Pass, Fail or Inconclusive against `threshold` (guardrails as in the first round)."""
    reasons: list[str] = Field(default_factory=list)
    """Why: one short line per finding."""
    code: ReasonCode | None = None
    """The machine reason of `verdict`, as a stage's `code`."""


class LengthRecommendation(StatusModel):
    """The recommendation over the stages of one prompt length (issue 17)."""

    input_tokens: int
    """The stages' `inputTokens`."""
    beneficial_up_to: str | None = None
    """The highest load stage of this length at which speculation still passes."""
    num_speculative_tokens_per_batch_size: list[list[int]] | None = None
    """The schedule these stages alone suggest."""
    note: str | None = None
    """One line of explanation."""


class Recommendation(StatusModel):
    """Where speculation stops paying, as a vLLM setting."""

    beneficial_up_to: str | None = None
    """The highest load stage at which speculation still passes."""
    num_speculative_tokens_per_batch_size: list[list[int]] | None = None
    """A vLLM `num_speculative_tokens_per_batch_size` schedule that turns speculation off beyond it."""
    note: str | None = None
    """One line of explanation."""
    by_input_length: list[LengthRecommendation] = Field(default_factory=list)
    """Set when the stages measured more than one prompt length (a synthetic dataset with per-stage
    `inputTokens`): the recommendation over each length's stages alone, shortest first; `note` says
    for which lengths the overall schedule holds."""
    confirmed: bool | None = None
    """`analysis.confirm`: true when the confirmation round with the schedule ran and none of its
    stages Failed, false when one did; null when it was not run or measured nothing (see
    `confirmationReason`)."""
    confirmation_reason: str | None = None
    """`analysis.confirm`: Confirmed, Refuted, NotMeasured, RoundFailed (an arm failed in the round,
    or the run was interrupted during it; the message says why), NoSchedule (nothing to confirm),
    or ArmsNotStartedHere (`--control-url`)."""
    confirmation: list[ConfirmationStage] = Field(default_factory=list)
    """`analysis.confirm`: each stage of the confirmation round."""


class SearchResult(StatusModel):
    """The break-even search (`workload.search`): its probes, why it stopped, the break-even load."""

    goal: str = "breakEven"
    """The spec's `workload.search.goal`."""
    axis: str
    """`concurrency` or `rate`."""
    ran: bool = False
    """Probes were measured."""
    reason: str | None = None
    """Why it stopped: `Converged` (the bracket cannot be split further), `MaxProbes`, `BelowRange`
    (the lower bound does not clear minSpeedup), `AboveRange` (the upper bound clears); or why it did
    not run on: `OneAfterTheOther` (arms measured one after the other), `ProbeFailed` (the operator:
    a probe's round could not be measured; `message` says why)."""
    message: str | None = None
    """One line: the bracket found, or why not."""
    break_even: float | None = None
    """The highest load measured to clear minSpeedup below the lowest that did not."""
    first_failing: float | None = None
    """The lowest load measured not to clear minSpeedup."""
    probes: list[StageResult] = Field(default_factory=list)
    """Each probe, in the order run: a paired stage with the same statistics as `stages`."""


class CrossoverPlacement(StatusModel):
    """Where each arm ran in one round of the crossover (a node, or in `run --local` the GPUs)."""

    control: str | None = None
    """The control arm's placement."""
    treatment: str | None = None
    """The treatment arm's placement."""


class CrossoverResult(StatusModel):
    """Whether the placement check (`analysis.crossover`) ran, where, and what it found."""

    mode: str
    """`IfApart` or `Always` (the spec's `analysis.crossover`)."""
    ran: bool = False
    """The stages were repeated with the placements swapped."""
    reason: str | None = None
    """Why it did not run: `NotApart` (IfApart, same hosts), `SamePlacement` (nothing to swap: one
    placement for both arms; in a cluster: both on one node), `ServersGiven` (`--control-url`/`--treatment-url`:
    nothing to redeploy), `NotMeasured` (no verdict to check),
    `SwappedRoundFailed` (started, but the swapped round could not be measured: no pass stands)."""
    message: str | None = None
    """One line: what was found, or why it did not run."""
    rounds: list[CrossoverPlacement] = Field(default_factory=list)
    """Round 1 (as measured) and round 2 (swapped)."""
    effects: dict[str, float] = Field(default_factory=dict)
    """The placement effect per stage (stage name → `stages[].placement.effect`)."""
    demoted: list[str] = Field(default_factory=list)
    """Stages that would have passed and are Inconclusive because of the placement effect."""


class Round(StatusModel):
    """One of the operator's rounds after the stages (`experiment/rounds.py`): a probe of the
    break-even search (`workload.search`), the crossover's swapped round (`analysis.crossover`) or
    the confirmation round (`analysis.confirm`)."""

    name: str
    """`Crossover`, `Confirmation`, or a search probe's stage (`search<N>-c<load>`, `search<N>-r<load>`)."""
    probe: int | None = None
    """A search probe: its number (1-based); the arms stay as they are."""
    load: float | None = None
    """A search probe: the concurrency or rate it measures."""
    nodes: CrossoverPlacement | None = None
    """The node each arm that the round starts again is pinned to (absent: an arm left as it ran)."""
    schedule: list[list[int]] | None = None
    """`Confirmation`: the `num_speculative_tokens_per_batch_size` the treatment runs with."""
    outcome: str | None = None
    """Absent while the round runs; then `Measured`, or `Failed` (the message says why: the
    stages' verdict stands, the check the round was for did not happen)."""
    message: str | None = None
    """Why the round failed."""
    started_at: str | None = None
    """When the round began (RFC 3339)."""


class StageNoiseFloor(StatusModel):
    """One stage of an A/A run (`analysis.mode: NoiseFloor`): what two identical servers measure."""

    name: str
    """Stage name."""
    load: str | None = None
    """`4 req/s` or `concurrency 16`."""
    pairs: int = 0
    """Valid pairs of the primary metric."""
    speedup: float | None = None
    """The A/A speed-up of the primary metric (geometric mean of the paired ratios; 1 is the truth)."""
    ci_low: float | None = None
    """Lower bound (paired t over every pair: an A/A stage runs its full request count)."""
    ci_high: float | None = None
    """Upper bound."""
    equivalent: bool | None = None
    """The interval lies within the equivalence band [1/minSpeedup, minSpeedup]: the arms agree."""
    min_detectable: float | None = None
    """The smallest speed-up the Compare run's design (its request bound, confidence, sequential or
    not) tells from 1.0 with 90% probability at the noise measured here."""
    measurable: bool | None = None
    """`minDetectable <= analysis.minSpeedup`: this stage can show the speed-up asked for."""
    compared: int = 0
    """Pairs whose greedy outputs were compared (both succeeded, texts known)."""
    mismatches: int = 0
    """Of those, pairs whose outputs differ."""
    mismatch_rate: float | None = None
    """mismatches / compared: how often identical servers disagree (non-bitwise-reproducible batching)."""
    mismatch_ci_low: float | None = None
    """Lower Wilson bound of the mismatch rate."""
    mismatch_ci_high: float | None = None
    """Upper Wilson bound."""


class NoiseFloor(StatusModel):
    """The result of an A/A pre-flight: per stage, the noise floor and the output determinism."""

    min_speedup: float
    """`analysis.minSpeedup` the stages were judged against."""
    stages: list[StageNoiseFloor] = Field(default_factory=list)
    """One entry per stage."""
    measurable_stages: list[str] = Field(default_factory=list)
    """Stages whose noise floor lets them show minSpeedup."""
    suggested_baseline_mismatch_rate: float | None = None
    """The upper Wilson bound of the mismatch rate pooled over all stages: a value for
    `guardrails.baselineMismatchRate` of the Compare run (null with sampling, or no texts compared)."""
    note: str | None = None
    """One line of context (e.g. that the speculative config was validated but not used)."""


class Degradation(StatusModel):
    """A start-up log line of the treatment where vLLM says it weakened speculation (`experiment/degradations.py`)."""

    kind: str
    """AsyncSchedulingDisabled, MaxModelLenLowered, MethodFallback, DraftLimited or ChatTemplate."""
    message: str
    """vLLM's message, from the log line (at most 300 characters)."""


class ArmDifference(StatusModel):
    """One way the arms' live pods differ beyond speculation (`experiment/fairness.py`)."""

    field: str
    """What differs: `imageID`, `gpuProduct`, `args`, `env.<NAME>` or `resources.<requests|limits>.<name>`."""
    control: str | None = None
    """The control's value (absent: the control has none)."""
    treatment: str | None = None
    """The treatment's value (absent: the treatment has none)."""


class ResultsRef(StatusModel):
    """Where the full per-request results and the report are stored."""

    config_map: str | None = None
    """ConfigMap (cluster) holding the report and the index of result chunks."""
    directory: str | None = None
    """Directory (local run)."""


class ExperimentStatus(StatusModel):
    """`status` of a SpecDecodeExperiment, and the body of `result.json`."""

    observed_generation: int | None = None
    """The spec generation this status describes; a verdict is bound to it."""
    phase: Phase = Phase.PENDING
    """Pending, Deploying, Running, Analyzing, Completed or Failed."""
    verdict: Verdict | None = None
    """Promote, Reject or Inconclusive (only when Completed)."""
    reason: str | None = None
    """CamelCase machine reason of the phase or verdict."""
    message: str | None = None
    """One human line."""
    speedup_summary: str | None = None
    """Primary-metric speed-up per stage in one line (printer column)."""
    conditions: list[Condition] = Field(default_factory=list)
    """kstatus conditions (Ready, Reconciling, Stalled) plus Completed and Promoted."""
    started_at: str | None = None
    """When the load started (RFC 3339)."""
    completed_at: str | None = None
    """When the experiment ended (RFC 3339)."""
    phase_started_at: str | None = None
    """When the current phase began (RFC 3339); deadlines count from here."""
    arms: Arms | None = None
    """Both arms' children."""
    environment: Environment | None = None
    """Provenance."""
    stages: list[StageResult] = Field(default_factory=list)
    """Per-stage results."""
    recommendation: Recommendation | None = None
    """Where speculation stops paying."""
    noise_floor: NoiseFloor | None = None
    """The A/A result (only with `analysis.mode: NoiseFloor`)."""
    validity: Validity | None = None
    """The load generator's own health (schedule lag, loop lag, client CPU)."""
    crossover: CrossoverResult | None = None
    """The placement check (`analysis.crossover` not Off): whether it ran and the placement effect."""
    rounds: list[Round] = Field(default_factory=list)
    """The operator's rounds after the stages (the break-even search's probes, the crossover's
    swapped round, the confirmation round), in the order run; the last one without an outcome is
    running."""
    degradations: list[Degradation] = Field(default_factory=list)
    """What the treatment's vLLM logged at start-up when it quietly weakened speculation (condition SpeculationDegraded)."""
    arm_differences: list[ArmDifference] = Field(default_factory=list)
    """How the arms' live pods differed beyond speculation once both were Ready, before the load
    (`analysis.fairness`; condition ArmsDiffer)."""
    search: SearchResult | None = None
    """The break-even search (`workload.search`): probes, why it stopped, the load."""
    results_ref: ResultsRef | None = None
    """Where the full results are."""
