"""The operator's rounds after the stages (experiment/rounds.py) and their place in `reconcile.decide`."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from specdecode.experiment import (
    keys,
    manifests,
    promql,
    reconcile,
    round_phases,
    rounds,
    spec,
    status,
    validation,
)
from specdecode.experiment.reconcile import Action, ArmState, JobState, Observed, PodState
from specdecode.experiment.status import ExperimentStatus, Phase, Verdict
from tests.factories import experiment_document

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SCHEDULE = [[1, 4, 4], [5, 4096, 0]]


def parsed(**analysis: object) -> spec.ExperimentSpec:
    s, _ = validation.parse_experiment(experiment_document(analysis=analysis))
    return s


def apart(control: str = "gpu-a", treatment: str = "gpu-b") -> status.Environment:
    hosts = status.ArmHosts(control=status.Host(node=control), treatment=status.Host(node=treatment))
    return status.Environment(arms=hosts, host_differences=["node"])


def subject(**analysis: object) -> reconcile.Subject:
    return reconcile.Subject(name="exp", generation=1, spec=parsed(**analysis))


def test_the_crossover_round_pins_each_arm_to_the_other_s_node_and_starts_both() -> None:
    round_ = rounds.crossover_round(apart())
    assert (round_.name, round_.nodes) == (
        "Crossover",
        status.CrossoverPlacement(control="gpu-b", treatment="gpu-a"),
    )
    assert rounds.started(round_) == (spec.Arm.CONTROL, spec.Arm.TREATMENT)
    assert rounds.placements(apart(), round_) == [
        status.CrossoverPlacement(control="gpu-a", treatment="gpu-b"),
        status.CrossoverPlacement(control="gpu-b", treatment="gpu-a"),
    ]
    s = parsed(crossover="IfApart", crossoverFraction=0.5)
    load = rounds.load_spec(s, round_)
    assert not load.analysis.sequential and load.analysis.crossover is spec.Crossover.OFF
    halves = [st.requests for st in load.workload.stages]
    assert halves == [s.stage_requests(st) // 2 for st in s.workload.stages] and all(halves)


def test_the_confirmation_round_restarts_the_treatment_where_it_ran_unless_a_crossover_moved_both() -> None:
    alone = rounds.confirmation_round(SCHEDULE, apart(), crossed=False)
    assert rounds.started(alone) == (spec.Arm.TREATMENT,)
    assert (rounds.node(alone, spec.Arm.TREATMENT), rounds.node(alone, spec.Arm.CONTROL)) == ("gpu-b", None)
    back = rounds.confirmation_round(SCHEDULE, apart(), crossed=True)
    assert rounds.started(back) == (spec.Arm.CONTROL, spec.Arm.TREATMENT)
    assert (rounds.node(back, spec.Arm.CONTROL), rounds.node(back, spec.Arm.TREATMENT)) == ("gpu-a", "gpu-b")
    s = parsed(confirm=True)
    rendered = rounds.arm_spec(s, alone)
    assert rendered.speculative.extra["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert "num_speculative_tokens_per_batch_size" not in s.speculative.extra
    load = rounds.load_spec(s, alone)
    assert not load.analysis.sequential
    assert [st.requests for st in load.workload.stages] == [st.requests for st in s.workload.stages]


def test_a_round_document_validates_as_the_load_job_reads_it() -> None:
    """The round's spec goes to its load Job as a document, which validates it like any other."""
    s = parsed(crossover="Always", confirm=True)
    for round_ in (
        rounds.crossover_round(apart()),
        rounds.confirmation_round(SCHEDULE, apart(), crossed=True),
    ):
        dumped = rounds.load_spec(s, round_).model_dump(mode="json", by_alias=True, exclude_none=True)
        again, _ = validation.parse_experiment({**experiment_document(), "spec": dumped})
        assert again == rounds.load_spec(s, round_)


