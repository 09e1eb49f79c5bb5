"""The base of the status models (camelCase on the wire, tolerant of fields a newer version wrote) and
the enums every part of the status uses: the phase, the verdict, a stage's verdict and its reason code."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


def e2e_field(name: str) -> Any:
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


class ArmsCleanup(StrEnum):
    """What an ended experiment did with its arms' Deployments (`spec.cleanup`; status.cleanup)."""

    DELETED = "Deleted"
    """Deleted: the GPUs are free (`Always`; `OnSuccess` once Completed)."""
    SCALED_TO_ZERO = "ScaledToZero"
    """Kept at 0 replicas after a failure, for their spec and events (`OnSuccess`, `Never`): the
    GPUs are free; `kubectl scale deployment NAME --replicas=1` starts one again."""
    KEPT = "Kept"
    """Kept running after the verdict (`Never`): they hold their GPUs until deleted."""
    RETRYING = "Retrying"
    """The cleanup failed (the message says why): the operator retries it every tick, after a
    restart too, until it is done (`run --local`, which ends there, says what to stop by hand)."""


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
    GUARDRAIL_UNDECIDED = "GuardrailUndecided"
    """A required stage's speed-up passed, but errorRate, outputMatch or goodput was not shown to
    hold within its requests (one-sided bound at the analysis confidence)."""
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
    PLACEMENT_UNSEPARATED = "PlacementUnseparated"
    """The stages passed, but the arms ran on different hosts (`status.environment.hostDifferences`)
    and no crossover separated the placement from the speed-up: a faster host is not credited to
    speculation. Run the crossover (`analysis.crossover: IfApart`) or co-locate the arms."""


class StageVerdict(StrEnum):
    """The outcome of one load stage."""

    PASS = "Pass"
    """Speed-up lower bound ≥ minSpeedup and no guardrail failed."""
    FAIL = "Fail"
    """Speed-up upper bound < minSpeedup, or a guardrail surely failed."""
    INCONCLUSIVE = "Inconclusive"
    """Neither, or too little valid data."""
