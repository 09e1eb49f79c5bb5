"""The break-even search (`workload.search`): the pure bisection, its spec and validation (issue 17)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from specdecode.controller import handlers
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import search, spec, status, validation
from tests.factories import experiment_document


def run_search(
    clears: Callable[[float], bool],
    *,
    lower: float = 1,
    upper: float = 64,
    whole: bool = True,
    max_probes: int = 8,
    tolerance: float = 0.25,
) -> tuple[list[float], search.Step]:
    """Drive `search.step` against a known outcome per load; the loads probed and the final step."""
    probes: list[search.Probe] = []
    while True:
        step = search.step(
            lower=lower, upper=upper, whole=whole, probes=probes, max_probes=max_probes, tolerance=tolerance
        )
        if step.next_load is None:
            return [p.load for p in probes], step
        assert step.next_load not in [p.load for p in probes], "a probe is never repeated"
        probes.append(search.Probe(step.next_load, clears(step.next_load)))


@pytest.mark.parametrize("threshold", [1, 2, 3, 7, 15, 16, 33, 63])
def test_a_concurrency_search_finds_the_exact_break_even_of_a_monotone_speed_up(threshold: int) -> None:
    loads, last = run_search(lambda c: c <= threshold, max_probes=16)
    assert last.reason == (search.ABOVE_RANGE if threshold >= 64 else search.CONVERGED)
    assert last.break_even == threshold and last.first_failing == threshold + 1
    assert loads[:2] == [1, 64]  # the bounds first
    # geometric halving of log(hi/lo) down to adjacent whole numbers: log2(ln 64 / ln(64/63)) ~ 8 steps
    assert len(loads) <= 2 + math.ceil(math.log2(math.log(64) / math.log(64 / 63)))


def test_the_bisection_is_geometric() -> None:
    loads, _ = run_search(lambda c: c <= 15)
    assert loads[:4] == [1, 64, 8, 23]  # sqrt(1*64) = 8, sqrt(8*64) = 22.6


def test_a_lower_bound_that_does_not_clear_stops_below_range() -> None:
    loads, last = run_search(lambda c: False)
    assert loads == [1]
    assert last.reason == search.BELOW_RANGE and last.break_even is None and last.first_failing == 1


def test_an_upper_bound_that_clears_stops_above_range() -> None:
    loads, last = run_search(lambda c: True)
    assert loads == [1, 64]
    assert last.reason == search.ABOVE_RANGE and last.break_even == 64 and last.first_failing is None


def test_max_probes_stops_with_the_bracket_reached() -> None:
    loads, last = run_search(lambda c: c <= 40, max_probes=4)
    assert len(loads) == 4
    assert last.reason == search.MAX_PROBES
    assert last.break_even is not None and last.first_failing is not None
    assert last.break_even <= 40 < last.first_failing
    assert "4 probes" in last.message


def test_a_rate_search_stops_within_the_tolerance() -> None:
    loads, last = run_search(lambda r: r <= 3.3, lower=0.5, upper=16, whole=False, max_probes=16)
    assert last.reason == search.CONVERGED
    assert last.break_even is not None and last.first_failing is not None
    assert last.break_even <= 3.3 < last.first_failing <= last.break_even * 1.25
    assert all(float(f"{load:.3g}") == load for load in loads)  # rates keep 3 significant digits


def test_a_noisy_pass_above_a_failure_does_not_widen_the_bracket() -> None:
    outcome = {1: True, 64: False, 8: False, 3: True, 5: True, 6: True, 7: True}
    loads, last = run_search(lambda c: outcome[int(c)])
    assert loads == [1, 64, 8, 3, 5, 6, 7]
    assert (last.break_even, last.first_failing, last.reason) == (7, 8, search.CONVERGED)


def judged(name: str, verdict: status.StageVerdict) -> status.StageResult:
    return status.StageResult(name=name, verdict=verdict)


PASS, FAIL, INCONCLUSIVE = (
    status.StageVerdict.PASS,
    status.StageVerdict.FAIL,
    status.StageVerdict.INCONCLUSIVE,
)


def test_the_next_probe_follows_from_the_probes_judged_so_far_as_status_writes_them() -> None:
    """`progress` is what both `run --local` and the operator's collector ask after each probe."""
    wanted = spec.Search.model_validate({"concurrency": {"from": 1, "to": 16}, "maxProbes": 4})
    first, none_yet = search.progress(wanted, [])
    assert first.next_load == 1 and none_yet == status.SearchResult(axis="concurrency", ran=False)
    probes = [(1.0, judged("search1-c1", PASS)), (16.0, judged("search2-c16", FAIL))]
    step, so_far = search.progress(wanted, probes)
    assert step.next_load == 4  # sqrt(1 * 16)
    assert (so_far.ran, so_far.reason, so_far.break_even, so_far.first_failing) == (True, None, 1, 16)
    assert [p.name for p in so_far.probes] == ["search1-c1", "search2-c16"]
    # an Inconclusive probe does not clear: the bracket closes from above
    step, so_far = search.progress(wanted, [*probes, (4.0, judged("search3-c4", INCONCLUSIVE))])
    assert step.next_load == 2
    step, done = search.progress(
        wanted,
        [*probes, (4.0, judged("search3-c4", INCONCLUSIVE)), (2.0, judged("search4-c2", PASS))],
    )
    assert step.next_load is None
    assert (done.reason, done.break_even, done.first_failing) == (search.MAX_PROBES, 2, 4)
    assert done.message == "stopped after 4 probes; the break-even lies between 2 (clears) and 4 (does not)"


