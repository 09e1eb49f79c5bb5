"""`spec.workload.loadPods`: the field, its validation, the Indexed Job, and the merge of the pods' results."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdecode.experiment import loadpods, manifests, records, validation
from specdecode.experiment import validity as validity_mod
from tests.factories import experiment_document

SETTINGS = manifests.Settings(operator_image="specdecode:test")
STAGES = [{"name": "low", "rate": 1.0}, {"name": "c16", "concurrency": 16}]


def problems(**workload: Any) -> list[str]:
    doc = experiment_document(workload={"stages": STAGES, **workload})
    return [str(p) for p in validation.check_document(doc)]


def test_load_pods_defaults_to_one_and_is_bounded_with_the_field_named() -> None:
    parsed, _ = validation.parse_experiment(experiment_document())
    assert parsed.workload.load_pods == 1
    assert problems(loadPods=16) == []
    for bad in (0, 17):
        (found,) = problems(loadPods=bad)
        assert found.startswith("spec.workload.loadPods:"), found
        assert ("1" if bad == 0 else "16") in found


def test_more_pods_than_a_closed_loop_stage_s_concurrency_or_a_multi_turn_dataset_is_refused() -> None:
    (found,) = problems(loadPods=4, stages=[{"name": "low", "rate": 1.0}, {"name": "c2", "concurrency": 2}])
    assert found.startswith("spec.workload.stages[1].concurrency: is 2, fewer concurrent requests than")
    assert "raise it or lower loadPods" in found
    assert problems(loadPods=2, stages=[{"name": "c2", "concurrency": 2}]) == []
    multi = problems(
        loadPods=2,
        stages=[{"name": "c4", "concurrency": 4}],
        dataset={"type": "multiTurn", "builtin": "conversations"},
    )
    assert [p for p in multi if p.startswith("spec.workload.loadPods:")], multi
    (few,) = problems(loadPods=4, requestsPerStage=3)
    assert few.startswith("spec.workload.requestsPerStage: is 3, fewer than spec.workload.loadPods (4)")
    (stage,) = problems(loadPods=4, stages=[{"name": "low", "rate": 1.0, "requests": 2}])
    assert stage.startswith("spec.workload.stages[0].requests: is 2, fewer than spec.workload.loadPods (4)")
    (search,) = problems(loadPods=3, search={"concurrency": {"from": 2, "to": 16}})
    assert search.startswith("spec.workload.search.concurrency.from: is 2")


def job(**workload: Any) -> dict[str, Any]:
    parsed, _ = validation.parse_experiment(experiment_document(workload={"stages": STAGES, **workload}))
    return manifests.build_load_job("exp", parsed, SETTINGS, owner_uid="u", generation=2, salt="s")


def test_one_load_pod_renders_the_job_of_before_and_n_an_indexed_job_of_n() -> None:
    # loadPods: 1 written out or left out: the Job of every experiment so far, to the byte
    before = json.dumps(job(), sort_keys=True)
    assert json.dumps(job(loadPods=1), sort_keys=True) == before
    assert "completionMode" not in before and "--load-pods" not in before
    three = job(loadPods=3)
    assert {
        k: three["spec"][k] for k in ("completionMode", "completions", "parallelism", "backoffLimit")
    } == {
        "completionMode": "Indexed",
        "completions": 3,
        "parallelism": 3,
        "backoffLimit": 0,  # one pod failing fails the Job: the run is every pod's or none
    }
    args = three["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--load-pods") + 1] == "3"
    # otherwise the same Job
    three["spec"]["template"]["spec"]["containers"][0]["args"] = [
        a for a in args if a not in ("--load-pods", "3")
    ]
    for key in ("completionMode", "completions", "parallelism"):
        del three["spec"][key]
    assert json.dumps(three, sort_keys=True) == before


def record(stage: str, index: int, arm: str, t: float, **fields: Any) -> records.RequestRecord:
    return records.RequestRecord(
        stage=stage,
        index=index,
        arm=arm,
        intended=t,
        sent=t + 0.001,
        first_token=t + 0.05,
        end=t + 0.5,
        events=[(t + 0.05, 1), (t + 0.5, 10)],
        **fields,
    )


def pod(wall: float, indices: range, lag: float, *, valid: bool = True) -> loadpods.Measured:
    """One pod's results: stage `s` from 1 s to 2 s on its own clock, anchored at `wall`."""
    recs = [record("s", i, arm, 1.0 + i * 0.01) for i in indices for arm in ("control", "treatment")]
    windows = [records.StageWindow(stage="s", start=1.0, end=2.0 + lag)]
    reasons = [] if valid else [f"schedule lag p99 {lag * 1000:.2f} ms > budget 5.00 ms"]
    summary = {
        "validity": {"valid": valid, "reasons": reasons, "client_cpu_percent": 40.0},
        "stages": [{"x": 1}],
    }
    return recs, records.RunAnchor(monotonic=100.0 + wall, wall=wall), windows, summary


