from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from specdecode.experiment import fairness, reconcile, spec, status, validation
from specdecode.experiment.reconcile import Action, ArmState, JobState, Observed, PodState
from specdecode.experiment.status import ExperimentStatus, Phase, Verdict
from tests.factories import experiment_document

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def subject(generation: int = 1, **overrides: object) -> reconcile.Subject:
    parsed, name = validation.parse_experiment(experiment_document(**overrides))
    return reconcile.Subject(name=name, generation=generation, spec=parsed)


def at(phase: Phase, *, since: datetime = T0, generation: int = 1) -> ExperimentStatus:
    return ExperimentStatus(observed_generation=generation, phase=phase, phase_started_at=since.isoformat())


def ready_arms() -> dict[spec.Arm, ArmState]:
    return {
        arm: ArmState(
            exists=True, ready_replicas=1, pods=(PodState(f"exp-{arm}-x", "Running", node="gpu-0"),)
        )
        for arm in spec.Arm
    }


def pod(**fields: object) -> dict[spec.Arm, ArmState]:
    return {
        spec.Arm.CONTROL: ArmState(exists=True, pods=(PodState("exp-control-x", **fields),)),  # type: ignore[arg-type]
        spec.Arm.TREATMENT: ArmState(exists=True),
    }


def condition(st: ExperimentStatus, kind: str) -> status.Condition:
    return next(c for c in st.conditions if c.type == kind)


def test_a_new_experiment_is_accepted_for_its_generation() -> None:
    decision = reconcile.decide(subject(generation=3), ExperimentStatus(), Observed(), T0)
    assert decision.status.phase is Phase.PENDING
    assert decision.status.observed_generation == 3
    assert all(c.observed_generation == 3 for c in decision.status.conditions)
    assert condition(decision.status, "Reconciling").status == "True"


def test_an_invalid_spec_fails_without_deploying_anything() -> None:
    invalid = reconcile.Subject("exp", 1, None, ["spec.speculative.model: is required"])
    decision = reconcile.decide(invalid, ExperimentStatus(), Observed(), T0)
    assert decision.status.phase is Phase.FAILED
    assert decision.status.reason == "InvalidSpec"
    assert "spec.speculative.model" in (decision.status.message or "")
    assert decision.actions == []
    assert decision.status.verdict is None


def test_pending_deploys_both_arms() -> None:
    decision = reconcile.decide(subject(), at(Phase.PENDING), Observed(), T0)
    assert decision.status.phase is Phase.DEPLOYING
    assert decision.actions == [Action.CREATE_ARMS]
    assert decision.events[0].reason == "Deploying"


def test_pending_waits_for_stale_children_to_go() -> None:
    decision = reconcile.decide(subject(), at(Phase.PENDING), Observed(stale_children=("exp-control",)), T0)
    assert decision.status.phase is Phase.PENDING
    assert decision.actions == [Action.DELETE_STALE]


def test_deploying_keeps_creating_until_both_arms_are_ready() -> None:
    half = ready_arms() | {spec.Arm.TREATMENT: ArmState(exists=True)}
    decision = reconcile.decide(
        subject(), at(Phase.DEPLOYING), Observed(arms=half), T0 + timedelta(seconds=5)
    )
    assert decision.status.phase is Phase.DEPLOYING
    assert decision.actions == [Action.CREATE_ARMS]


def test_both_arms_ready_starts_the_load_and_records_the_environment() -> None:
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=ready_arms()), T0)
    assert decision.status.phase is Phase.RUNNING
    assert decision.actions == [Action.CREATE_LOAD]
    assert decision.status.environment is not None
    assert decision.status.environment.nodes == ["gpu-0"]
    assert decision.status.environment.draft_model == "Qwen/Qwen3-0.6B"
    assert decision.status.started_at is not None


def test_deploy_deadline_fails_naming_the_arm() -> None:
    later = T0 + timedelta(minutes=31)
    arms = ready_arms() | {spec.Arm.TREATMENT: ArmState(exists=True)}
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=arms), later)
    assert decision.status.phase is Phase.FAILED
    assert decision.status.reason == "DeployDeadlineExceeded"
    assert "treatment not Ready within spec.deadlines.deploy (30m)" in (decision.status.message or "")
    assert decision.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]


def test_unschedulable_fails_after_the_grace_period() -> None:
    arms = pod(
        unschedulable="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", unschedulable_since=T0
    )
    early = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=arms), T0 + timedelta(seconds=10))
    assert early.status.phase is Phase.DEPLOYING
    late = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=arms), T0 + timedelta(seconds=61))
    assert late.status.phase is Phase.FAILED
    assert late.status.reason == "Unschedulable"
    assert "control arm" in (late.status.message or "") and "Insufficient nvidia.com/gpu" in (
        late.status.message or ""
    )
    assert late.status.verdict is None


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "CrashLoopBackOff", "CreateContainerConfigError"])
def test_fatal_container_states_fail_at_once(reason: str) -> None:
    arms = pod(
        waiting_reason=reason, waiting_message="boom", last_exit_code=1, last_terminated_reason="Error"
    )
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=arms), T0)
    assert decision.status.phase is Phase.FAILED
    assert decision.status.reason == reason
    assert "control arm (pod exp-control-x)" in (decision.status.message or "")


