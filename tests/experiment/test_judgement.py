"""The one fold of the rounds after the stages (experiment/judgement.py), below both lifecycles: the
round owed next, and each round's outcome folded into the verdict, the crossover block, the search
and the recommendation, from plain inputs (what the operator reads from its ConfigMaps and
Prometheus, and `run --local` from its files)."""

from __future__ import annotations

from specdecode.experiment import (
    confirm,
    crossover,
    judgement,
    reconcile,
    rounds,
    search,
    spec,
    status,
    verdict,
)
from specdecode.experiment.status import CrossoverPlacement, ExperimentStatus, Round, StageVerdict, Verdict

SCHEDULE = [[1, 4, 4], [5, 4096, 0]]
NODES = CrossoverPlacement(control="node-a", treatment="node-b")


def experiment(workload: dict[str, object] | None = None, **analysis: object) -> spec.ExperimentSpec:
    return spec.ExperimentSpec.model_validate(
        {
            "model": "m",
            "speculative": {"method": "ngram", "numSpeculativeTokens": 3},
            "workload": {
                "stages": [{"name": "c1", "concurrency": 1}, {"name": "c4", "concurrency": 4}],
                "requestsPerStage": 100,
                **(workload or {}),
            },
            "analysis": {"minSpeedup": 1.05, **analysis},
        }
    )


def passed(schedule: list[list[int]] | None = None) -> verdict.Analysis:
    """The stages' analysis of a clear win: both stages pass, Promote."""
    speedup = status.Speedup(metric="tpot", estimate=1.3, ci_low=1.2, ci_high=1.4, n=100)
    stages = [
        status.StageResult(name=name, speedup=speedup, verdict=StageVerdict.PASS, batch_size=1.0)
        for name in ("c1", "c4")
    ]
    advised = status.Recommendation(num_speculative_tokens_per_batch_size=schedule)
    return verdict.Analysis(stages, Verdict.PROMOTE, "SpeedupConfirmed", "tpot speed-up 1.30x", "", advised)


def apart() -> status.Environment:
    hosts = status.ArmHosts(control=status.Host(node="node-a"), treatment=status.Host(node="node-b"))
    return status.Environment(arms=hosts, host_differences=["node"])


def together() -> status.Environment:
    """Both arms on one node (each on its own GPUs): nothing of the host differs."""
    host = status.Host(node="node-a")
    return status.Environment(arms=status.ArmHosts(control=host, treatment=host))


def inputs(
    *rounds_: tuple[str, judgement.Measurement | judgement.Unmeasured],
    swapped: CrossoverPlacement | None = None,
    environment: status.Environment | None = None,
    **kw: object,
) -> judgement.Measured:
    return judgement.Measured(
        rounds=dict(rounds_),
        environment=environment or apart(),
        placement=judgement.Placement(NODES, swapped=swapped),
        **kw,  # type: ignore[arg-type]
    )


def folded(
    s: spec.ExperimentSpec, current: ExperimentStatus, measured: judgement.Measured, first: verdict.Analysis
) -> judgement.Folded:
    out = judgement.fold(s, current, first, measured)
    assert isinstance(out, judgement.Folded), out
    return out


def test_a_pass_with_the_arms_apart_owes_the_swapped_round_before_its_verdict() -> None:
    s = experiment(crossover="IfApart")
    out = folded(s, ExperimentStatus(), inputs(), passed())
    assert out.next_round == Round(
        name=rounds.CROSSOVER, nodes=CrossoverPlacement(control="node-b", treatment="node-a")
    )
    assert out.crossover is None and out.search is None


def test_a_swapped_round_that_failed_withholds_the_pass_and_lists_the_placements_it_had() -> None:
    s = experiment(crossover="IfApart")
    swapped = CrossoverPlacement(control="node-b", treatment="node-a")
    current = ExperimentStatus(
        rounds=[Round(name=rounds.CROSSOVER, nodes=swapped, outcome=rounds.FAILED, message="no node")]
    )
    out = folded(s, current, inputs(swapped=swapped), passed())
    assert out.next_round is None
    assert out.crossover is not None and out.crossover.reason == crossover.SWAPPED_ROUND_FAILED
    assert out.crossover.rounds == [NODES, swapped]
    assert out.analysis.verdict is Verdict.INCONCLUSIVE
    assert "could not be measured (no node)" in out.message
    # the caller's own words for why win over the status' (run --local: the first line only)
    told = folded(
        s, current, inputs((rounds.CROSSOVER, judgement.Unmeasured("crashed")), swapped=swapped), passed()
    )
    assert told.crossover is not None and "(crashed)" in str(told.crossover.message)


