"""What `decide()` asks the shells to keep: the report of a verdict (`Action.STORE_REPORT`) and the
stages a load that failed had finished (`Action.KEEP_FINISHED_STAGES`, folded in by
`reconcile.keep_finished`); and what a tick decides when keeping them fails."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specdecode.experiment import reconcile, rounds, spec, status, validation
from specdecode.experiment.reconcile import Action, ArmState, JobState, Observed, PodState
from specdecode.experiment.status import ExperimentStatus, Phase, Verdict
from tests.factories import experiment_document

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
REPORT = reconcile.Report(html="<!DOCTYPE html>", result={"phase": "Completed"})
REF = status.ResultsRef(config_map="exp-report")
TAKEN = reconcile.Fault(
    "ReportNameTaken",
    "the report was not stored: ConfigMap exp-report exists and is not this experiment's",
    permanent=True,
    action=Action.STORE_REPORT,
)


def subject(**overrides: object) -> reconcile.Subject:
    parsed, name = validation.parse_experiment(experiment_document(**overrides))
    return reconcile.Subject(name=name, generation=1, spec=parsed)


def at(phase: Phase) -> ExperimentStatus:
    return ExperimentStatus(observed_generation=1, phase=phase, phase_started_at=T0.isoformat())


def ready_arms(round_name: str | None = None) -> dict[spec.Arm, ArmState]:
    pod = PodState("exp-x", "Running", node="gpu-0", ready=True, round=round_name)
    return {arm: ArmState(exists=True, ready_replicas=1, pods=(pod,)) for arm in spec.Arm}


def verdict(**fields: object) -> reconcile.Judgement:
    return reconcile.Judgement(
        verdict=Verdict.PROMOTE,
        reason="SpeedupConfirmed",
        message="tpot 1.31x [1.24, 1.38] at low",
        stages=[status.StageResult(name="low")],
        results_ref=REF,
        **fields,  # type: ignore[arg-type]
    )


def failed_job(*, stored: bool) -> JobState:
    return JobState(exists=True, uid="job-uid", failed=True, reason="BackoffLimitExceeded", stored=stored)


def kept_stage() -> status.StageResult:
    return status.StageResult(name="low", verdict=status.StageVerdict.PASS)


# ---------------------------------------------------------------------------- the report


def test_a_verdict_with_its_report_stores_it_before_the_arms_are_cleaned_up() -> None:
    observed = Observed(arms=ready_arms(), analysis=verdict(report=REPORT))
    decision = reconcile.decide(subject(), at(Phase.ANALYZING), observed, T0)
    assert decision.status.phase is Phase.COMPLETED
    assert decision.actions == [Action.STORE_REPORT, Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    assert decision.report is REPORT and decision.status.results_ref == REF


def test_a_verdict_without_a_report_stores_none() -> None:
    decision = reconcile.decide(subject(), at(Phase.ANALYZING), Observed(analysis=verdict()), T0)
    assert (decision.status.phase, decision.actions, decision.report) == (Phase.COMPLETED, [], None)


def test_a_round_owed_before_the_verdict_stores_no_report() -> None:
    hosts = status.ArmHosts(control=status.Host(node="gpu-a"), treatment=status.Host(node="gpu-b"))
    owed = rounds.crossover_round(status.Environment(arms=hosts, host_differences=["node"]))
    judged = verdict(report=REPORT, next_round=owed)
    decision = reconcile.decide(subject(), at(Phase.ANALYZING), Observed(analysis=judged), T0)
    assert decision.status.phase is Phase.DEPLOYING
    assert Action.STORE_REPORT not in decision.actions and decision.report is None


def test_a_report_whose_name_is_taken_leaves_the_verdict_standing_without_it_and_the_gpus_freed() -> None:
    observed = Observed(arms=ready_arms(), analysis=verdict(report=REPORT))
    attempted = reconcile.decide(subject(), at(Phase.ANALYZING), observed, T0)
    decision = reconcile.decide_after_fault(
        subject(), at(Phase.ANALYZING), TAKEN, T0, attempted=attempted, observed=observed
    )
    st = decision.status
    assert (st.phase, st.verdict, st.results_ref) == (Phase.COMPLETED, Verdict.PROMOTE, None)
    assert st.message == f"tpot 1.31x [1.24, 1.38] at low; {TAKEN.message}"
    assert decision.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]  # no second try at the report
    assert [e.reason for e in decision.events] == ["Promote"] and TAKEN.message in decision.events[0].message


def test_a_report_that_could_not_be_stored_for_now_holds_the_verdict_back_until_it_is() -> None:
    """Not Completed with a note that the arms' cleanup failed: the verdict is written with its
    report or not at all, retried as any fault within the analysis grace."""
    observed = Observed(arms=ready_arms(), analysis=verdict(report=REPORT))
    attempted = reconcile.decide(subject(), at(Phase.ANALYZING), observed, T0)
    away = reconcile.Fault("KubernetesApiError", "HTTP 503 from the API server", action=Action.STORE_REPORT)
    decision = reconcile.decide_after_fault(
        subject(),
        at(Phase.ANALYZING),
        away,
        T0 + timedelta(seconds=30),
        attempted=attempted,
        observed=observed,
    )
    assert decision.status.phase is Phase.ANALYZING
    assert decision.status.message == f"retrying: {away.message}" and decision.actions == []


# ------------------------------------------------------------------ the stages a failed load finished


def test_a_load_job_failing_after_storing_results_asks_for_the_stages_it_finished_first() -> None:
    observed = Observed(arms=ready_arms(), job=failed_job(stored=True))
    decision = reconcile.decide(subject(), at(Phase.RUNNING), observed, T0)
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "LoadJobFailed")
    assert decision.actions == [Action.KEEP_FINISHED_STAGES, Action.RELEASE_ARMS, Action.CLEANUP_ARMS]


def test_a_load_that_stored_nothing_has_no_stages_to_read() -> None:
    decision = reconcile.decide(
        subject(), at(Phase.RUNNING), Observed(arms=ready_arms(), job=failed_job(stored=False)), T0
    )
    assert decision.status.phase is Phase.FAILED
    assert Action.KEEP_FINISHED_STAGES not in decision.actions


def test_every_failure_during_the_load_keeps_what_it_finished_the_deadline_and_an_abort_too() -> None:
    running = Observed(arms=ready_arms(), job=JobState(exists=True, uid="job-uid", stored=True))
    late = reconcile.decide(
        subject(deadlines={"run": "1m"}), at(Phase.RUNNING), running, T0 + timedelta(minutes=2)
    )
    assert late.status.reason == "RunDeadlineExceeded" and late.actions[0] is Action.KEEP_FINISHED_STAGES
    plain = subject()
    aborted = reconcile.Subject(plain.name, plain.generation, plain.spec, aborted=True)
    ended = reconcile.decide(aborted, at(Phase.RUNNING), running, T0)
    assert ended.status.reason == "Aborted"
    assert ended.actions == [Action.KEEP_FINISHED_STAGES, Action.CLEANUP_ARMS, Action.DELETE_LOAD]
    deploying = reconcile.decide(aborted, at(Phase.DEPLOYING), running, T0)
    assert Action.KEEP_FINISHED_STAGES not in deploying.actions  # no load ran


def test_a_round_that_fails_during_its_load_keeps_no_stages_the_verdict_is_the_stages() -> None:
    hosts = status.ArmHosts(control=status.Host(node="gpu-a"), treatment=status.Host(node="gpu-b"))
    round_ = rounds.crossover_round(status.Environment(arms=hosts, host_differences=["node"]))
    current = at(Phase.RUNNING).model_copy(update={"rounds": [round_]})
    observed = Observed(arms=ready_arms("Crossover"), job=failed_job(stored=True))
    decision = reconcile.decide(subject(), current, observed, T0)
    assert decision.status.reason == "RoundFailed"
    assert Action.KEEP_FINISHED_STAGES not in decision.actions


def test_the_finished_stages_are_kept_in_the_failure_with_their_report_stored_first() -> None:
    failed = reconcile.decide(
        subject(), at(Phase.RUNNING), Observed(arms=ready_arms(), job=failed_job(stored=True)), T0
    )
    found = reconcile.Finished(stages=[kept_stage()], results_ref=REF, report=REPORT)
    kept = reconcile.keep_finished(failed, found, total=2)
    st = kept.status
    assert (st.phase, st.reason, st.verdict) == (Phase.FAILED, "LoadJobFailed", None)
    assert [s.name for s in st.stages] == ["low"] and st.results_ref == REF
    assert st.message == (
        f"{failed.status.message}; the 1 of 2 stage(s) measured before that (low) are kept in "
        "status.stages and ConfigMap exp-report"
    )
    assert kept.actions == [Action.STORE_REPORT, Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    assert kept.report is REPORT and kept.events == failed.events


def test_a_load_that_finished_no_stage_leaves_the_failure_as_it_was() -> None:
    failed = reconcile.decide(
        subject(), at(Phase.RUNNING), Observed(arms=ready_arms(), job=failed_job(stored=True)), T0
    )
    kept = reconcile.keep_finished(failed, reconcile.Finished(), total=2)
    assert kept.status == failed.status
    assert kept.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]


def test_finished_stages_that_cannot_be_read_or_reported_leave_the_failure_standing_without_them() -> None:
    observed = Observed(arms=ready_arms(), job=failed_job(stored=True))
    failed = reconcile.decide(subject(), at(Phase.RUNNING), observed, T0)
    kept = reconcile.keep_finished(
        failed, reconcile.Finished(stages=[kept_stage()], results_ref=REF, report=REPORT), total=2
    )
    for action, attempted in [(Action.KEEP_FINISHED_STAGES, failed), (Action.STORE_REPORT, kept)]:
        fault = reconcile.Fault("KubernetesApiError", "HTTP 500 from the API server", action=action)
        decision = reconcile.decide_after_fault(
            subject(), at(Phase.RUNNING), fault, T0, attempted=attempted, observed=observed
        )
        assert decision.status == failed.status, action
        assert decision.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS], action