def test_oom_killed_is_named() -> None:
    arms = pod(waiting_reason="CrashLoopBackOff", last_terminated_reason="OOMKilled", last_exit_code=137)
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=arms), T0)
    assert decision.status.reason == "OOMKilled"


def test_running_waits_for_the_load_job() -> None:
    decision = reconcile.decide(
        subject(), at(Phase.RUNNING), Observed(arms=ready_arms(), job=JobState(True)), T0
    )
    assert decision.status.phase is Phase.RUNNING
    assert decision.actions == [Action.CREATE_LOAD]


def test_a_failed_load_job_fails_the_experiment_never_a_verdict() -> None:
    job = JobState(
        exists=True,
        failed=True,
        reason="BackoffLimitExceeded",
        message="Job has reached the backoff limit",
        pod=PodState("exp-load-x", "Failed", last_terminated_reason="Error", last_exit_code=3),
    )
    decision = reconcile.decide(subject(), at(Phase.RUNNING), Observed(arms=ready_arms(), job=job), T0)
    assert decision.status.phase is Phase.FAILED
    assert decision.status.reason == "LoadJobFailed"
    assert "exit 3" in (decision.status.message or "")
    assert decision.status.verdict is None
    assert condition(decision.status, "Stalled").status == "True"
    assert condition(decision.status, "Completed").status == "False"


def test_an_arm_restarting_during_the_load_voids_the_measurement() -> None:
    arms = ready_arms() | pod(restarts=1, last_terminated_reason="Error", last_exit_code=1, phase="Running")
    decision = reconcile.decide(subject(), at(Phase.RUNNING), Observed(arms=arms, job=JobState(True)), T0)
    assert decision.status.reason == "EngineRestarted"


def test_run_deadline() -> None:
    decision = reconcile.decide(
        subject(deadlines={"run": "1m"}),
        at(Phase.RUNNING),
        Observed(arms=ready_arms(), job=JobState(True)),
        T0 + timedelta(minutes=2),
    )
    assert decision.status.reason == "RunDeadlineExceeded"


def test_a_finished_load_moves_to_analysis() -> None:
    decision = reconcile.decide(
        subject(), at(Phase.RUNNING), Observed(arms=ready_arms(), job=JobState(True, succeeded=True)), T0
    )
    assert decision.status.phase is Phase.ANALYZING


def judgement(verdict: Verdict) -> reconcile.Judgement:
    return reconcile.Judgement(
        verdict=verdict,
        reason="SpeedupConfirmed",
        message="tpot 1.31x [1.24, 1.38] at low",
        stages=[status.StageResult(name="low")],
        speedup_summary="low 1.31x",
    )


def test_a_verdict_completes_the_experiment_and_cleans_up() -> None:
    observed = Observed(arms=ready_arms(), analysis=judgement(Verdict.PROMOTE))
    decision = reconcile.decide(subject(), at(Phase.ANALYZING), observed, T0)
    st = decision.status
    assert st.phase is Phase.COMPLETED and st.verdict is Verdict.PROMOTE
    assert st.speedup_summary == "low 1.31x"
    assert decision.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    assert condition(st, "Completed").status == "True"
    assert condition(st, "Promoted").status == "True"
    assert condition(st, "Ready").status == "True"
    assert condition(st, "Reconciling").status == "False"
    assert decision.events[0].reason == "Promote"


def test_an_a_a_run_completes_with_its_noise_floor_in_status() -> None:
    nf = status.NoiseFloor(
        min_speedup=1.1,
        stages=[status.StageNoiseFloor(name="low", pairs=300, speedup=1.0, mismatch_rate=0.2)],
        suggested_baseline_mismatch_rate=0.25,
    )
    aa = reconcile.Judgement(
        verdict=Verdict.INCONCLUSIVE, reason="NoiseFloor", message="noise floor (A/A): ...", noise_floor=nf
    )
    decision = reconcile.decide(subject(), at(Phase.ANALYZING), Observed(arms=ready_arms(), analysis=aa), T0)
    st = decision.status
    assert st.phase is Phase.COMPLETED and st.reason == "NoiseFloor"
    assert st.wire()["noiseFloor"]["suggestedBaselineMismatchRate"] == 0.25
    assert condition(st, "Promoted").status == "False"


@pytest.mark.parametrize("verdict", [Verdict.REJECT, Verdict.INCONCLUSIVE])
def test_only_promote_sets_promoted(verdict: Verdict) -> None:
    decision = reconcile.decide(subject(), at(Phase.ANALYZING), Observed(analysis=judgement(verdict)), T0)
    assert condition(decision.status, "Completed").status == "True"
    assert condition(decision.status, "Promoted").status == "False"
    assert condition(decision.status, "Promoted").reason == verdict.value