def test_a_swapped_round_measured_without_data_leaves_no_estimate_so_no_pass_stands() -> None:
    s = experiment(crossover="Always")
    swapped = CrossoverPlacement(control="node-b", treatment="node-a")
    current = ExperimentStatus(rounds=[Round(name=rounds.CROSSOVER, nodes=swapped, outcome=rounds.MEASURED)])
    empty = judgement.Measurement([], [], None)
    out = folded(s, current, inputs((rounds.CROSSOVER, empty), swapped=swapped), passed())
    assert out.crossover is not None and out.crossover.ran and out.crossover.rounds == [NODES, swapped]
    assert [st.verdict for st in out.analysis.stages] == [StageVerdict.INCONCLUSIVE] * 2
    assert out.analysis.verdict is Verdict.INCONCLUSIVE and out.next_round is None


def test_arms_that_cannot_swap_skip_the_crossover_for_the_caller_s_reason() -> None:
    s = experiment(crossover="Always")
    where = judgement.Placement(NODES, unswappable=(crossover.SERVERS_GIVEN, "given by URL"))
    out = folded(s, ExperimentStatus(), judgement.Measured({}, apart(), where, arms_given=True), passed())
    assert out.crossover is not None and (out.crossover.ran, out.crossover.reason) == (False, "ServersGiven")
    # Apart, and nothing separated the hosts from the speed-up: not promoted (issue 35 item 3).
    assert (out.analysis.verdict, out.analysis.reason) == (Verdict.INCONCLUSIVE, "PlacementUnseparated")
    assert out.next_round is None and "give both servers on one host" in out.message
    unknown = judgement.Placement(CrossoverPlacement(control="node-a"))
    out = folded(s, ExperimentStatus(), judgement.Measured({}, apart(), unknown), passed())
    assert out.next_round is None and "the arms' nodes are unknown" in out.message


def test_the_confirmation_is_owed_for_a_schedule_and_otherwise_says_why_it_did_not_run() -> None:
    s = experiment(confirm=True)
    owed = folded(s, ExperimentStatus(), inputs(environment=together()), passed(SCHEDULE)).next_round
    assert owed == rounds.confirmation_round(SCHEDULE, together(), crossed=False)
    none = folded(s, ExperimentStatus(), inputs(environment=together()), passed()).recommendation
    assert none is not None and none.confirmation_reason == str(confirm.Reason.NO_SCHEDULE)
    given = folded(s, ExperimentStatus(), inputs(arms_given=True, environment=together()), passed(SCHEDULE))
    assert given.next_round is None and given.recommendation is not None
    assert given.recommendation.confirmation_reason == str(confirm.Reason.ARMS_NOT_STARTED_HERE)


def test_a_confirmation_round_that_failed_or_was_interrupted_says_so_in_the_message() -> None:
    s = experiment(confirm=True)
    round_ = Round(
        name=rounds.CONFIRMATION, schedule=SCHEDULE, outcome=rounds.FAILED, message="LoadJobFailed: x"
    )
    current = ExperimentStatus(rounds=[round_])
    out = folded(s, current, inputs(notes=["note"], environment=together()), passed(SCHEDULE))
    assert out.recommendation is not None and out.recommendation.confirmation_reason == "RoundFailed"
    assert out.message == "tpot speed-up 1.30x; note; the confirmation round failed: LoadJobFailed: x"
    stopped = inputs(
        (rounds.CONFIRMATION, judgement.Unmeasured("interrupted by the user (Ctrl-C)", interrupted=True))
    )
    out = folded(s, current, stopped, passed(SCHEDULE))
    assert out.message.endswith("the confirmation round was interrupted by the user (Ctrl-C)")
    assert not out.confirmed and out.next_round is None