def test_a_round_s_arm_is_pinned_by_node_name_and_keeps_its_colocation_preference() -> None:
    s, _ = validation.parse_experiment(experiment_document(placement={"colocate": "Preferred"}))
    deployment = manifests.build_deployment(
        "exp", s, spec.Arm.CONTROL, manifests.Settings(), round_name="Crossover", node="gpu-b"
    )
    pod = deployment["spec"]["template"]
    affinity = pod["spec"]["affinity"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}]}]
    assert "podAffinity" in affinity
    assert pod["metadata"]["annotations"][keys.ROUND_ANNOTATION] == "Crossover"
    assert deployment["metadata"]["annotations"][keys.ROUND_ANNOTATION] == "Crossover"
    plain = manifests.build_deployment("exp", s, spec.Arm.CONTROL, manifests.Settings())
    assert "nodeAffinity" not in plain["spec"]["template"]["spec"]["affinity"]
    assert keys.ROUND_ANNOTATION not in plain["spec"]["template"]["metadata"]["annotations"]


def test_a_round_s_load_job_has_its_own_name_spec_and_results_and_the_generation_s_salt() -> None:
    s = parsed()
    job = manifests.build_load_job(
        "exp",
        s,
        manifests.Settings(),
        owner_uid="uid-1",
        generation=2,
        round_name="Crossover",
        salt="7-uid-1-2",
    )
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert job["metadata"]["name"] == "exp-load-crossover"
    assert args[args.index("--results-configmap") + 1] == "exp-results-crossover"
    assert args[args.index("--salt") + 1] == "7-uid-1-2"
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["experiment"]["configMap"]["name"] == "exp-spec-crossover"
    first = manifests.build_load_job("exp", s, manifests.Settings(), salt=manifests.load_salt(7, "uid-1", 2))
    first_args = first["spec"]["template"]["spec"]["containers"][0]["args"]
    assert first["metadata"]["name"] == "exp-load"
    assert first_args[first_args.index("--salt") + 1] == "7-uid-1-2"  # the same prompts in every round


# ------------------------------------------------------------------------------ the lifecycle


def judged(next_round: status.Round | None = None, verdict: Verdict = Verdict.PROMOTE) -> reconcile.Judgement:
    return reconcile.Judgement(
        verdict=verdict,
        reason="SpeedupConfirmed",
        message="tpot 1.30x at c1",
        stages=[status.StageResult(name="c1")],
        speedup_summary="c1 1.30x",
        next_round=next_round,
    )


def analyzing(*rounds_run: status.Round) -> ExperimentStatus:
    return ExperimentStatus(
        observed_generation=1,
        phase=Phase.ANALYZING,
        phase_started_at=T0.isoformat(),
        environment=apart(),
        rounds=list(rounds_run),
    )


def arms(round_name: str | None, *, ready: bool = True, **pod: object) -> dict[spec.Arm, ArmState]:
    return {
        arm: ArmState(
            exists=True,
            ready_replicas=1,
            pods=(
                PodState(f"exp-{arm.value}-{round_name}", "Running", ready=ready, round=round_name, **pod),
            ),  # type: ignore[arg-type]
        )
        for arm in spec.Arm
    }


def in_round(phase: Phase, round_: status.Round) -> ExperimentStatus:
    return analyzing(round_).model_copy(update={"phase": phase})


def test_a_round_owed_keeps_the_judgement_so_far_without_a_verdict_and_deploys_it() -> None:
    owed = rounds.crossover_round(apart())
    decision = reconcile.decide(
        subject(crossover="IfApart"), analyzing(), Observed(analysis=judged(owed)), T0
    )
    st = decision.status
    assert (st.phase, st.verdict, st.reason) == (Phase.DEPLOYING, None, "CrossoverRound")
    assert decision.actions == [Action.CREATE_ARMS]
    assert [s.name for s in st.stages] == ["c1"] and st.speedup_summary == "c1 1.30x"
    assert [(r.name, r.outcome, r.started_at) for r in st.rounds] == [
        ("Crossover", None, "2026-12-02T12:00:00Z")
    ]
    assert "control on gpu-b, treatment on gpu-a" in (st.message or "")
    assert reconcile.conditions_for(st)["Completed"][0] == "False"  # a gate waits