@pytest.mark.parametrize(
    ("policy", "phase_actions", "cleanup"),
    [
        ("Always", [Action.RELEASE_ARMS, Action.CLEANUP_ARMS], status.ArmsCleanup.DELETED),
        # kept for debugging, but at 0 replicas: no path into Failed holds a GPU
        ("OnSuccess", [Action.RELEASE_ARMS, Action.SCALE_DOWN_ARMS], status.ArmsCleanup.SCALED_TO_ZERO),
        ("Never", [Action.RELEASE_ARMS, Action.SCALE_DOWN_ARMS], status.ArmsCleanup.SCALED_TO_ZERO),
    ],
)
def test_cleanup_policy_after_a_failure(
    policy: str, phase_actions: list[Action], cleanup: status.ArmsCleanup
) -> None:
    failure = reconcile.CollectFailure("PrometheusNoData", "no series for the treatment arm")
    decision = reconcile.decide(
        subject(cleanup=policy), at(Phase.ANALYZING), Observed(arms=ready_arms(), analysis=failure), T0
    )
    assert decision.status.phase is Phase.FAILED
    assert decision.actions == phase_actions
    assert decision.status.cleanup is cleanup
    kept = f"the arms' Deployments are kept at 0 replicas (spec.cleanup: {policy}): their GPUs are free"
    assert (kept in (decision.status.message or "")) is (cleanup is status.ArmsCleanup.SCALED_TO_ZERO)
    assert condition(decision.status, "Stalled").message == decision.status.message


@pytest.mark.parametrize(
    ("policy", "phase_actions", "cleanup"),
    [
        ("Always", [Action.RELEASE_ARMS, Action.CLEANUP_ARMS], status.ArmsCleanup.DELETED),
        ("OnSuccess", [Action.RELEASE_ARMS, Action.CLEANUP_ARMS], status.ArmsCleanup.DELETED),
        ("Never", [Action.RELEASE_ARMS], status.ArmsCleanup.KEPT),  # kept running on purpose
    ],
)
def test_cleanup_policy_after_a_verdict(
    policy: str, phase_actions: list[Action], cleanup: status.ArmsCleanup
) -> None:
    decision = reconcile.decide(
        subject(cleanup=policy),
        at(Phase.ANALYZING),
        Observed(arms=ready_arms(), analysis=judgement(Verdict.PROMOTE)),
        T0,
    )
    assert decision.status.phase is Phase.COMPLETED
    assert decision.actions == phase_actions
    assert decision.status.cleanup is cleanup


def test_an_ending_without_arms_has_nothing_to_clean_up() -> None:
    failure = reconcile.CollectFailure("PrometheusNoData", "no series for the treatment arm")
    decision = reconcile.decide(subject(), at(Phase.ANALYZING), Observed(analysis=failure), T0)
    assert (decision.status.phase, decision.actions, decision.status.cleanup) == (Phase.FAILED, [], None)


def test_prometheus_down_is_retried_then_fails_never_promotes() -> None:
    failure = reconcile.CollectFailure("PrometheusUnavailable", "connection refused", transient=True)
    early = reconcile.decide(
        subject(), at(Phase.ANALYZING), Observed(analysis=failure), T0 + timedelta(seconds=30)
    )
    assert early.status.phase is Phase.ANALYZING
    assert "retrying" in (early.status.message or "")
    late = reconcile.decide(
        subject(), at(Phase.ANALYZING), Observed(analysis=failure), T0 + timedelta(minutes=6)
    )
    assert late.status.phase is Phase.FAILED
    assert late.status.reason == "PrometheusUnavailable"
    assert late.status.verdict is None


def test_a_spec_change_restarts_and_unbinds_the_old_verdict() -> None:
    done = reconcile.decide(
        subject(), at(Phase.ANALYZING), Observed(analysis=judgement(Verdict.PROMOTE)), T0
    ).status
    restarted = reconcile.decide(subject(generation=2), done, Observed(stale_children=("exp-control",)), T0)
    st = restarted.status
    assert st.phase is Phase.PENDING and st.verdict is None and st.stages == []
    assert st.observed_generation == 2
    assert condition(st, "Promoted").status == "False"
    assert all(c.observed_generation == 2 for c in st.conditions)
    assert restarted.actions == [Action.DELETE_STALE]


def test_terminal_experiments_need_no_timer_until_the_spec_changes() -> None:
    done = at(Phase.COMPLETED)
    assert not reconcile.needs_reconcile(done, 1)
    assert reconcile.needs_reconcile(done, 2)
    assert reconcile.needs_reconcile(at(Phase.RUNNING), 1)


def test_condition_transition_times_only_move_on_change() -> None:
    first = reconcile.decide(subject(), at(Phase.PENDING), Observed(), T0).status
    second = reconcile.decide(subject(), first, Observed(arms=ready_arms()), T0 + timedelta(minutes=1)).status
    assert (
        condition(second, "Reconciling").last_transition_time
        == condition(first, "Reconciling").last_transition_time
    )


def test_a_condition_that_changes_status_gets_the_time_of_the_change() -> None:
    first = reconcile.decide(subject(), at(Phase.PENDING), Observed(), T0).status
    analyzing = first.model_copy(update={"phase": Phase.ANALYZING})
    later = T0 + timedelta(hours=1)
    done = reconcile.decide(subject(), analyzing, Observed(analysis=judgement(Verdict.PROMOTE)), later).status
    assert done.phase is Phase.COMPLETED
    for kind in ("Completed", "Promoted"):  # False -> True now
        assert (condition(first, kind).status, condition(done, kind).status) == ("False", "True")
        assert condition(done, kind).last_transition_time == later.isoformat().replace("+00:00", "Z")
    assert condition(done, "Stalled").last_transition_time == condition(first, "Stalled").last_transition_time


