"""The `SpecDecodeExperiment` spec: typed, frozen models parsed once at the edge.

These models are the contract of design.md §3. The CRD's OpenAPI schema is generated from them
(`specdecode.experiment.crd`), so every field carries a description, and the schema-expressible
rules (types, enums, ranges, CEL cross-field rules) live here too, next to the field they guard.
The rules that need more than one section or vLLM's knowledge are in `validation.py`.

One file per section of the resource: `engine.py` (`spec.engine`, `spec.speculative`), `workload.py`
(`spec.workload`), `analysis.py` (`spec.analysis`); this file holds the rest (Prometheus, deadlines,
placement, cleanup), the whole `ExperimentSpec` and the `Arm`s, and re-exports every model, so the code
reads `spec.EngineSpec` whichever file holds it. `base.py` is the base model all of them share.

Invariants:
- Defaults make a *fair* comparison: prefix caching off (on for both arms alike with multi-turn
  sessions, whose later turns repeat earlier ones), greedy sampling, a fixed seed.
- Both arms share everything in `engine`; only `speculative` differs between them.
- Field names are camelCase on the wire (aliases), snake_case in Python.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from specdecode.experiment.spec.analysis import (
    AnalysisMode,
    AnalysisSpec,
    Crossover,
    Fairness,
    Guardrails,
    PrimaryMetric,
    RequireStages,
    Slo,
    SloLimits,
)
from specdecode.experiment.spec.base import MAX_NAME_LENGTH, Model, cel
from specdecode.experiment.spec.engine import (
    DNS_SUBDOMAIN,
    MODEL_CACHE_MOUNT,
    EngineSpec,
    EnvVar,
    ModelCache,
    Quantity,
    Resources,
    SecretKeyRef,
    SimulatorSpec,
    SpeculativeMethod,
    SpeculativeSpec,
    Toleration,
)
from specdecode.experiment.spec.workload import (
    MAX_LOAD_PODS,
    Arrival,
    BuiltinDataset,
    ConfigMapKeyRef,
    Dataset,
    JsonlDataset,
    MultiTurnDataset,
    Sampling,
    Search,
    SearchBounds,
    Stage,
    Sweep,
    SweepAxis,
    SyntheticDataset,
    TraceDataset,
    WorkloadSpec,
)

__all__ = [
    "DNS_SUBDOMAIN",
    "MAX_LOAD_PODS",
    "MAX_NAME_LENGTH",
    "MODEL_CACHE_MOUNT",
    "AnalysisMode",
    "AnalysisSpec",
    "Arrival",
    "BuiltinDataset",
    "ConfigMapKeyRef",
    "Crossover",
    "Dataset",
    "EngineSpec",
    "EnvVar",
    "Fairness",
    "Guardrails",
    "JsonlDataset",
    "Model",
    "ModelCache",
    "MultiTurnDataset",
    "PrimaryMetric",
    "Quantity",
    "RequireStages",
    "Resources",
    "Sampling",
    "Search",
    "SearchBounds",
    "SecretKeyRef",
    "SimulatorSpec",
    "Slo",
    "SloLimits",
    "SpeculativeMethod",
    "SpeculativeSpec",
    "Stage",
    "Sweep",
    "SweepAxis",
    "SyntheticDataset",
    "Toleration",
    "TraceDataset",
    "WorkloadSpec",
    "cel",
]
"""The sections' models, re-exported: the rest of the code reads `spec.EngineSpec` whichever file holds it."""

# --------------------------------------------------------------------------------------- the rest


class PrometheusSpec(Model):
    """Where the operator reads server-side metrics."""

    url: str = Field(min_length=1, pattern=r"^https?://")
    """Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090."""


_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$")


