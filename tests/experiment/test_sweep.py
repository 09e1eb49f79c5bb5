"""`workload.sweep`: pure expansion into named stages, its validation and `validate`'s print-out (issue 17)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode import cli
from specdecode.experiment import crd, spec, sweep, validation
from tests.factories import ROOT, experiment_document


def workload(**fields: Any) -> spec.WorkloadSpec:
    return spec.WorkloadSpec.model_validate(fields)


def problems(**workload_fields: Any) -> list[str]:
    document = experiment_document(workload=workload_fields)
    return [str(p) for p in validation.check_document(document)]


def test_a_geometric_concurrency_sweep_doubles_from_one_to_sixty_four() -> None:
    w = workload(sweep={"concurrency": {"from": 1, "to": 64, "steps": 7}})
    assert [(s.name, s.concurrency, s.rate) for s in w.stages] == [
        (f"c{c}", c, None) for c in (1, 2, 4, 8, 16, 32, 64)
    ]


def test_rounding_merges_concurrencies_that_coincide() -> None:
    w = workload(sweep={"concurrency": {"from": 1, "to": 4, "steps": 6}})
    # 1, 1.32, 1.74, 2.30, 3.03, 4 -> 1, 1, 2, 2, 3, 4
    assert [s.concurrency for s in w.stages] == [1, 2, 3, 4]


def test_a_rate_list_is_sorted_deduplicated_and_named_as_dns_labels() -> None:
    w = workload(sweep={"rate": {"values": [2, 0.5, 2.0, 1]}})
    assert [(s.name, s.rate) for s in w.stages] == [("r0-5", 0.5), ("r1", 1.0), ("r2", 2.0)]
    assert all(s.concurrency is None for s in w.stages)


def test_geometric_rates_are_rounded_to_three_significant_digits() -> None:
    w = workload(sweep={"rate": {"from": 1, "to": 8, "steps": 4}})
    assert [s.rate for s in w.stages] == [1.0, 2.0, 4.0, 8.0]
    w = workload(sweep={"rate": {"from": 1, "to": 2, "steps": 3}})
    assert [(s.name, s.rate) for s in w.stages] == [("r1", 1.0), ("r1-41", 1.41), ("r2", 2.0)]


def test_geometric_series_include_both_bounds_exactly() -> None:
    values = sweep.geometric(3, 1000, 9)
    assert values[0] == 3 and values[-1] == 1000 and len(values) == 9
    ratios = {round(b / a, 9) for a, b in itertools.pairwise(values)}
    assert len(ratios) == 1


def test_the_sweep_is_kept_but_never_serialised_so_a_dumped_spec_parses_again() -> None:
    s = spec.ExperimentSpec.model_validate(
        experiment_document(workload={"sweep": {"concurrency": {"values": [1, 8]}}})["spec"]
    )
    assert s.workload.sweep is not None and s.workload.sweep.axis == "concurrency"
    wire = s.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert "sweep" not in wire["workload"]
    assert [st["name"] for st in wire["workload"]["stages"]] == ["c1", "c8"]
    assert spec.ExperimentSpec.model_validate(wire).workload.stages == s.workload.stages


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"sweep": {"rate": {"values": [1]}}, "stages": [{"name": "a", "rate": 1}]},
            "spec.workload: set either stages or sweep, not both",
        ),
        ({}, "spec.workload: needs stages (the load levels) or sweep"),
        (
            {"sweep": {"rate": {"values": [1]}, "concurrency": {"values": [1]}}},
            "spec.workload.sweep: a sweep needs exactly one of concurrency or rate",
        ),
        ({"sweep": {}}, "spec.workload.sweep: a sweep needs exactly one of concurrency or rate"),
        (
            {"sweep": {"concurrency": {"values": [1, 2.5]}}},
            "spec.workload.sweep: concurrency values must be whole numbers, got 2.5",
        ),
        (
            {"sweep": {"rate": {"from": 1, "to": 8}}},
            "spec.workload.sweep.rate: a geometric sweep needs from, to and steps",
        ),
        (
            {"sweep": {"rate": {"from": 8, "to": 1, "steps": 3}}},
            "spec.workload.sweep.rate: from (8) must be below to (1)",
        ),
        (
            {"sweep": {"rate": {"values": [1], "steps": 3}}},
            "spec.workload.sweep.rate: give either values or from/to/steps",
        ),
        ({"sweep": {"rate": {"values": [0]}}}, "spec.workload.sweep.rate.values[0]:"),
        ({"sweep": {"rate": {"from": 1, "to": 8, "steps": 40}}}, "spec.workload.sweep.rate.steps:"),
    ],
)
def test_invalid_sweeps_are_refused_naming_the_field(fields: dict[str, Any], expected: str) -> None:
    found = problems(**fields)
    assert any(p.startswith(expected) for p in found), found


def test_require_stages_may_name_generated_stages_and_is_checked_against_them() -> None:
    ok = experiment_document(
        workload={"sweep": {"concurrency": {"values": [1, 64]}}}, analysis={"requireStages": ["c1"]}
    )
    assert validation.check_document(ok) == []
    bad = experiment_document(
        workload={"sweep": {"concurrency": {"values": [1, 64]}}}, analysis={"requireStages": ["c2"]}
    )
    assert [p.path for p in validation.check_document(bad)] == ["spec.analysis.requireStages[0]"]


def test_the_crd_makes_stages_optional_and_the_api_server_requires_exactly_one_of_stages_or_sweep() -> None:
    schema = crd.openapi_schema(spec.WorkloadSpec)
    assert "stages" not in schema.get("required", [])
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert "has(self.stages) != has(self.sweep)" in rules
    assert all(r.startswith("!has(self.stages) ||") for r in rules if "self.stages.all" in r)
    axis = schema["properties"]["sweep"]["properties"]["concurrency"]["properties"]
    assert {"values", "from", "to", "steps"} <= set(axis)


def test_validate_prints_the_expansion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(experiment_document(workload={"sweep": {"rate": {"values": [1, 4]}}})))
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{path}: exp: valid", f"{path}: exp: workload.sweep (rate) -> 2 stages: r1, r4"]


def test_the_sweep_example_expands_to_seven_doubling_stages(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "examples" / "sweep.yaml"
    assert cli.main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{path}: sim-sweep: workload.sweep (concurrency) -> 7 stages: c1, c2, c4, c8, c16, c32, c64"
    )


def test_a_sweep_s_requests_go_to_every_stage_it_makes() -> None:
    """(mutation benchmark survivor in sweep: the requests attached only when absent)"""
    assert sweep.expand("concurrency", [1, 4], requests=32) == [
        {"name": "c1", "concurrency": 1, "requests": 32},
        {"name": "c4", "concurrency": 4, "requests": 32},
    ]
    assert sweep.expand("concurrency", [2]) == [{"name": "c2", "concurrency": 2}]