def test_the_merge_puts_every_pod_on_the_first_pod_s_clock_and_spans_each_stage() -> None:
    recs, anchor, windows, summary = loadpods.merge(
        [pod(1000.5, range(0, 10, 2), 0.0), pod(1000.0, range(1, 10, 2), 0.3)]
    )
    assert anchor.wall == 1000.0  # pod 1 was anchored first
    assert sorted((r.index, r.arm) for r in recs) == [
        (i, a) for i in range(10) for a in ("control", "treatment")
    ]
    even = next(r for r in recs if r.index == 2 and r.arm == "control")
    assert even.intended == pytest.approx(1.02 + 0.5) and even.events[0][0] == pytest.approx(1.07 + 0.5)
    assert even.end == pytest.approx(1.52 + 0.5) and even.sent == pytest.approx(1.021 + 0.5)
    odd = next(r for r in recs if r.index == 3 and r.arm == "control")
    assert odd.intended == pytest.approx(1.03)  # pod 1's own clock is the merged one
    # earliest start, latest end: pod 1 from 1.0, pod 0 (0.5 s later) until 2.5
    (window,) = windows
    assert (window.start, window.end) == (pytest.approx(1.0), pytest.approx(2.5))
    # in the order their pairs completed, as one pod writes them
    done = [max(x.end or 0 for x in recs if x.index == r.index) for r in recs]
    assert done == sorted(done)
    assert summary["validity"]["valid"] and summary["loadPods"] == 2
    assert summary["podStages"] == [[{"x": 1}], [{"x": 1}]]


def test_a_pod_that_fell_behind_invalidates_the_merged_run_and_is_named() -> None:
    *_, summary = loadpods.merge([pod(0.0, range(0, 4, 2), 0.0), pod(0.0, range(1, 4, 2), 0.04, valid=False)])
    validity = summary["validity"]
    assert not validity["valid"] and validity["invalid_pods"] == [1]
    assert validity["reasons"] == ["load pod 1: schedule lag p99 40.00 ms > budget 5.00 ms"]
    assert [p["valid"] for p in validity["pods"]] == [True, False]
    judged = validity_mod.of_stage(validity_mod.Validity.model_validate(validity), "s")
    assert not judged.valid and "load pod 1" in judged.reasons[0]
    # a pod marked invalid without a reason is still named
    recs, anchor, windows, unexplained = pod(0.0, range(1), 0.0, valid=False)
    unexplained["validity"]["reasons"] = []
    *_, silent = loadpods.merge([(recs, anchor, windows, unexplained), pod(0.0, range(1, 2), 0.0)])
    assert silent["validity"]["reasons"] == ["load pod 0: marked invalid"]


def test_one_pod_s_results_are_not_touched_and_none_is_an_error() -> None:
    only = pod(5.0, range(3), 0.0)
    assert loadpods.merge([only]) is only
    with pytest.raises(ValueError, match="no load pod"):
        loadpods.merge([])


@pytest.mark.parametrize("pods", [1, 2, 3, 7, 16])
def test_the_concurrency_shares_add_up_and_differ_by_at_most_one(pods: int) -> None:
    for concurrency in range(pods, 40):
        shares = [loadpods.concurrency_share(concurrency, k, pods) for k in range(pods)]
        assert sum(shares) == concurrency and max(shares) - min(shares) <= 1 and min(shares) >= 1


def test_a_failed_load_keeps_only_the_stages_every_pod_finished() -> None:
    recs, anchor, windows, summary = pod(0.0, range(0, 4, 2), 0.0)
    late = [records.StageWindow(stage="t", start=3.0, end=4.0)]
    first = ([*recs, record("t", 0, "control", 3.0)], anchor, [*windows, *late], summary)
    second = pod(0.0, range(1, 4, 2), 0.0)  # finished s, not t
    kept, unkept = loadpods.finished_by_all([first, second], ["s", "t", "u"])
    assert unkept == ["stage t: load pod 1 did not finish it"]  # u: no pod finished it, not partial
    assert [[w.stage for w in k[2]] for k in kept] == [["s"], ["s"]]
    assert {r.stage for k in kept for r in k[0]} == {"s"}
    nothing, why = loadpods.finished_by_all([first, None, None], ["s", "t"])
    assert nothing == []
    assert why == ["stage s: load pods 1, 2 did not finish it", "stage t: load pods 1, 2 did not finish it"]
