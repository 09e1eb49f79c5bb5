"""The crossover's pure core (issue 22): the placement effect from two rounds, and the rule that
withholds a promotion when it is comparable to the margin over minSpeedup."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from specdecode.experiment import crossover, placement, reconcile, spec, status, validation, verdict
from specdecode.experiment.status import CrossoverPlacement, Speedup, StageResult, StageVerdict, Verdict
from tests.factories import experiment_document

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def experiment(**analysis: object) -> spec.ExperimentSpec:
    return spec.ExperimentSpec.model_validate(
        {
            "model": "m",
            "speculative": {"method": "ngram", "numSpeculativeTokens": 3},
            "workload": {
                "stages": [
                    {"name": "c1", "concurrency": 1},
                    {"name": "c4", "concurrency": 4, "requests": 40},
                ],
                "requestsPerStage": 100,
            },
            "analysis": {"minSpeedup": 1.05, **analysis},
        }
    )


def speedup(estimate: float, half: float) -> Speedup:
    """A speed-up with a symmetric interval of `half` on the log scale."""
    return Speedup(
        metric="tpot",
        estimate=estimate,
        ci_low=estimate * math.exp(-half),
        ci_high=estimate * math.exp(half),
        n=100,
    )


def stage(name: str, estimate: float, half: float, verdict_: StageVerdict) -> StageResult:
    return StageResult(name=name, speedup=speedup(estimate, half), verdict=verdict_, reasons=["why"])


def analysis_of(stages: list[StageResult], verdict_: Verdict, reason: str) -> verdict.Analysis:
    return verdict.Analysis(stages, verdict_, reason, "tpot speed-up ...", "", None)


ROUNDS = [CrossoverPlacement(control="x", treatment="y"), CrossoverPlacement(control="y", treatment="x")]


def test_the_geometric_mean_of_the_rounds_removes_a_host_factor_and_their_ratio_measures_it() -> None:
    # true speed-up 1.2, the treatment's round-1 host 10% faster: round 1 measures 1.32, round 2 1.2/1.1
    placed = crossover.fold(speedup(1.2 * 1.1, 0.02), speedup(1.2 / 1.1, 0.03))
    assert placed.speedup == pytest.approx(1.2)
    assert placed.effect == pytest.approx(1.1)
    half = math.hypot(0.02, 0.03) / 2
    assert placed.ci_low == pytest.approx(1.1 * math.exp(-half))
    assert placed.speedup_ci_high == pytest.approx(1.2 * math.exp(half))
    assert not placed.demoted


def test_a_round_without_an_interval_gives_no_estimate() -> None:
    placed = crossover.fold(speedup(1.2, 0.02), Speedup(metric="tpot", estimate=1.1))
    assert placed.effect is None and placed.speedup is None
    assert crossover.fold(speedup(1.2, 0.02), None).effect is None


def test_a_neutral_treatment_on_a_faster_node_loses_its_pass() -> None:
    """Round 1 passes (1.10x [1.08, 1.12] > 1.05) only because the treatment's node is 10% faster."""
    s = experiment(crossover="Always")
    first = [stage("c1", 1.10, 0.02, StageVerdict.PASS), stage("c4", 1.10, 0.02, StageVerdict.PASS)]
    swapped = [stage("c1", 1 / 1.10, 0.03, StageVerdict.FAIL), stage("c4", 1 / 1.10, 0.03, StageVerdict.FAIL)]
    judged, block = crossover.apply(
        s, analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed"), swapped, ROUNDS
    )
    assert judged.verdict is Verdict.INCONCLUSIVE
    assert judged.reason == crossover.PLACEMENT_EFFECT
    assert [st.verdict for st in judged.stages] == [StageVerdict.INCONCLUSIVE] * 2
    assert judged.stages[0].reasons[0].startswith("PlacementEffect: placement effect 1.100x")
    assert judged.stages[0].reasons[1:] == ["why"]
    assert block.ran and block.mode == "Always" and block.demoted == ["c1", "c4"]
    assert block.effects == {"c1": pytest.approx(1.1), "c4": pytest.approx(1.1)}
    assert block.rounds == ROUNDS
    assert "placement effect 1.10x" in judged.message and "PlacementEffect, Inconclusive" in judged.message
    assert judged.recommendation is not None and judged.recommendation.beneficial_up_to is None