def test_a_round_waits_for_the_pods_rendered_for_it_then_runs_its_load() -> None:
    round_ = rounds.crossover_round(apart())
    current = in_round(Phase.DEPLOYING, round_)
    old = reconcile.decide(subject(), current, Observed(arms=arms(None)), T0 + timedelta(seconds=5))
    assert (old.status.phase, old.actions) == (Phase.DEPLOYING, [Action.CREATE_ARMS])
    new = reconcile.decide(subject(), current, Observed(arms=arms("Crossover")), T0 + timedelta(seconds=5))
    assert (new.status.phase, new.actions) == (Phase.RUNNING, [Action.CREATE_LOAD])
    assert new.status.arms is not None and new.status.arms.control.pod == "exp-control-Crossover"


def test_the_confirmation_round_needs_only_the_treatment_rendered_for_it() -> None:
    round_ = rounds.confirmation_round(SCHEDULE, apart(), crossed=False)
    observed = arms(None) | {spec.Arm.TREATMENT: arms("Confirmation")[spec.Arm.TREATMENT]}
    decision = reconcile.decide(
        subject(confirm=True), in_round(Phase.DEPLOYING, round_), Observed(arms=observed), T0
    )
    assert (decision.status.phase, decision.actions) == (Phase.RUNNING, [Action.CREATE_LOAD])


def test_the_pods_that_must_be_scraped_are_the_round_s_own_for_the_arm_it_restarts() -> None:
    """The old treatment pod, still Ready while it terminates, may still be scraped: Prometheus
    scraping it says nothing about the pod the round's load goes to (a CI run's confirmation round
    read no treatment series, PrometheusNoData)."""
    round_ = rounds.confirmation_round(SCHEDULE, apart(), crossed=False)
    treatment = arms(None)[spec.Arm.TREATMENT]
    both = replace(treatment, pods=(*treatment.pods, *arms("Confirmation")[spec.Arm.TREATMENT].pods))
    observed = Observed(arms=arms(None) | {spec.Arm.TREATMENT: both})
    assert round_phases.serving_pods(observed, round_) == {
        spec.Arm.CONTROL: ["exp-control-None"],
        spec.Arm.TREATMENT: ["exp-treatment-Confirmation"],
    }
    assert promql.targets_up({"arm": "treatment"}, pods=("pod", ["exp-treatment-Confirmation", "a.b"])) == (
        'sum(up{arm="treatment",pod=~"exp-treatment-Confirmation|a\\\\.b"})'
    )
    alone = Observed(arms=arms(None))  # only the old pod: nothing serves the round's treatment yet
    assert round_phases.serving_pods(alone, round_)[spec.Arm.TREATMENT] == []


def test_a_measured_round_is_judged_again_and_the_verdict_comes_with_every_round_kept() -> None:
    round_ = rounds.crossover_round(apart())
    running = in_round(Phase.RUNNING, round_)
    done = reconcile.decide(
        subject(), running, Observed(arms=arms("Crossover"), job=JobState(exists=True, succeeded=True)), T0
    )
    assert done.status.phase is Phase.ANALYZING
    assert [(r.name, r.outcome) for r in done.status.rounds] == [("Crossover", "Measured")]
    final = reconcile.decide(
        subject(), done.status, Observed(analysis=judged(verdict=Verdict.INCONCLUSIVE)), T0
    )
    assert (final.status.phase, final.status.verdict) == (Phase.COMPLETED, Verdict.INCONCLUSIVE)
    assert [(r.name, r.outcome) for r in final.status.rounds] == [("Crossover", "Measured")]


def test_an_arm_that_cannot_be_placed_for_a_round_ends_the_round_not_the_experiment() -> None:
    round_ = rounds.crossover_round(apart())
    since = T0 - timedelta(minutes=5)
    stuck = arms(
        "Crossover",
        ready=False,
        unschedulable="0/2 nodes: Insufficient nvidia.com/gpu",
        unschedulable_since=since,
    )
    decision = reconcile.decide(subject(), in_round(Phase.DEPLOYING, round_), Observed(arms=stuck), T0)
    st = decision.status
    assert (st.phase, st.reason, st.verdict) == (Phase.ANALYZING, "RoundFailed", None)
    assert st.rounds[-1].outcome == "Failed" and "Unschedulable" in (st.rounds[-1].message or "")
    assert decision.events[0].type == "Warning"
    assert rounds.current(st) is None  # the next Analyzing judges the stages with the round failed