def test_the_load_waits_until_prometheus_scrapes_both_arms() -> None:
    waiting = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=ready_arms(), scraped=False), T0)
    assert waiting.status.phase is Phase.DEPLOYING
    assert "waiting for Prometheus" in (waiting.status.message or "")
    assert Action.CREATE_LOAD not in waiting.actions
    started = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=ready_arms(), scraped=True), T0)
    assert started.status.phase is Phase.RUNNING


def test_arms_prometheus_never_scrapes_fail_at_the_deploy_deadline() -> None:
    late = T0 + timedelta(minutes=31)
    decision = reconcile.decide(
        subject(), at(Phase.DEPLOYING), Observed(arms=ready_arms(), scraped=False), late
    )
    assert decision.status.phase is Phase.FAILED
    assert decision.status.reason == "PrometheusNoData"
    assert decision.status.verdict is None


# ------------------------------------------------------------------ fairness: the arms' live pods (#18)


def differing_pods(*, env: dict[str, str]) -> dict[spec.Arm, fairness.ArmPod]:
    argv = ("vllm", "serve", "m")
    return {
        spec.Arm.CONTROL: fairness.ArmPod("exp-control-x", argv=argv),
        spec.Arm.TREATMENT: fairness.ArmPod(
            "exp-treatment-x", argv=(*argv, "--speculative-config", "{}"), env=env
        ),
    }


def test_arms_that_differ_beyond_speculation_start_the_load_with_a_warning_by_default() -> None:
    observed = Observed(arms=ready_arms(), arm_pods=differing_pods(env={"EXTRA": "1"}))
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), observed, T0)
    assert decision.status.phase is Phase.RUNNING
    assert decision.actions == [Action.CREATE_LOAD]
    assert decision.status.arm_differences == [
        status.ArmDifference(field="env.EXTRA", control=None, treatment="1")
    ]
    differ = condition(decision.status, "ArmsDiffer")
    assert (differ.status, differ.reason) == ("True", "ArmsDiffer")
    assert differ.message == "env.EXTRA: absent (control) vs 1 (treatment)"
    (warning,) = [e for e in decision.events if e.reason == "ArmsDiffer"]
    assert warning.type == "Warning" and "env.EXTRA: absent (control) vs 1 (treatment)" in warning.message


def test_a_verdict_after_arms_that_differed_says_so_in_its_message() -> None:
    differed = at(Phase.ANALYZING).model_copy(
        update={"arm_differences": [status.ArmDifference(field="imageID", control="a", treatment="b")]}
    )
    done = reconcile.decide(subject(), differed, Observed(analysis=judgement(Verdict.PROMOTE)), T0)
    assert done.status.phase is Phase.COMPLETED
    assert (done.status.message or "").endswith(
        "; the arms' pods differed beyond speculation (in imageID): the speed-up may partly be that"
    )
    assert condition(done.status, "ArmsDiffer").status == "True"


def test_arms_that_differ_beyond_speculation_fail_before_the_load_when_fairness_is_fail() -> None:
    observed = Observed(arms=ready_arms(), arm_pods=differing_pods(env={"EXTRA": "1"}), scraped=False)
    strict = subject(analysis={"fairness": "Fail"})
    decision = reconcile.decide(strict, at(Phase.DEPLOYING), observed, T0)
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "ArmsDiffer")
    assert "env.EXTRA: absent (control) vs 1 (treatment)" in (decision.status.message or "")
    assert decision.status.verdict is None
    assert Action.CREATE_LOAD not in decision.actions
    assert Action.CLEANUP_ARMS in decision.actions  # the default cleanup (Always) releases the GPUs
    assert [d.field for d in decision.status.arm_differences] == ["env.EXTRA"]
    assert [e.reason for e in decision.events] == ["ArmsDiffer"]


def test_arms_that_differ_only_in_speculation_start_the_load_without_a_warning_even_when_strict() -> None:
    observed = Observed(arms=ready_arms(), arm_pods=differing_pods(env={}))
    decision = reconcile.decide(subject(analysis={"fairness": "Fail"}), at(Phase.DEPLOYING), observed, T0)
    assert decision.status.phase is Phase.RUNNING
    assert decision.status.arm_differences == []
    assert "ArmsDiffer" not in {c.type for c in decision.status.conditions}
    assert "ArmsDiffer" not in {e.reason for e in decision.events}


def test_arms_not_ready_are_not_compared() -> None:
    half = ready_arms() | {spec.Arm.TREATMENT: ArmState(exists=True)}
    observed = Observed(arms=half, arm_pods=differing_pods(env={"EXTRA": "1"}))
    decision = reconcile.decide(subject(analysis={"fairness": "Fail"}), at(Phase.DEPLOYING), observed, T0)
    assert decision.status.phase is Phase.DEPLOYING


# ------------------------------------------------------------------ faults: a tick that raised