def test_a_true_win_well_clear_of_the_placement_effect_keeps_its_promote() -> None:
    s = experiment(crossover="IfApart")
    # true 1.32x, treatment's node 2% slower in round 1
    first = [stage("c1", 1.32 / 1.02, 0.03, StageVerdict.PASS)]
    swapped = [stage("c1", 1.32 * 1.02, 0.04, StageVerdict.PASS)]
    before = analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed")
    judged, block = crossover.apply(s, before, swapped, ROUNDS)
    assert judged.verdict is Verdict.PROMOTE and judged.reason == "SpeedupConfirmed"
    placement = judged.stages[0].placement
    assert placement is not None and placement.effect == pytest.approx(1 / 1.02)
    assert placement.speedup == pytest.approx(1.32)
    assert block.demoted == [] and block.effects == {"c1": pytest.approx(1 / 1.02, abs=1e-4)}


def test_a_pass_whose_margin_is_no_larger_than_the_placement_effect_is_inconclusive() -> None:
    """A pass stands only when the speed-up without the placement still clears minSpeedup (1.05)."""
    s = experiment()
    first = [stage("c1", 1.25 * 1.08, 0.01, StageVerdict.PASS)]  # placement 1.08x, well inside the margin
    swapped = [stage("c1", 1.25 / 1.08, 0.01, StageVerdict.PASS)]
    judged, _ = crossover.apply(s, analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed"), swapped, ROUNDS)
    placement = judged.stages[0].placement
    assert placement is not None and placement.speedup_ci_low == pytest.approx(
        1.25 * math.exp(-math.hypot(0.01, 0.01) / 2)
    )
    assert judged.verdict is Verdict.PROMOTE and not placement.demoted
    # 1.04 x 1.08 = 1.123 [1.112, 1.135] passes round 1; without the placement 1.04 < 1.05
    first = [stage("c1", 1.04 * 1.08, 0.01, StageVerdict.PASS)]
    swapped = [stage("c1", 1.04 / 1.08, 0.01, StageVerdict.FAIL)]
    judged, _ = crossover.apply(s, analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed"), swapped, ROUNDS)
    assert judged.verdict is Verdict.INCONCLUSIVE and judged.reason == "PlacementEffect"
    assert "without it the speed-up is 1.040x" in judged.stages[0].reasons[0]


def test_a_pass_on_a_slower_placement_stands() -> None:
    """The treatment's round-1 host was slower: the placement worked against the pass, which stands."""
    s = experiment()
    first = [stage("c1", 1.2 / 1.1, 0.02, StageVerdict.PASS)]
    swapped = [stage("c1", 1.2 * 1.1, 0.02, StageVerdict.PASS)]
    judged, block = crossover.apply(
        s, analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed"), swapped, ROUNDS
    )
    assert judged.verdict is Verdict.PROMOTE and block.effects == {"c1": pytest.approx(1 / 1.1, abs=1e-4)}


def test_a_pass_without_a_swapped_estimate_is_never_kept() -> None:
    s = experiment()
    first = [stage("c1", 1.5, 0.02, StageVerdict.PASS)]
    judged, block = crossover.apply(s, analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed"), [], ROUNDS)
    assert judged.verdict is Verdict.INCONCLUSIVE and block.demoted == ["c1"]
    assert "placement effect unknown" in judged.stages[0].reasons[0]
    assert "c1 not estimated" in judged.message


def test_a_swapped_round_that_failed_withholds_every_pass_and_says_why() -> None:
    s = experiment()
    first = [stage("c1", 1.5, 0.02, StageVerdict.PASS)]
    judged, block = crossover.apply(
        s,
        analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed"),
        [],
        ROUNDS[:1],
        failure="control arm exited",
    )
    assert judged.verdict is Verdict.INCONCLUSIVE and judged.reason == "PlacementEffect"
    assert (block.ran, block.reason, block.demoted) == (False, "SwappedRoundFailed", ["c1"])
    assert (
        block.message
        == "crossover: the swapped round could not be measured (control arm exited), so no pass stands"
    )
    assert judged.message.endswith(block.message)


def test_the_crossover_never_turns_a_reject_into_anything_else() -> None:
    """A true win measured as a loss on a slower node stays Reject: the crossover only withholds passes."""
    s = experiment()
    first = [stage("c1", 1.0, 0.02, StageVerdict.FAIL)]
    swapped = [stage("c1", 1.3, 0.02, StageVerdict.PASS)]
    judged, block = crossover.apply(
        s, analysis_of(first, Verdict.REJECT, "SlowerThanRequired"), swapped, ROUNDS
    )
    assert judged.verdict is Verdict.REJECT and judged.reason == "SlowerThanRequired"
    assert judged.stages[0].verdict is StageVerdict.FAIL
    assert judged.stages[0].placement is not None and not judged.stages[0].placement.demoted
    assert block.effects == {"c1": pytest.approx(math.sqrt(1.0 / 1.3), abs=1e-4)}


def test_a_demoted_stage_that_was_not_required_leaves_the_verdict() -> None:
    s = experiment(requireStages=["c1"])
    first = [stage("c1", 1.4, 0.02, StageVerdict.PASS), stage("c4", 1.1, 0.02, StageVerdict.PASS)]
    swapped = [stage("c1", 1.4, 0.02, StageVerdict.PASS), stage("c4", 1 / 1.1, 0.02, StageVerdict.FAIL)]
    judged, block = crossover.apply(
        s, analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed"), swapped, ROUNDS
    )
    assert judged.verdict is Verdict.PROMOTE and judged.reason == "SpeedupConfirmed"
    assert block.demoted == ["c4"]


def test_an_unmeasured_run_is_not_checked() -> None:
    s = experiment(crossover="Always")
    judged, block = crossover.apply(s, analysis_of([], None, "NoData"), [], ROUNDS)  # type: ignore[arg-type]
    assert judged.verdict is None
    assert (block.ran, block.reason) == (False, "NotMeasured")


def test_if_apart_runs_only_where_the_hosts_differ_and_off_never() -> None:
    apart = status.Environment(host_differences=["node"])
    together = status.Environment()
    assert crossover.wanted(experiment(crossover="IfApart").analysis, apart)
    assert not crossover.wanted(experiment(crossover="IfApart").analysis, together)
    assert crossover.wanted(experiment(crossover="Always").analysis, together)
    assert not crossover.wanted(experiment().analysis, apart)
    assert crossover.not_apart(experiment(crossover="IfApart").analysis).reason == "NotApart"


def test_the_swapped_round_measures_a_fraction_of_each_stage_at_a_fixed_horizon() -> None:
    s = crossover.swapped_spec(experiment(crossover="Always", crossoverFraction=0.3))
    assert [st.requests for st in s.workload.stages] == [30, 12]
    assert not s.analysis.sequential and s.analysis.crossover is spec.Crossover.OFF
    tiny = crossover.swapped_spec(experiment(crossoverFraction=0.01))
    assert [st.requests for st in tiny.workload.stages] == [10, 10]  # the floor the CRD states


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_a_crossover_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="crossoverFraction"):
        experiment(crossoverFraction=fraction)


def test_the_operator_carries_the_crossover_block_into_the_completed_status() -> None:
    parsed, name = validation.parse_experiment(experiment_document(analysis={"crossover": "IfApart"}))
    subject = reconcile.Subject(name=name, generation=1, spec=parsed)
    current = status.ExperimentStatus(observed_generation=1, phase=status.Phase.ANALYZING)
    block = status.CrossoverResult(mode="IfApart", ran=True, effects={"low": 1.2}, demoted=["low"])
    judged = reconcile.Judgement(
        verdict=Verdict.INCONCLUSIVE,
        reason="PlacementEffect",
        message="tpot 1.31x [1.24, 1.38] at low; crossover: ...",
        stages=[StageResult(name="low")],
        crossover=block,
        speedup_summary="low 1.31x",
    )
    done = reconcile.decide(subject, current, reconcile.Observed(analysis=judged), T0).status
    assert done.phase is status.Phase.COMPLETED and done.verdict is Verdict.INCONCLUSIVE
    assert done.reason == "PlacementEffect" and done.crossover == block


def hosts_apart(speed_factor: float | None = None) -> status.Environment:
    """The arms on nodes x and y; a treatment host `speed_factor` as fast as the control's (1.0)."""
    control = status.Host(node="x", speed_factor=None if speed_factor is None else 1.0)
    arms = status.ArmHosts(control=control, treatment=status.Host(node="y", speed_factor=speed_factor))
    return placement.with_hosts(status.Environment(), arms)


def promoted() -> verdict.Analysis:
    first = [stage("c1", 1.3, 0.02, StageVerdict.PASS), stage("c4", 1.02, 0.05, StageVerdict.INCONCLUSIVE)]
    return analysis_of(first, Verdict.PROMOTE, "SpeedupConfirmed")


def test_arms_on_different_hosts_without_a_crossover_are_never_promoted() -> None:
    """Issue 35 item 3: the pass may be the faster host; every pass turns Inconclusive with its own
    reason, and the message names the facts that differ and how to get a decision."""
    s = experiment(requireStages="any")
    judged = crossover.unseparated(s, promoted(), hosts_apart(speed_factor=1.1), None, servers_given=False)
    assert (judged.verdict, judged.reason) == (Verdict.INCONCLUSIVE, "PlacementUnseparated")
    assert [(st.verdict, st.code) for st in judged.stages] == [
        (StageVerdict.INCONCLUSIVE, "PlacementUnseparated"),
        (StageVerdict.INCONCLUSIVE, None),  # not a pass: left as it was
    ]
    assert judged.stages[0].reasons[1:] == ["why"]
    assert judged.message == (
        "not promoted: the arms ran on different hosts (node: x (control) vs y (treatment); speedFactor: "
        "1.0 (control) vs 1.1 (treatment)) and no crossover separated the placement from the speed-up: "
        "a faster host is measured as a speed-up; to decide, run the crossover (spec.analysis.crossover: "
        "IfApart) or co-locate the arms (spec.placement.colocate: Required); tpot speed-up ..."
    )


def test_servers_given_by_url_or_a_crossover_that_could_not_run_say_how_to_decide() -> None:
    s = experiment()
    given = crossover.unseparated(s, promoted(), hosts_apart(), None, servers_given=True)
    assert given.reason == "PlacementUnseparated"
    assert "to decide, give both servers on one host, or let run --local start the arms" in given.message
    skipped = crossover.skipped(s.analysis, crossover.SAME_PLACEMENT, "nothing to swap")
    unswapped = crossover.unseparated(s, promoted(), hosts_apart(), skipped, servers_given=False)
    assert unswapped.reason == "PlacementUnseparated"
    assert (
        "co-locate the arms (spec.placement.colocate: Required); the crossover did not run (nothing to swap)"
        in (unswapped.message)
    )


def test_a_crossover_that_ran_or_arms_on_one_host_leave_the_promote_and_other_verdicts_keep_their_reason() -> (
    None
):
    s = experiment(crossover="IfApart")
    ran = status.CrossoverResult(mode="IfApart", ran=True)
    assert crossover.unseparated(s, promoted(), hosts_apart(), ran, servers_given=False) == promoted()
    host = status.Host(node="x")
    together = placement.with_hosts(status.Environment(), status.ArmHosts(control=host, treatment=host))
    assert crossover.unseparated(s, promoted(), together, None, servers_given=False) == promoted()
    assert crossover.unseparated(s, promoted(), None, None, servers_given=True) == promoted()
    rejected = analysis_of([stage("c1", 0.9, 0.02, StageVerdict.FAIL)], Verdict.REJECT, "SlowerThanRequired")
    judged = crossover.unseparated(s, rejected, hosts_apart(), None, servers_given=False)
    assert (judged.verdict, judged.reason, judged.stages) == (
        Verdict.REJECT,
        "SlowerThanRequired",
        rejected.stages,
    )
    assert judged.message == (
        "tpot speed-up ...; the arms ran on different hosts (they differ in node): the speed-up may partly be "
        "the placement"
    )
