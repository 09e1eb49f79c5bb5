"""What the shells observe and what the core asks of them: the vocabulary of one tick. Pure.

A shell (the kopf handler, `controller/handlers.py`; `run --local`, `local/lifecycle.py`) fills an
`Observed` from its world (Pods and Jobs; local processes and an in-process load), hands it with the
`Subject` to `reconcile.decide`, carries out the `Decision`'s actions in order and keeps its status.
A tick that raised is a `Fault` (`reconcile.decide_after_fault`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from specdecode.experiment import fairness, secretrefs, spec, status
from specdecode.experiment.status import ExperimentStatus, Round, Verdict
from specdecode.experiment.validity import Validity


class Action(StrEnum):
    """What the shell must do this tick, in order, before persisting the status."""

    DELETE_STALE = "DeleteStale"
    """Delete children built for another generation (a spec change restarts the experiment)."""
    CREATE_ARMS = "CreateArms"
    """Create-if-absent both arms and their Services, NetworkPolicy and the load Job's RBAC."""
    CREATE_LOAD = "CreateLoad"
    """Create-if-absent the load Job."""
    RELEASE_ARMS = "ReleaseArms"
    """Delete the arms' PodDisruptionBudget: the experiment has ended, drains may evict them again."""
    CLEANUP_ARMS = "CleanupArms"
    """Delete both arms' Deployments (frees the GPUs) per the cleanup policy."""
    SCALE_DOWN_ARMS = "ScaleDownArms"
    """Scale both arms' Deployments to 0 replicas (frees the GPUs, keeps the Deployments): a
    failure under a cleanup policy that keeps them (`OnSuccess`, `Never`)."""
    DELETE_LOAD = "DeleteLoad"
    """Delete the load Job of the last round (the stages' Job when no round was started) and its
    pod: an abort, or a round that failed (the load stops now)."""
    KEEP_FINISHED_STAGES = "KeepFinishedStages"
    """The run failed during the load, whose Job had stored results: read the stages it finished
    (`Finished`), which `reconcile.keep_finished` folds into the failure (the failure stands)."""
    STORE_REPORT = "StoreReport"
    """Store the report the shell prepared (`Report`) where status.resultsRef says: the operator's
    ConfigMap `<exp>-report`, `run --local`'s DIR/report.html and result.json. Before the status is
    persisted: a report that cannot be stored is a fault of the tick (`reconcile.decide_after_fault`)."""


@dataclass(frozen=True)
class PodState:
    """What matters about one pod for failure detection."""

    name: str
    phase: str = "Pending"
    node: str | None = None
    ready: bool = False
    unschedulable: str | None = None
    """The scheduler's message while PodScheduled is False with reason Unschedulable."""
    unschedulable_since: datetime | None = None
    waiting_reason: str | None = None
    waiting_message: str | None = None
    last_terminated_reason: str | None = None
    last_exit_code: int | None = None
    restarts: int = 0
    image_id: str | None = None
    round: str | None = None
    """The round the pod was rendered for (`keys.ROUND_ANNOTATION`; None: the stages)."""


@dataclass(frozen=True)
class ArmState:
    """One arm's Deployment and pods."""

    exists: bool = False
    ready_replicas: int = 0
    pods: tuple[PodState, ...] = ()
    """The arm's live pods (built for this generation, not being deleted)."""
    leaving: tuple[str, ...] = ()
    """Names of the arm's pods being deleted: evicted, preempted, drained or deleted by someone."""
    refused: str | None = None
    """The controller's message while the API server refuses to create the arm's pod (Pod Security
    admission, a ResourceQuota, a LimitRange): the Deployment's ReplicaFailure condition."""
    refused_since: datetime | None = None

    @property
    def ready(self) -> bool:
        """At least one replica passes its readiness probe."""
        return self.exists and self.ready_replicas >= 1


@dataclass(frozen=True)
class Report:
    """A report the shell prepared while it judged, stored only when decide() ends the experiment
    with it (`Action.STORE_REPORT`)."""

    html: str | None = None
    """report.html, rendered while the run's records were at hand (the operator renders it in its
    analysis thread, within the memory bound of a collection); None: rendered when stored, from the
    decided status (`run --local`, whose records stay in memory)."""
    result: dict[str, Any] | None = None
    """result.json as rendered with `html`: the status the report shows."""


@dataclass(frozen=True)
class Finished:
    """What a load that failed had finished, read because decide() asked (`Action.KEEP_FINISHED_STAGES`)."""

    stages: list[status.StageResult] = field(default_factory=list)
    """The stages both arms finished, judged; empty: none, or their results could not be read."""
    results_ref: status.ResultsRef | None = None
    """Where their report goes."""
    report: Report | None = None
    unkept: str | None = None
    """Why stages some load pods finished are not kept (`spec.workload.loadPods` > 1: a stage only
    some pods finished is a partial schedule), for the failure's message; None: none such."""