def parse_duration(text: str) -> float:
    """`1h30m`, `90s`, `2h` -> seconds."""
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration like 30m, 2h or 1h30m")
    hours, minutes, seconds = (int(g[:-1]) if g else 0 for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


Duration = Annotated[str, Field(pattern=r"^(\d+h)?(\d+m)?(\d+s)?$", min_length=2)]


class Deadlines(Model):
    """Time limits; passing one ends the experiment Failed (never with a verdict)."""

    deploy: Duration = "30m"
    """From creation until both arms are Ready (model download and loading included)."""
    run: Duration = "2h"
    """From the start of the load until the verdict."""

    @property
    def deploy_seconds(self) -> float:
        """`deploy` in seconds."""
        return parse_duration(self.deploy)

    @property
    def run_seconds(self) -> float:
        """`run` in seconds."""
        return parse_duration(self.run)


class Colocate(StrEnum):
    """Whether both arms must share a node (each with its own GPUs)."""

    PREFERRED = "Preferred"
    """Ask the scheduler to put both arms on one node (preferred pod affinity); they land apart when
    no node has GPUs for both, and the status says so."""
    REQUIRED = "Required"
    """Both arms on one node or not at all: an arm that cannot join the other stays Unschedulable, and
    the experiment fails after the grace period."""
    OFF = "Off"
    """No affinity: the scheduler places each arm on its own."""


class PlacementSpec(Model):
    """Where the arms run. A host's CPU, driver, clocks and neighbours weigh on a small draft's many
    short passes far more than on the control: arms on different nodes measure the nodes too."""

    colocate: Colocate = Colocate.PREFERRED
    """`Preferred` (default), `Required` or `Off`: pod affinity on the experiment's label with topology
    key `kubernetes.io/hostname`."""


class Cleanup(StrEnum):
    """What happens to the arms' Deployments once the experiment ends."""

    ALWAYS = "Always"
    """Delete them whatever the outcome (frees the GPUs)."""
    ON_SUCCESS = "OnSuccess"
    """Delete them when Completed; after a failure keep them for debugging, at 0 replicas (their
    GPUs are freed; the Deployments, their spec and events remain)."""
    NEVER = "Never"
    """Keep them: running after a verdict; after a failure at 0 replicas (no failure holds a GPU)."""


class ExperimentSpec(Model):
    """`spec` of a SpecDecodeExperiment."""

    model: str = Field(min_length=1)
    """Target model: a Hugging Face id, or a path inside the image or under `/models` (`engine.modelCache`)."""
    model_revision: str = ""
    """Target model revision (recorded in status)."""
    served_model_name: str = ""
    """Name the arms serve the model under (default: `model`)."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """The engine shared by both arms."""
    speculative: SpeculativeSpec
    """The speculative config of the treatment arm."""
    workload: WorkloadSpec
    """The load both arms receive."""
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    """How the verdict is reached."""
    prometheus: PrometheusSpec | None = None
    """Where server-side metrics are read (operator: required unless it has a default; local: optional)."""
    deadlines: Deadlines = Field(default_factory=Deadlines)
    """Time limits."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    """Where the arms run: on one node by preference (the status records each arm's host)."""
    cleanup: Cleanup = Cleanup.ALWAYS
    """What happens to the arms once the experiment ends."""

    @property
    def speculates(self) -> bool:
        """The treatment runs with speculation (False in an A/A `NoiseFloor` run)."""
        return self.analysis.mode is AnalysisMode.COMPARE

    @property
    def served_name(self) -> str:
        """The name requests use as `model`."""
        return self.served_model_name or self.model

    @property
    def sessions(self) -> bool:
        """The workload is multi-turn sessions (`dataset.type: multiTurn`)."""
        return isinstance(self.workload.dataset, MultiTurnDataset)

    @property
    def prefix_caching(self) -> bool:
        """Both arms run with vLLM's prefix caching: `engine.prefixCaching`, or multi-turn sessions
        (whose later turns are measured with the earlier turns cached, on both arms alike)."""
        return self.engine.prefix_caching or self.sessions

    def stage_requests(self, stage: Stage) -> int:
        """Measured requests of one stage (its own bound or `requestsPerStage`)."""
        return stage.requests if stage.requests is not None else self.workload.requests_per_stage

    def stage_dataset(self, stage: Stage) -> SyntheticDataset:
        """The synthetic dataset of one stage: the workload's with the stage's `inputTokens` and
        `outputTokens` where set (the workload's dataset must be synthetic)."""
        dataset = self.workload.dataset
        assert isinstance(dataset, SyntheticDataset)
        update = {
            k: v
            for k, v in (("input_tokens", stage.input_tokens), ("output_tokens", stage.output_tokens))
            if v is not None
        }
        return dataset.model_copy(update=update) if update else dataset


class Arm(StrEnum):
    """The two arms of an experiment."""

    CONTROL = "control"
    """vLLM without speculative decoding."""
    TREATMENT = "treatment"
    """vLLM with `--speculative-config` (without it in `analysis.mode: NoiseFloor`)."""