REFUSED = reconcile.Fault("KubernetesApiError", "HTTP 500 from the API server: etcd timeout")


@pytest.mark.parametrize(
    ("phase", "deadline"),
    [
        (Phase.PENDING, timedelta(minutes=30)),
        (Phase.DEPLOYING, timedelta(minutes=30)),
        (Phase.RUNNING, timedelta(hours=2)),
        (Phase.ANALYZING, timedelta(minutes=5)),
    ],
)
def test_a_fault_repeating_every_tick_fails_at_the_phase_deadline(phase: Phase, deadline: timedelta) -> None:
    before = reconcile.decide_after_fault(subject(), at(phase), REFUSED, T0 + deadline - timedelta(seconds=1))
    assert before.status.phase is phase
    assert before.status.message == f"retrying: {REFUSED.message}"
    assert before.actions == []
    after = reconcile.decide_after_fault(subject(), at(phase), REFUSED, T0 + deadline + timedelta(seconds=1))
    assert after.status.phase is Phase.FAILED
    assert after.status.reason == "KubernetesApiError"
    assert REFUSED.message in (after.status.message or "") and "retried every tick" in (
        after.status.message or ""
    )
    assert after.status.verdict is None
    assert condition(after.status, "Stalled").status == "True"


def test_a_permanent_fault_fails_at_once_and_frees_the_gpus() -> None:
    invalid = reconcile.Fault(
        "ChildRejected", "the API server refused Deployment exp-control (HTTP 422)", True
    )
    decision = reconcile.decide_after_fault(
        subject(), at(Phase.DEPLOYING), invalid, T0 + timedelta(seconds=5)
    )
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "ChildRejected")
    assert decision.actions == [
        Action.RELEASE_ARMS,
        Action.CLEANUP_ARMS,
    ]  # nothing observed: the arms may exist
    assert decision.events[-1].reason == "ChildRejected"


def test_a_fault_while_restarting_still_restarts() -> None:
    """The new generation's Pending is written; Pending retries deleting the stale children."""
    decision = reconcile.decide_after_fault(subject(generation=2), at(Phase.RUNNING), REFUSED, T0)
    assert (decision.status.phase, decision.status.observed_generation) == (Phase.PENDING, 2)
    assert decision.actions == []


def test_a_decided_ending_whose_cleanup_fails_is_kept_and_retried_until_done() -> None:
    ended = reconcile.decide(
        subject(), at(Phase.ANALYZING), Observed(arms=ready_arms(), analysis=judgement(Verdict.PROMOTE)), T0
    )
    assert ended.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    decision = reconcile.decide_after_fault(subject(), at(Phase.ANALYZING), REFUSED, T0, attempted=ended)
    said = decision.status.message or ""
    assert (decision.status.phase, decision.status.verdict) == (Phase.COMPLETED, Verdict.PROMOTE)
    assert f"cleaning up the arms failed ({REFUSED.message}): retried every tick" in said
    assert decision.status.cleanup is status.ArmsCleanup.RETRYING
    assert decision.events[-1].reason == "CleanupFailed"
    assert decision.actions == []
    # an ended experiment is ticked again while its cleanup is owed (after a restart too: it is in status)
    assert reconcile.needs_reconcile(decision.status, 1)
    assert not reconcile.needs_reconcile(ended.status, 1)

    again = reconcile.decide(
        subject(), decision.status, Observed(arms=ready_arms()), T0 + timedelta(seconds=10)
    )
    assert again.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    assert again.status.cleanup is status.ArmsCleanup.DELETED
    assert again.status.message == ended.status.message  # the note goes once the cleanup is done
    assert (again.status.phase, again.status.verdict) == (Phase.COMPLETED, Verdict.PROMOTE)
    assert not reconcile.needs_reconcile(again.status, 1)

    gone = reconcile.decide(subject(), decision.status, Observed(), T0 + timedelta(seconds=10))
    assert (gone.actions, gone.status.cleanup) == ([], status.ArmsCleanup.DELETED)


def test_a_failure_whose_scale_down_fails_scales_down_again_saying_so_once() -> None:
    failure = reconcile.CollectFailure("PrometheusNoData", "no series for the treatment arm")
    ended = reconcile.decide(
        subject(cleanup="Never"), at(Phase.ANALYZING), Observed(arms=ready_arms(), analysis=failure), T0
    )
    retrying = reconcile.decide_after_fault(
        subject(cleanup="Never"), at(Phase.ANALYZING), REFUSED, T0, attempted=ended
    )
    again = reconcile.decide(subject(cleanup="Never"), retrying.status, Observed(arms=ready_arms()), T0)
    assert again.actions == [Action.RELEASE_ARMS, Action.SCALE_DOWN_ARMS]
    assert (again.status.cleanup, again.status.message) == (
        status.ArmsCleanup.SCALED_TO_ZERO,
        ended.status.message,
    )