@dataclass(frozen=True)
class JobState:
    """The load Job."""

    exists: bool = False
    uid: str | None = None
    """The Job's uid: the results it wrote are owned by it."""
    succeeded: bool = False
    failed: bool = False
    reason: str | None = None
    message: str | None = None
    pod: PodState | None = None
    stored: bool = False
    """The Job has stored results for this generation (the load stores them after every stage): a
    load that fails still leaves the stages it finished (`Action.KEEP_FINISHED_STAGES`)."""


@dataclass(frozen=True)
class Judgement:
    """The verdict module's answer, ready to merge into status."""

    verdict: Verdict
    reason: str
    message: str
    stages: list[status.StageResult] = field(default_factory=list)
    recommendation: status.Recommendation | None = None
    noise_floor: status.NoiseFloor | None = None
    crossover: status.CrossoverResult | None = None
    search: status.SearchResult | None = None
    speedup_summary: str | None = None
    validity: Validity | None = None
    environment: status.Environment | None = None
    results_ref: status.ResultsRef | None = None
    next_round: Round | None = None
    """A round is owed before the verdict (`rounds.py`): the other fields are the judgement so far,
    kept in status while the round runs (without a verdict)."""
    degradations: list[status.Degradation] | None = None
    """What the treatment's log says vLLM weakened, read by the shell at the end (`run --local`,
    whose treatment may start only after the Running entry: one GPU); None: as read when the load
    started (`Observed.degradations`)."""
    report: Report | None = None
    """The report of this judgement, stored if the experiment ends with it (`Action.STORE_REPORT`);
    None: none to store."""


@dataclass(frozen=True)
class CollectFailure:
    """Results could not be collected or judged."""

    reason: str
    message: str
    transient: bool = False
    """Worth retrying until the analysis grace period is over (e.g. Prometheus unreachable)."""
    stages: list[status.StageResult] = field(default_factory=list)
    """The stages as measured when the run was measured but cannot be judged (an invalid measurement:
    `run --local` keeps them in result.json and its report); kept in status.stages of the Failed."""
    speedup_summary: str | None = None
    validity: Validity | None = None


@dataclass(frozen=True)
class Fault:
    """A tick that raised before its decision was carried out: an API call refused, an answer of
    an unexpected shape. It is retried every tick, but never past the phase's deadline."""

    reason: str
    """The status reason should it end the experiment (`ChildRejected`, `ReconcileError`, ...)."""
    message: str
    permanent: bool = False
    """Retrying cannot help (the API server refused an object as invalid): fail at once."""
    action: Action | None = None
    """The decision's action that raised (None: observing or deciding raised)."""


@dataclass(frozen=True)
class Observed:
    """Everything the shell saw this tick."""

    arms: dict[spec.Arm, ArmState] = field(default_factory=dict)
    job: JobState = field(default_factory=JobState)
    """The load Job of the round in progress (the stages' Job outside of a round)."""
    stale_children: tuple[str, ...] = ()
    """Children labelled with another generation than the current one."""
    analysis: Judgement | CollectFailure | None = None
    """Only in Analyzing: the collected and judged results."""
    scraped: bool | None = None
    """Once both arms are Ready: whether Prometheus scrapes both (None: not checked)."""
    hosts: dict[spec.Arm, status.Host] = field(default_factory=dict)
    """Once both arms are Ready: where each arm's pod runs (empty: not read)."""
    degradations: list[status.Degradation] | None = None
    """Once both arms are Ready: what the treatment's log says vLLM weakened (None: not read)."""
    arm_pods: dict[spec.Arm, fairness.ArmPod] = field(default_factory=dict)
    """Once both arms are Ready: each arm's live pod as `fairness` compares them (empty: not read)."""
    environment: status.Environment | None = None
    """Once both arms are Ready, where the shell knows the whole environment itself (`run --local`:
    the command that started the arms, no image, its own hosts): taken as it is instead of the one
    built from the pods and `hosts` (None: built here)."""
    secrets: tuple[secretrefs.Seen, ...] = ()
    """In Pending: the Secrets the pods will read (`secretrefs.needed`), as found in the experiment's
    namespace (empty: none needed, or not checked: the operator may not read Secrets)."""


@dataclass(frozen=True)
class Timing:
    """Operator settings that shape decisions."""

    unschedulable_grace: timedelta = timedelta(seconds=60)
    """How long a pod may stay Unschedulable (a cluster autoscaler may add a GPU node)."""
    analysis_grace: timedelta = timedelta(minutes=5)
    """How long transient collection failures (Prometheus down) are retried before Failed."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post (phase transitions and the verdict only)."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """The new status, and what to do before persisting it."""

    status: ExperimentStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    report: Report | None = None
    """What `Action.STORE_REPORT` stores."""


@dataclass(frozen=True)
class Subject:
    """The experiment being reconciled."""

    name: str
    generation: int
    spec: spec.ExperimentSpec | None
    """None when the spec is invalid (then `problems` says why)."""
    problems: Sequence[str] = ()
    aborted: bool = False
    """`keys.ABORT_ANNOTATION` names this generation: end it now (Failed, reason Aborted)."""
