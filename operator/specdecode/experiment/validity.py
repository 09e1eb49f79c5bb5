"""The validity block: the load generator's own word on whether its measurement can be trusted.

Written by the load generator into `loadgen-summary.json` under `validity` (`loadgen/summary.py`:
schedule lag, event-loop lag and client CPU against their budgets, the connections it opened, how
it stamped events); merged by `run --local` when the arms ran one after the other (`merged`); read by
the verdict (`stage`: the run's and a stage's `valid` and `reasons`), the crossover and the
confirmation; carried unchanged into `status.validity` and shown by the report.

The JSON is the load generator's own, snake_case, and every program reads it through these models
and no other way. A block is read as it was written and written back exactly so (`wire`): the keys it
was read with, nulls included, and the keys a load generator of another version added (kept as
extras), so a status or a stored result written by any load image parses and round-trips to the same
JSON. A missing key reads as its default (a block without `valid` is valid). A new field is one more
optional attribute here: older blocks lack it and still parse, older readers keep it as an extra.

The CRD types `status.validity` as a free-form object: an arm's block nests a whole block (`arms`),
which a structural schema cannot express, and the API server must keep what any load image wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, model_serializer
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from specdecode.experiment.spec import Arm

INTERRUPTED = "the run was interrupted"
"""The reason the load generator gives when its run was cut short (a cancelled load, Ctrl-C)."""


class Block(BaseModel):
    """Base of the validity models: snake_case, every key kept, written back as read."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

    @model_serializer(mode="plain")
    def _as_written(self) -> dict[str, Any]:
        """The fields that were set (read, or passed when built) and the extras, nulls included, whatever
        the caller's `exclude_none` (status is dumped with it; the block is the load generator's)."""
        fields = {
            name: getattr(self, name) for name in type(self).model_fields if name in self.model_fields_set
        }
        return {**fields, **(self.model_extra or {})}

    def wire(self) -> dict[str, Any]:
        """The JSON-ready dict, exactly as the block was written."""
        return self.model_dump(mode="json")


class Distribution(Block):
    """A distribution over samples (`loadgen/summary.dist`): count, mean, quantiles, maximum (ms)."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


class StageValidity(Block):
    """What the block says about one stage: valid, or not and why."""

    valid: bool = True
    reasons: list[str] = Field(default_factory=list)


class Validity(Block):
    """The validity block (`loadgen-summary.json` and `status.validity`); the fields in the load
    generator's order."""

    valid: bool = True
    """False: the measurement cannot be trusted (`reasons` say why); no verdict is drawn from it."""
    reasons: list[str] = Field(default_factory=list)
    """One line per budget exceeded (or the interruption)."""
    schedule_lag_ms: Distribution | None = None
    """Send - intended send over the measured requests (open loop)."""
    schedule_lag_budget_ms: float | None = None
    """The schedule lag's p99 above which the run is invalid."""
    loop_lag_ms: Distribution | None = None
    """The load generator's event-loop lag (its ticker's lateness)."""
    loop_lag_budget_ms: float | None = None
    """The loop lag's p99 above which the run is invalid (when the loop stamps the events)."""
    client_cpu_percent: float | None = None
    """The load generator's own CPU over the run."""
    client_cpu_budget_percent: float | None = None
    """The client CPU above which the run is invalid."""
    connections_opened: dict[Arm, int] | None = None
    """Connections opened per arm."""
    stamps: str | None = None
    """How events were stamped: `kernel` (the socket's receive time) or `loop`."""
    stages: dict[str, StageValidity] = Field(default_factory=dict)
    """Per stage, when a stage alone is invalid."""
    simultaneous: bool | None = None
    """False when the arms ran one after the other (`run --local` on one GPU: `merged`)."""
    arms: dict[Arm, Validity | None] | None = None
    """Arms run one after the other: each arm's own block (None: that load left none)."""
    invalid_pods: list[int] | None = None
    """Several load pods (`workload.loadPods`, merged by `loadpods.merge`): those whose block was invalid."""
    pods: list[Validity] | None = None
    """Several load pods: each pod's own block, its index under `pod`."""

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """A free-form object (the CRD's `status.validity`: the module docstring says why)."""
        return {"type": "object", "additionalProperties": True}

    @classmethod
    def of_summary(cls, summary: Mapping[str, Any]) -> Validity | None:
        """The block of a `loadgen-summary.json` document (None: it has none)."""
        block = summary.get("validity")
        return cls.model_validate(block) if isinstance(block, Mapping) else None

    def stage(self, name: str) -> StageValidity:
        """The run's and the stage's validity together (a stage without an entry is as the run)."""
        own = self.stages.get(name)
        if own is None:
            return StageValidity(valid=self.valid, reasons=list(self.reasons))
        return StageValidity(valid=self.valid and own.valid, reasons=[*self.reasons, *own.reasons])

    def forgiving(self, reason: str) -> Validity:
        """The block without `reason` (valid when no other reason is left): the stages finished before
        an interruption are not invalidated by it."""
        reasons = [r for r in self.reasons if r != reason]
        return self.model_copy(update={"reasons": reasons, "valid": not reasons})


def of_stage(validity: Validity | None, name: str) -> StageValidity:
    """The run's and stage `name`'s validity (no block: valid)."""
    return validity.stage(name) if validity is not None else StageValidity(valid=True)


def merged(control: Validity | None, treatment: Validity | None) -> Validity:
    """Arms run one after the other (`run --local`, one GPU): valid when both loads were, each reason
    prefixed with its arm, each arm's block kept under `arms`, `simultaneous` false."""
    blocks = {Arm.CONTROL: control, Arm.TREATMENT: treatment}
    reasons = [
        f"{arm}: {reason}" for arm, block in blocks.items() if block is not None for reason in block.reasons
    ]
    valid = all(block.valid for block in blocks.values() if block is not None)
    return Validity(valid=valid, reasons=reasons, simultaneous=False, arms=blocks)