def test_an_aborted_experiment_whose_cleanup_failed_deletes_the_arms_and_the_load_again() -> None:
    aborted = replace(subject(cleanup="Never"), aborted=True)
    ended = reconcile.decide(
        aborted, at(Phase.RUNNING), Observed(arms=ready_arms(), job=JobState(exists=True)), T0
    )
    assert Action.CLEANUP_ARMS in ended.actions and ended.status.cleanup is status.ArmsCleanup.DELETED
    retrying = reconcile.decide_after_fault(aborted, at(Phase.RUNNING), REFUSED, T0, attempted=ended)
    again = reconcile.decide(
        aborted, retrying.status, Observed(arms=ready_arms(), job=JobState(exists=True)), T0
    )
    assert again.actions == [Action.CLEANUP_ARMS, Action.DELETE_LOAD]
    assert again.status.cleanup is status.ArmsCleanup.DELETED


def test_a_later_child_refused_after_the_arms_were_created_deletes_them() -> None:
    """The tick created the arms, then the API server refused a later child (422): what was
    observed before showed no arm, but the failure must still free their GPUs."""
    created = reconcile.decide(subject(), at(Phase.PENDING), Observed(), T0)
    assert created.actions == [Action.CREATE_ARMS]
    refused = reconcile.Fault(
        "ChildRejected", "the API server refused ConfigMap exp-spec (HTTP 422)", True, Action.CREATE_ARMS
    )
    failed = reconcile.decide_after_fault(
        subject(), at(Phase.PENDING), refused, T0, attempted=created, observed=Observed()
    )
    assert (failed.status.phase, failed.status.reason) == (Phase.FAILED, "ChildRejected")
    assert failed.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]
    assert failed.status.cleanup is status.ArmsCleanup.DELETED


def test_a_terminal_experiment_is_left_as_it_is() -> None:
    failed = at(Phase.FAILED)
    assert reconcile.decide_after_fault(subject(), failed, REFUSED, T0).status == failed


# ------------------------------------------------------------- arms disrupted during the load


def loading() -> ExperimentStatus:
    """Running, with the pods the load measures recorded as when it began (ready_arms' pods)."""
    entered = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=ready_arms(), scraped=True), T0)
    assert entered.status.phase is Phase.RUNNING
    return entered.status


def test_the_load_records_the_pods_it_measures() -> None:
    arms = loading().arms
    assert (arms.control.pod, arms.treatment.pod) == ("exp-control-x", "exp-treatment-x")


@pytest.mark.parametrize(
    ("treatment", "says"),
    [
        (
            ArmState(
                exists=True, ready_replicas=1, pods=ready_arms()[spec.Arm.TREATMENT].pods, leaving=("t-1",)
            ),
            "treatment arm pod t-1 is being deleted during the load (evicted, preempted, drained or deleted)",
        ),
        (
            ArmState(
                exists=True, ready_replicas=1, pods=(PodState("exp-treatment-y", "Running", ready=True),)
            ),
            "treatment arm pod exp-treatment-x, measured since the load began, is gone (pod exp-treatment-y replaced it)",
        ),
        (
            ArmState(exists=True),
            "treatment arm pod exp-treatment-x, measured since the load began, is gone (no pod replaced it yet)",
        ),
        (ArmState(), "the treatment arm's Deployment was deleted during the load"),
    ],
    ids=["being deleted", "replaced", "no pod", "no Deployment"],
)
def test_an_arm_lost_during_the_load_fails_without_a_verdict(treatment: ArmState, says: str) -> None:
    """Not a Reject (the treatment's errors) or an Inconclusive measured against a half-dead arm."""
    observed = Observed(
        arms=ready_arms() | {spec.Arm.TREATMENT: treatment}, job=JobState(True, succeeded=True)
    )
    decision = reconcile.decide(subject(), loading(), observed, T0 + timedelta(minutes=1))
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "ArmDisrupted")
    assert says in (decision.status.message or "")
    assert decision.status.verdict is None


def test_the_pods_the_load_began_with_are_the_ones_measured() -> None:
    observed = Observed(arms=ready_arms(), job=JobState(True, succeeded=True))
    decision = reconcile.decide(subject(), loading(), observed, T0 + timedelta(minutes=1))
    assert decision.status.phase is Phase.ANALYZING


# ------------------------------------------------------------------- pod creation refused

PSA = 'pods "exp-control-5d8f-x" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true'
QUOTA = 'pods "exp-control-5d8f-x" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1'


def test_pods_that_pod_security_refuses_fail_the_experiment_at_once() -> None:
    """Not 30 minutes of DeployDeadlineExceeded with a hint about pods that do not exist."""
    arms = {arm: ArmState(exists=True, refused=PSA, refused_since=T0) for arm in spec.Arm}
    decision = reconcile.decide(
        subject(), at(Phase.DEPLOYING), Observed(arms=arms), T0 + timedelta(seconds=5)
    )
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "PodCreationForbidden")
    message = decision.status.message or ""
    assert "Pod Security admission refuses the control arm's pod" in message and PSA in message
    assert "baseline" in message
    assert decision.actions == [Action.RELEASE_ARMS, Action.CLEANUP_ARMS]