def test_a_round_s_load_job_that_fails_is_deleted_and_the_stages_are_judged_without_it() -> None:
    round_ = rounds.confirmation_round(SCHEDULE, apart(), crossed=False)
    failed_job = JobState(exists=True, failed=True, reason="DeadlineExceeded", message="too slow")
    decision = reconcile.decide(
        subject(confirm=True),
        in_round(Phase.RUNNING, round_),
        Observed(arms=arms("Confirmation"), job=failed_job),
        T0,
    )
    assert decision.status.phase is Phase.ANALYZING
    assert decision.actions == [Action.DELETE_LOAD]
    assert decision.status.rounds[-1].message == "LoadJobFailed: too slow"


def test_a_round_past_the_run_deadline_ends_the_round() -> None:
    round_ = rounds.crossover_round(apart())
    s = subject()
    assert s.spec is not None
    late = T0 + timedelta(seconds=s.spec.deadlines.run_seconds + 1)
    running = JobState(exists=True)
    decision = reconcile.decide(
        s, in_round(Phase.RUNNING, round_), Observed(arms=arms("Crossover"), job=running), late
    )
    assert decision.status.phase is Phase.ANALYZING
    assert (decision.status.rounds[-1].outcome, decision.actions) == ("Failed", [Action.DELETE_LOAD])
    assert (decision.status.rounds[-1].message or "").startswith("RunDeadlineExceeded")


def test_an_abort_during_a_round_fails_the_experiment_and_deletes_the_round_s_load() -> None:
    round_ = rounds.crossover_round(apart())
    aborted = reconcile.Subject(name="exp", generation=1, spec=parsed(), aborted=True)
    decision = reconcile.decide(
        aborted,
        in_round(Phase.RUNNING, round_),
        Observed(arms=arms("Crossover"), job=JobState(exists=True)),
        T0,
    )
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "Aborted")
    assert Action.DELETE_LOAD in decision.actions and Action.CLEANUP_ARMS in decision.actions


def test_a_fault_that_repeats_in_a_round_ends_the_round_at_its_deadline_not_the_experiment() -> None:
    """The API server refusing the round's pinned Deployment (422) every tick: the stages' verdict stands."""
    round_ = rounds.crossover_round(apart())
    refused = reconcile.Fault(
        "ChildRejected", "the API server refused Deployment exp-control (HTTP 422)", permanent=True
    )
    decision = reconcile.decide_after_fault(subject(), in_round(Phase.DEPLOYING, round_), refused, T0)
    st = decision.status
    assert (st.phase, st.reason, st.verdict) == (Phase.ANALYZING, "RoundFailed", None)
    assert (st.rounds[-1].outcome, st.rounds[-1].message) == ("Failed", f"ChildRejected: {refused.message}")
    transient = reconcile.Fault("KubernetesApiError", "HTTP 503 from the API server")
    s = subject()
    assert s.spec is not None
    early = reconcile.decide_after_fault(
        s, in_round(Phase.RUNNING, round_), transient, T0 + timedelta(seconds=5)
    )
    assert early.status.phase is Phase.RUNNING and (early.status.message or "").startswith("retrying: ")
    late = T0 + timedelta(seconds=s.spec.deadlines.run_seconds + 1)
    ended = reconcile.decide_after_fault(s, in_round(Phase.RUNNING, round_), transient, late)
    assert ended.status.phase is Phase.ANALYZING and ended.status.rounds[-1].outcome == "Failed"
    assert "retried every tick until spec.deadlines.run" in (ended.status.rounds[-1].message or "")


# ------------------------------------------------------------------- the break-even search's probes


def searching(**search: object) -> spec.ExperimentSpec:
    wanted = {"goal": "breakEven", "concurrency": {"from": 1, "to": 16}, "requestsPerProbe": 64, **search}
    workload = {"stages": [{"name": "c1", "concurrency": 1}], "search": wanted}
    s, _ = validation.parse_experiment(experiment_document(workload=workload))
    return s