def test_a_measured_confirmation_round_is_judged_into_the_recommendation() -> None:
    s = experiment(confirm=True)
    current = ExperimentStatus(
        rounds=[Round(name=rounds.CONFIRMATION, schedule=SCHEDULE, outcome=rounds.MEASURED)]
    )
    out = folded(
        s, current, inputs((rounds.CONFIRMATION, judgement.Measurement([], [], None))), passed(SCHEDULE)
    )
    assert out.confirmed and out.next_round is None
    assert out.recommendation is not None and out.recommendation.confirmation_reason == "NotMeasured"
    assert [c.name for c in out.recommendation.confirmation] == ["c1", "c4"]


SEARCH = {"search": {"concurrency": {"from": 1, "to": 16}}}


def test_the_search_owes_its_probes_first_and_stops_at_one_that_could_not_be_measured() -> None:
    s = experiment(SEARCH, crossover="Always", confirm=True)
    wanted = s.workload.search
    assert wanted is not None
    first = folded(s, ExperimentStatus(), inputs(), passed(SCHEDULE))
    assert first.next_round == rounds.probe_round(wanted, 1, 1.0) and first.crossover is None
    probe = rounds.probe_round(wanted, 1, 1.0).model_copy(update={"outcome": rounds.MEASURED})
    unread = inputs((probe.name, judgement.Unmeasured("ResultsMissing: gone")))
    out = folded(s, ExperimentStatus(rounds=[probe]), unread, passed(SCHEDULE))
    assert out.search is not None and out.search.reason == search.PROBE_FAILED
    assert out.search.message == f"probe {probe.name} failed: ResultsMissing: gone"
    assert out.next_round is not None and out.next_round.name == rounds.CROSSOVER  # the search ended


def test_arms_one_after_the_other_run_no_probe() -> None:
    s = experiment(SEARCH)
    out = folded(s, ExperimentStatus(), inputs(one_after_the_other=True), passed())
    assert out.search is not None and out.search.reason == judgement.ONE_AFTER_THE_OTHER
    assert out.next_round is None


def test_a_probe_round_that_lost_its_fields_is_an_outdated_crd_not_a_probe_run_again() -> None:
    s = experiment(SEARCH)
    wanted = s.workload.search
    assert wanted is not None
    pruned = Round(name=rounds.probe_round(wanted, 1, 1.0).name, outcome=rounds.MEASURED)
    out = judgement.fold(s, ExperimentStatus(rounds=[pruned]), passed(), inputs())
    assert isinstance(out, reconcile.CollectFailure) and out.reason == "CrdOutdated"


def test_a_run_without_a_verdict_owes_no_round_and_checks_nothing() -> None:
    s = experiment(SEARCH, crossover="Always", confirm=True)
    nothing = verdict.Analysis([], None, "NoData", "no measured requests", "", None)
    out = folded(s, ExperimentStatus(), inputs(), nothing)
    assert out.next_round is None and out.search is None and not out.confirmed
    assert out.crossover is not None and out.crossover.reason == crossover.NOT_MEASURED
    assert out.message == "no measured requests"


def test_without_a_crossover_arms_on_different_nodes_are_not_promoted_and_on_one_node_they_are() -> None:
    """Issue 35 item 3, in the fold both lifecycles share (crossover Off, the default)."""
    s = experiment()
    out = folded(s, ExperimentStatus(), inputs(), passed())
    assert (out.analysis.verdict, out.analysis.reason) == (Verdict.INCONCLUSIVE, "PlacementUnseparated")
    assert out.crossover is None and out.next_round is None
    assert out.message.startswith(
        "not promoted: the arms ran on different hosts (node: node-a (control) vs node-b (treatment))"
    )
    assert "to decide, run the crossover (spec.analysis.crossover: IfApart) or co-locate" in out.message
    kept = folded(s, ExperimentStatus(), inputs(environment=together()), passed())
    assert (kept.analysis.verdict, kept.message) == (Verdict.PROMOTE, "tpot speed-up 1.30x")