def test_a_probe_that_could_not_be_measured_stops_the_search_with_the_bracket_before_it() -> None:
    wanted = spec.Search.model_validate({"concurrency": {"from": 1, "to": 16}})
    probes = [(1.0, judged("search1-c1", PASS)), (16.0, judged("search2-c16", FAIL))]
    found = search.failed(wanted, probes, "search3-c4", "LoadJobFailed: exit 1")
    assert (found.ran, found.reason, found.break_even, found.first_failing) == (
        True,
        search.PROBE_FAILED,
        1,
        16,
    )
    assert found.message == "probe search3-c4 failed: LoadJobFailed: exit 1"
    assert [p.name for p in found.probes] == ["search1-c1", "search2-c16"]


def test_a_probe_is_planned_without_warm_up_and_judged_from_its_own_stage_only() -> None:
    s = validation.parse_experiment(experiment_document(workload=workload(concurrency={"from": 1, "to": 8})))[
        0
    ]
    assert s.workload.search is not None
    stage = s.workload.search.probe_stage(2, 8)
    planned = search.probe_spec(s, stage)
    assert (planned.workload.stages, planned.workload.warmup_requests) == ([stage], 0)
    assert planned.analysis == s.analysis and planned.engine == s.engine


def workload(**search_fields: Any) -> dict[str, Any]:
    return {"stages": [{"name": "c1", "concurrency": 1}], "search": search_fields}


def problems(document: dict[str, Any]) -> list[str]:
    return [str(p) for p in validation.check_document(document)]


def test_a_search_probe_is_a_stage_named_after_its_order_and_load() -> None:
    s = spec.Search.model_validate({"rate": {"from": 0.5, "to": 8}, "requestsPerProbe": 40})
    probe = s.probe_stage(3, 1.41)
    assert (probe.name, probe.rate, probe.concurrency, probe.requests) == ("search3-r1-41", 1.41, None, 40)
    c = spec.Search.model_validate({"concurrency": {"from": 1, "to": 64}}).probe_stage(1, 8)
    assert (c.name, c.concurrency, c.requests) == ("search1-c8", 8, None)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "spec.workload.search: a search needs exactly one of concurrency or rate"),
        (
            {"concurrency": {"from": 1, "to": 8}, "rate": {"from": 1, "to": 8}},
            "spec.workload.search: a search needs exactly one of concurrency or rate",
        ),
        (
            {"concurrency": {"from": 8, "to": 8}},
            "spec.workload.search.concurrency: from (8) must be below to (8)",
        ),
        (
            {"concurrency": {"from": 1.5, "to": 8}},
            "spec.workload.search: concurrency bounds must be whole numbers",
        ),
        ({"goal": "fastest", "rate": {"from": 1, "to": 8}}, "spec.workload.search.goal:"),
        ({"rate": {"from": 1, "to": 8}, "maxProbes": 1}, "spec.workload.search.maxProbes:"),
    ],
)
def test_invalid_searches_are_refused_naming_the_field(fields: dict[str, Any], expected: str) -> None:
    found = problems(experiment_document(workload=workload(**fields)))
    assert any(p.startswith(expected) for p in found), found


def test_a_search_needs_a_comparison() -> None:
    document = experiment_document(
        workload=workload(concurrency={"from": 1, "to": 8}), analysis={"mode": "NoiseFloor"}
    )
    assert problems(document) == [
        "spec.workload.search: needs analysis.mode Compare: an A/A run has no break-even"
    ]


def test_the_operator_accepts_a_search_and_runs_it() -> None:
    document = experiment_document(workload=workload(concurrency={"from": 1, "to": 8}))
    subject = handlers._subject("exp", 1, document, OperatorSettings())
    assert subject.spec is not None and not subject.problems
    assert subject.spec.workload.search is not None
    assert validation.check_operator_support(subject.spec) == []


def test_describe_names_why_it_stopped_and_every_probe_in_order() -> None:
    probe = status.StageResult(
        name="search1-c1",
        verdict=status.StageVerdict.PASS,
        speedup=status.Speedup(metric="tpot", estimate=1.2),
    )
    failing = status.StageResult(name="search2-c64", verdict=status.StageVerdict.FAIL)
    result = status.SearchResult(
        axis="concurrency",
        ran=True,
        reason="MaxProbes",
        message="stopped after 2 probes",
        probes=[probe, failing],
    )
    assert search.describe(result) == (
        "break-even search over concurrency: MaxProbes (stopped after 2 probes); "
        "probes: search1-c1 Pass 1.20x, search2-c64 Fail"
    )


def test_a_probe_is_judged_on_its_own_stage_s_measured_records() -> None:
    """The probe's records are found by the stage's name, whatever string object carries it (mutation
    benchmark survivor in search: `is` for `==`): a 1.4x treatment passes on every pair."""
    from tests.report import synthetic

    doc = experiment_document()
    doc["spec"]["workload"] = {"stages": [{"name": "search1-c4", "concurrency": 4}], "requestsPerStage": 300}
    s, _ = validation.parse_experiment(doc)
    records, windows = synthetic.run(s, speedup=1.4, n=300)
    probe = spec.Stage(name="".join(["search1", "-c4"]), concurrency=4, requests=300)
    judged = search.judge_probe(s, probe, records, windows, validity=None, index=1)
    assert judged.speedup is not None and judged.speedup.n == 300
    assert judged.verdict is status.StageVerdict.PASS