def test_a_probe_round_is_one_paired_stage_at_its_load_and_starts_no_arm_again() -> None:
    s = searching()
    assert s.workload.search is not None
    probe = rounds.probe_round(s.workload.search, 3, 4)
    assert (probe.name, probe.probe, probe.load) == ("search3-c4", 3, 4)
    assert rounds.started(probe) == ()
    load = rounds.load_spec(s, probe)
    assert [(st.name, st.concurrency, st.requests) for st in load.workload.stages] == [("search3-c4", 4, 64)]
    assert load.workload.warmup_requests == 0  # the arms are warm from the stages
    # judged as any stage, with the stages' sequential stopping; no round of its own
    assert load.analysis.sequential is s.analysis.sequential is True
    assert (load.analysis.crossover, load.analysis.confirm) == (spec.Crossover.OFF, False)
    dumped = load.model_dump(mode="json", by_alias=True, exclude_none=True)
    again, _ = validation.parse_experiment({**experiment_document(), "spec": dumped})
    assert again == load  # the load Job reads it as any document
    assert rounds.describe(s, probe) == "search: probe 3 at concurrency 4"
    assert rounds.probes(ExperimentStatus(rounds=[rounds.crossover_round(apart()), probe])) == [probe]


def test_a_probe_owed_goes_from_analyzing_straight_to_its_load_keeping_the_search_so_far() -> None:
    s = searching()
    assert s.workload.search is not None
    probe = rounds.probe_round(s.workload.search, 1, 1)
    so_far = status.SearchResult(axis="concurrency")
    owed = replace(judged(probe), search=so_far)
    decision = reconcile.decide(reconcile.Subject("exp", 1, s), analyzing(), Observed(analysis=owed), T0)
    st = decision.status
    assert (st.phase, st.reason, st.verdict) == (Phase.RUNNING, "SearchProbe", None)
    assert decision.actions == [Action.CREATE_LOAD]  # no Deploying: the arms stay where they are
    assert st.message == "search: probe 1 at concurrency 1"
    assert st.search == so_far and [(r.name, r.probe, r.outcome) for r in st.rounds] == [
        ("search1-c1", 1, None)
    ]
    assert reconcile.conditions_for(st)["Completed"][0] == "False"


def test_a_measured_probe_is_judged_and_the_verdict_carries_the_search() -> None:
    s = searching()
    assert s.workload.search is not None
    probe = rounds.probe_round(s.workload.search, 1, 1)
    subject_ = reconcile.Subject("exp", 1, s)
    done = reconcile.decide(
        subject_,
        in_round(Phase.RUNNING, probe),
        Observed(arms=arms(None), job=JobState(exists=True, succeeded=True)),
        T0,
    )
    assert (done.status.phase, done.status.message) == (Phase.ANALYZING, "search1-c1 probe: judging")
    assert done.status.rounds[-1].outcome == "Measured"
    found = status.SearchResult(axis="concurrency", ran=True, reason="AboveRange")
    final = reconcile.decide(
        subject_,
        done.status,
        Observed(analysis=replace(judged(), search=found)),
        T0,
    )
    assert (final.status.phase, final.status.search) == (Phase.COMPLETED, found)


def test_a_probe_whose_load_fails_ends_the_search_there_not_the_experiment() -> None:
    s = searching()
    assert s.workload.search is not None
    probe = rounds.probe_round(s.workload.search, 2, 16)
    failed_job = JobState(exists=True, failed=True, reason="BackoffLimitExceeded", message="exit 1")
    decision = reconcile.decide(
        reconcile.Subject("exp", 1, s),
        in_round(Phase.RUNNING, probe),
        Observed(arms=arms(None), job=failed_job),
        T0,
    )
    st = decision.status
    assert (st.phase, st.reason, decision.actions) == (Phase.ANALYZING, "RoundFailed", [Action.DELETE_LOAD])
    assert (st.rounds[-1].outcome, st.rounds[-1].message) == ("Failed", "LoadJobFailed: exit 1")
    assert "the search's search2-c16 probe failed" in (st.message or "")