def test_pods_refused_by_a_quota_fail_after_the_grace_period() -> None:
    arms = ready_arms() | {spec.Arm.CONTROL: ArmState(exists=True, refused=QUOTA, refused_since=T0)}
    waiting = reconcile.decide(
        subject(), at(Phase.DEPLOYING), Observed(arms=arms), T0 + timedelta(seconds=30)
    )
    assert waiting.status.phase is Phase.DEPLOYING
    failed = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=arms), T0 + timedelta(seconds=61))
    assert (failed.status.phase, failed.status.reason) == (Phase.FAILED, "PodCreationForbidden")
    assert "ResourceQuota" in (failed.status.message or "") and QUOTA in (failed.status.message or "")


def test_a_refusal_that_cleared_does_not_fail_an_arm_whose_pod_exists() -> None:
    arms = ready_arms() | {
        spec.Arm.CONTROL: ArmState(exists=True, pods=ready_arms()[spec.Arm.CONTROL].pods, refused=PSA)
    }
    decision = reconcile.decide(
        subject(), at(Phase.DEPLOYING), Observed(arms=arms), T0 + timedelta(seconds=5)
    )
    assert decision.status.phase is not Phase.FAILED


def test_an_arm_evicted_by_the_kubelet_fails_the_experiment() -> None:
    """Node pressure: the kubelet ends the pod in phase Failed (reason Evicted)."""
    arms = ready_arms() | pod(phase="Failed", last_terminated_reason="Evicted")
    decision = reconcile.decide(subject(), at(Phase.RUNNING), Observed(arms=arms, job=JobState(True)), T0)
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "PodFailed")
    assert "Evicted" in (decision.status.message or "") and decision.status.verdict is None


def hosts(**treatment: object) -> dict[spec.Arm, status.Host]:
    same = {"node": "gpu-0", "gpu_product": "NVIDIA-H200", "cpu_model": "Intel family 6 model 143"}
    return {
        spec.Arm.CONTROL: status.Host(**same, gpu_uuids=["GPU-a"]),  # type: ignore[arg-type]
        spec.Arm.TREATMENT: status.Host(**{**same, **treatment}, gpu_uuids=["GPU-b"]),  # type: ignore[arg-type]
    }


def test_the_load_starts_quietly_when_both_arms_share_a_host() -> None:
    decision = reconcile.decide(
        subject(), at(Phase.DEPLOYING), Observed(arms=ready_arms(), hosts=hosts()), T0 + timedelta(seconds=5)
    )
    env = decision.status.environment
    assert env is not None and env.arms is not None and env.arms.treatment is not None
    assert env.arms.treatment.node == "gpu-0"
    assert env.host_differences == []  # their own GPUs (UUIDs) are not a difference
    assert [e.type for e in decision.events] == ["Normal"]


def test_the_load_starts_with_a_warning_when_the_arms_hosts_differ() -> None:
    observed = Observed(arms=ready_arms(), hosts=hosts(node="gpu-1", cpu_model="AMD family 25 model 17"))
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), observed, T0 + timedelta(seconds=5))
    assert decision.status.phase is Phase.RUNNING
    env = decision.status.environment
    assert env is not None
    assert env.host_differences == ["node", "cpuModel"]
    assert env.nodes == ["gpu-0", "gpu-1"]
    assert "hosts differ in node, cpuModel" in (decision.status.message or "")
    warning = next(e for e in decision.events if e.type == "Warning")
    assert warning.reason == "PlacementDiffers"
    assert "node: gpu-0 (control) vs gpu-1 (treatment)" in warning.message
    assert "spec.placement.colocate" in warning.message


def test_an_arm_that_cannot_join_the_other_under_required_colocation_says_so() -> None:
    arms = pod(
        unschedulable="0/2 nodes are available: 1 node(s) didn't match pod affinity rules.",
        unschedulable_since=T0,
    )
    later = T0 + timedelta(seconds=61)
    required = reconcile.decide(
        subject(placement={"colocate": "Required"}), at(Phase.DEPLOYING), Observed(arms=arms), later
    )
    assert required.status.reason == "Unschedulable"
    assert "spec.placement.colocate is Required: one node must have GPUs for both arms" in (
        required.status.message or ""
    )
    preferred = reconcile.decide(subject(), at(Phase.DEPLOYING), Observed(arms=arms), later)
    assert "spec.placement.colocate" not in (preferred.status.message or "")


def test_where_the_arms_run_is_recorded_while_waiting_for_prometheus() -> None:
    observed = Observed(arms=ready_arms(), hosts=hosts(node="gpu-1"), scraped=False)
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), observed, T0 + timedelta(seconds=5))
    assert decision.status.phase is Phase.DEPLOYING
    env = decision.status.environment
    assert env is not None and env.host_differences == ["node"]


def aborted(generation: int = 1, **overrides: object) -> reconcile.Subject:
    plain = subject(generation, **overrides)
    return reconcile.Subject(plain.name, plain.generation, plain.spec, aborted=True)


def test_an_abort_during_the_load_fails_as_aborted_and_deletes_the_arms_and_the_load_job() -> None:
    observed = Observed(arms=ready_arms(), job=JobState(exists=True, uid="job-uid"))
    decision = reconcile.decide(aborted(cleanup="Never"), at(Phase.RUNNING), observed, T0)
    assert decision.status.phase is Phase.FAILED
    assert decision.status.reason == "Aborted"
    assert decision.status.verdict is None
    assert "while Running" in (decision.status.message or "")
    # The GPUs are released whatever spec.cleanup says.
    assert decision.actions == [Action.CLEANUP_ARMS, Action.DELETE_LOAD]
    assert condition(decision.status, "Reconciling").status == "False"
    assert condition(decision.status, "Stalled").reason == "Aborted"
    assert [e.reason for e in decision.events] == ["Aborted"]


