"""The `SpecDecodeExperiment` status: phases, verdicts and the measured results.

This is also the schema of `result.json` written by `specdecode run --local` (design.md §4), so
a pipeline reads the same fields from a cluster and from a laptop. Latencies are milliseconds,
rates per second, ratios plain numbers (1.31 = 31% faster).

Owned fields: the operator's reconcile loop is the only writer of `phase` (style.md §3); the
verdict module fills `stages`, `verdict`, `reason`, `message` and `recommendation`.

One file per part: `base.py` (the base model, the phase, verdict and reason-code enums), `stage.py` (one
stage's results), `environment.py` (where the arms ran, how they differ); this file holds the rest and the
whole `ExperimentStatus`, and re-exports every model.
"""

from __future__ import annotations

from pydantic import Field

from specdecode.experiment.status.base import (
    ArmsCleanup,
    Phase,
    ReasonCode,
    StageVerdict,
    StatusModel,
    Verdict,
)
from specdecode.experiment.status.environment import (
    ArmDifference,
    ArmHosts,
    ArmRef,
    Arms,
    Degradation,
    Environment,
    Host,
)
from specdecode.experiment.status.stage import (
    Acceptance,
    ArmGpu,
    ArmSummary,
    BreakEven,
    CategoryResult,
    Goodput,
    GuardrailResult,
    QuantileSpeedup,
    Speedup,
    StageGpu,
    StagePlacement,
    StageResult,
)
from specdecode.experiment.validity import Validity

__all__ = [
    "Acceptance",
    "ArmDifference",
    "ArmGpu",
    "ArmHosts",
    "ArmRef",
    "ArmSummary",
    "Arms",
    "ArmsCleanup",
    "BreakEven",
    "CategoryResult",
    "Degradation",
    "Environment",
    "Goodput",
    "GuardrailResult",
    "Host",
    "Phase",
    "QuantileSpeedup",
    "ReasonCode",
    "Speedup",
    "StageGpu",
    "StagePlacement",
    "StageResult",
    "StageVerdict",
    "StatusModel",
    "Verdict",
]
"""The parts' models, re-exported: the code reads `status.StageResult` whichever file holds it."""


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


class ResultsRef(StatusModel):
    """Where the full per-request results and the report are stored."""

    config_map: str | None = None
    """ConfigMap (cluster) holding the report and the index of result chunks."""
    directory: str | None = None
    """Directory (local run)."""
    objects: str | None = None
    """Where the load Job's result bundles are, when the operator keeps them in S3
    (`s3://<bucket>/<prefix>/<namespace>/<experiment>/generation-<n>/`; `run --local --results-store`:
    the object written)."""


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
    validity: Validity | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """The load generator's own health (schedule lag, loop lag, client CPU; each load pod's in `pods`)."""
    # (unknown fields preserved: the API server would prune the nested blocks of a plain map)
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
    cleanup: ArmsCleanup | None = None
    """Once ended: what became of the arms' Deployments (`spec.cleanup`); Retrying until a cleanup
    that failed is done. Absent: there were no arms to clean up."""
