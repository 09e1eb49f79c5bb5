"""`run --local`'s shell (`local/lifecycle.py`) driving the operator's core with a fake local world:
the phases, failure reasons and conditions of result.json are the core's, without an arm started."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from specdecode.experiment import reconcile, rounds, spec, status, validation
from specdecode.experiment.reconcile import Action, ArmState, JobState, Observed, PodState
from specdecode.experiment.status import ArmsCleanup, ExperimentStatus, Phase, Verdict
from specdecode.local import lifecycle
from tests.factories import experiment_document

T0 = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)


def subject(**overrides: object) -> reconcile.Subject:
    parsed, name = validation.parse_experiment(experiment_document(**overrides))
    return reconcile.Subject(name=name, generation=1, spec=parsed)


def promote() -> reconcile.Judgement:
    return reconcile.Judgement(
        verdict=Verdict.PROMOTE,
        reason="AllStagesFaster",
        message="speed-up 1.40x at c1",
        environment=status.Environment(engine_command="python -m specdecode.simulator"),
        degradations=[status.Degradation(kind="AsyncSchedulingDisabled", message="disabled")],
        results_ref=status.ResultsRef(directory="out"),
    )


@dataclass
class FakeWorld:
    """Arms that serve once created, a load that finishes once started, a judgement in Analyzing;
    `fail_on` makes an action (or, with ANALYZING, the judging) fail as a local arm would."""

    analysis: reconcile.Judgement | reconcile.CollectFailure = field(default_factory=promote)
    fail_on: Action | Phase | None = None
    failure: lifecycle.Failure = field(
        default_factory=lambda: lifecycle.Failure("EngineCrashed", "the treatment arm exited with status 1")
    )
    created: bool = False
    loaded: bool = False
    started_for: str | None = None
    """The round the arms were last started for."""
    done: list[Action] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    events: list[reconcile.Event] = field(default_factory=list)

    def observe(self, current: ExperimentStatus) -> Observed:
        if current.phase is Phase.ANALYZING and self.fail_on is Phase.ANALYZING:
            raise self.failure
        pod = (PodState("pid-1", "Running", ready=True, round=self.started_for),)
        arms = {arm: ArmState(exists=True, ready_replicas=1, pods=pod) for arm in spec.Arm}
        return Observed(
            arms=arms if self.created else {},
            job=JobState(exists=self.loaded, succeeded=self.loaded),
            analysis=self.analysis if current.phase is Phase.ANALYZING else None,
        )

    def carry_out(self, action: Action, decided: ExperimentStatus) -> None:
        if action is self.fail_on:
            raise self.failure
        self.done.append(action)
        self.created |= action is Action.CREATE_ARMS
        self.loaded |= action is Action.CREATE_LOAD

    def decided(self, decision: reconcile.Decision) -> None:
        if not self.phases or self.phases[-1] is not decision.status.phase:
            self.phases.append(decision.status.phase)
        self.events.extend(decision.events)


def clock() -> Iterator[datetime]:
    tick = T0
    while True:
        yield tick
        tick += timedelta(seconds=1)


def drive(world: FakeWorld, **overrides: object) -> ExperimentStatus:
    ticks = clock()
    return lifecycle.drive(subject(**overrides), world, clock=lambda: next(ticks))


def conditions(st: ExperimentStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in st.conditions}


def test_a_run_goes_through_the_operators_phases_to_its_verdict_with_its_conditions() -> None:
    world = FakeWorld()
    final = drive(world)
    assert world.phases == [Phase.PENDING, Phase.DEPLOYING, Phase.RUNNING, Phase.ANALYZING, Phase.COMPLETED]
    assert world.done == [Action.CREATE_ARMS, Action.CREATE_LOAD, Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    assert (final.phase, final.verdict, final.reason) == (Phase.COMPLETED, Verdict.PROMOTE, "AllStagesFaster")
    assert conditions(final)["Promoted"] == ("True", "Promote")
    assert conditions(final)["Completed"] == ("True", "Promote")
    assert all(c.observed_generation == 1 for c in final.conditions)
    # What only the local shell knows is taken as it is: the command that ran, the log read at the end.
    assert (
        final.environment is not None and final.environment.engine_command == "python -m specdecode.simulator"
    )
    assert [d.kind for d in final.degradations] == ["AsyncSchedulingDisabled"]
    assert final.started_at is not None and final.completed_at is not None
    assert [e.reason for e in world.events if e.type == "Normal"][-1] == "Promote"


@pytest.mark.parametrize("fail_on", [Action.CREATE_ARMS, Action.CREATE_LOAD, Phase.ANALYZING])
def test_a_local_failure_ends_the_run_failed_with_its_own_reason_and_message(fail_on: Action | Phase) -> None:
    world = FakeWorld(fail_on=fail_on)
    final = drive(world)
    assert (final.phase, final.reason) == (Phase.FAILED, "EngineCrashed")
    assert final.message == "the treatment arm exited with status 1" and final.verdict is None
    assert conditions(final)["Stalled"] == ("True", "EngineCrashed")
    assert conditions(final)["Completed"][0] == conditions(final)["Promoted"][0] == "False"
    # Arms that exist are cleaned up per spec.cleanup (Always), as the operator deletes its Deployments.
    cleanup = [] if fail_on is Action.CREATE_ARMS else [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    assert world.done[-2:] == cleanup


def test_a_run_measured_but_not_judgeable_fails_keeping_its_stages() -> None:
    stage = status.StageResult(name="c1", concurrency=1, verdict=Verdict.INCONCLUSIVE)
    failure = reconcile.CollectFailure(
        "InvalidMeasurement", "invalid measurement: clock skew", stages=[stage], speedup_summary="c1 -"
    )
    final = drive(FakeWorld(analysis=failure))
    assert (final.phase, final.reason, final.message) == (
        Phase.FAILED,
        "InvalidMeasurement",
        "invalid measurement: clock skew",
    )
    assert [s.name for s in final.stages] == ["c1"] and final.speedup_summary == "c1 -"


def test_a_cleanup_that_fails_after_the_verdict_keeps_it_and_says_what_to_delete() -> None:
    world = FakeWorld(
        fail_on=Action.CLEANUP_ARMS,
        failure=lifecycle.Failure("EngineUnavailable", "the control arm's processes [42] survived SIGKILL"),
    )
    final = drive(world)
    assert (final.phase, final.verdict) == (Phase.COMPLETED, Verdict.PROMOTE)
    assert (
        "cleaning up the arms failed (the control arm's processes [42] survived SIGKILL): "
        "stop the arms' processes by hand (the run ends here)"
    ) in (final.message or "")
    assert final.cleanup is ArmsCleanup.RETRYING
    assert world.events[-1].reason == "CleanupFailed"


def test_an_invalid_spec_fails_before_any_arm_is_created() -> None:
    world = FakeWorld()
    invalid = reconcile.Subject("exp", 1, None, ["spec.speculative.model: is required"])
    final = lifecycle.drive(invalid, world, clock=lambda: T0)
    assert (final.phase, final.reason) == (Phase.FAILED, "InvalidSpec") and world.done == []


@dataclass
class RoundWorld(FakeWorld):
    """A confirmation round owed after the stages; its load fails when `round_fails`."""

    round_fails: bool = False
    rounds_seen: list[tuple[str, str | None]] = field(default_factory=list)

    def observe(self, current: ExperimentStatus) -> Observed:
        observed = super().observe(current)
        if current.phase is not Phase.ANALYZING:
            return observed
        ended = current.rounds[-1] if current.rounds else None
        if ended is None:
            owed = status.Round(name=rounds.CONFIRMATION, schedule=[[1, 1, 4]])
            return replace(observed, analysis=replace(promote(), next_round=owed))
        self.rounds_seen.append((ended.name, ended.outcome))
        return observed

    def carry_out(self, action: Action, decided: ExperimentStatus) -> None:
        if self.round_fails and action is Action.CREATE_LOAD and decided.rounds:
            raise lifecycle.Failure("EngineCrashed", "the treatment arm exited with status 1")
        if action is Action.CREATE_ARMS and decided.rounds:  # the round's arms, then its own load
            self.started_for, self.loaded = decided.rounds[-1].name, False
        super().carry_out(action, decided)


@pytest.mark.parametrize("round_fails", [False, True])
def test_a_round_goes_through_the_phases_again_and_a_failed_one_leaves_the_verdict(round_fails: bool) -> None:
    world = RoundWorld(round_fails=round_fails)
    final = drive(world)
    twice = [Phase.DEPLOYING, Phase.RUNNING, Phase.ANALYZING] * 2
    assert world.phases == [Phase.PENDING, *twice, Phase.COMPLETED]
    assert (final.phase, final.verdict) == (Phase.COMPLETED, Verdict.PROMOTE)
    outcome = rounds.FAILED if round_fails else rounds.MEASURED
    assert world.rounds_seen == [(rounds.CONFIRMATION, outcome)]
    assert [(r.name, r.outcome) for r in final.rounds] == [(rounds.CONFIRMATION, outcome)]
    if round_fails:
        assert final.rounds[0].message == "EngineCrashed: the treatment arm exited with status 1"
        assert any(e.reason == "RoundFailed" and e.type == "Warning" for e in world.events)


def test_a_verdict_with_its_report_has_it_stored_before_the_arms_are_released() -> None:
    """`run --local` writes result.json and report.html as the core's StoreReport, as the operator
    stores its report ConfigMap; a verdict without a report to store asks for none (above)."""
    world = FakeWorld(analysis=replace(promote(), report=reconcile.Report()))
    final = drive(world)
    assert final.phase is Phase.COMPLETED
    assert world.done == [
        Action.CREATE_ARMS,
        Action.CREATE_LOAD,
        Action.STORE_REPORT,
        Action.RELEASE_ARMS,
        Action.CLEANUP_ARMS,
    ]