def test_an_abort_while_deploying_deletes_only_what_exists() -> None:
    half = {spec.Arm.CONTROL: ArmState(exists=True), spec.Arm.TREATMENT: ArmState()}
    decision = reconcile.decide(aborted(), at(Phase.DEPLOYING), Observed(arms=half), T0)
    assert decision.status.reason == "Aborted"
    assert decision.actions == [Action.CLEANUP_ARMS]


def test_an_abort_before_anything_is_deployed_deletes_nothing() -> None:
    decision = reconcile.decide(aborted(), at(Phase.PENDING), Observed(), T0)
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "Aborted")
    assert decision.actions == []


def test_an_abort_of_a_finished_experiment_changes_nothing() -> None:
    done = at(Phase.COMPLETED).model_copy(update={"verdict": Verdict.PROMOTE, "reason": "StagesPassed"})
    decision = reconcile.decide(aborted(), done, Observed(), T0)
    assert decision.status == done
    assert decision.events == []


def test_an_abort_for_an_older_generation_does_not_stop_the_new_one() -> None:
    """The handler sets `aborted` only when the annotation names the current generation; a spec edit
    after an abort restarts the measurement (Failed of generation 1 -> Pending of generation 2)."""
    failed = reconcile.decide(aborted(generation=1), at(Phase.RUNNING), Observed(), T0).status
    decision = reconcile.decide(subject(generation=2), failed, Observed(), T0)
    assert decision.status.phase is Phase.PENDING
    assert decision.status.observed_generation == 2


def test_an_environment_the_shell_knows_whole_is_taken_as_it_is() -> None:
    """`run --local`: the command that started the arms, its own hosts, no image; not rebuilt from pods."""
    known = status.Environment(engine_command="vllm serve m", image=None, host_differences=["gpuProduct"])
    observed = Observed(arms=ready_arms(), environment=known)
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), observed, T0 + timedelta(seconds=5))
    assert decision.status.phase is Phase.RUNNING and decision.status.environment == known
    assert "hosts differ in gpuProduct" in (decision.status.message or "")


def test_degradations_read_at_the_end_replace_those_read_as_the_load_started() -> None:
    read = [status.Degradation(kind="AsyncSchedulingDisabled", message="disabled")]
    started = at(Phase.ANALYZING).model_copy(update={"degradations": []})
    late = replace(judgement(Verdict.PROMOTE), degradations=read)
    assert reconcile.decide(subject(), started, Observed(analysis=late), T0).status.degradations == read
    kept = at(Phase.ANALYZING).model_copy(update={"degradations": read})
    assert (
        reconcile.decide(
            subject(), kept, Observed(analysis=judgement(Verdict.PROMOTE)), T0
        ).status.degradations
        == read
    )


def test_a_run_measured_but_not_judgeable_fails_keeping_the_stages_it_measured() -> None:
    failure = reconcile.CollectFailure(
        "InvalidMeasurement",
        "invalid measurement: clock skew",
        stages=[status.StageResult(name="low")],
        speedup_summary="low -",
        validity={"valid": False, "reasons": ["clock skew"]},
    )
    st = reconcile.decide(subject(), at(Phase.ANALYZING), Observed(analysis=failure), T0).status
    assert (st.phase, st.reason, st.verdict) == (Phase.FAILED, "InvalidMeasurement", None)
    assert [s.name for s in st.stages] == ["low"] and st.speedup_summary == "low -"
    assert st.validity == {"valid": False, "reasons": ["clock skew"]}


@pytest.mark.parametrize(
    ("waiting", "fix"),
    [
        ("CreateContainerConfigError", "resultsStore.s3.credentialsSecret"),
        ("ImagePullBackOff", "the chart's `image`"),
    ],
)
def test_a_load_pod_that_cannot_start_fails_the_run_at_once_naming_the_fix(waiting: str, fix: str) -> None:
    """Not at spec.deadlines.run: the Job's pod waits for a Secret or an image that will not come."""
    job = JobState(
        True,
        pod=PodState(
            "exp-load-x", "Pending", waiting_reason=waiting, waiting_message='secret "s3-keys" not found'
        ),
    )
    decision = reconcile.decide(subject(), at(Phase.RUNNING), Observed(arms=ready_arms(), job=job), T0)
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "LoadJobFailed")
    message = decision.status.message or ""
    assert f"load pod exp-load-x cannot start: {waiting}" in message and "s3-keys" in message
    assert fix in message


def test_a_load_pod_still_creating_its_container_is_waited_for() -> None:
    job = JobState(True, pod=PodState("exp-load-x", "Pending", waiting_reason="ContainerCreating"))
    decision = reconcile.decide(subject(), at(Phase.RUNNING), Observed(arms=ready_arms(), job=job), T0)
    assert decision.status.phase is Phase.RUNNING and decision.actions == [reconcile.Action.CREATE_LOAD]
