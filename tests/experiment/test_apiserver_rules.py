"""`validate` refuses what the API server would refuse of an arm's Deployment or the spec ConfigMap
(the same cases are put to a real API server in tests/e2e/test_operator.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode import cli
from specdecode.experiment import apiserver_rules, validation
from tests.experiment.cases_apiserver import ACCEPTED, REFUSED
from tests.factories import experiment_document


def problems(engine: dict[str, Any]) -> list[str]:
    doc = experiment_document()
    doc["spec"].setdefault("engine", {}).update(engine)
    return [str(p) for p in validation.check_spec(doc["spec"])]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_api_server_refuses_is_refused_naming_the_field(case: str) -> None:
    engine, says = REFUSED[case]
    found = problems(engine)
    assert len(found) == 1 and says in found[0], found


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_what_the_api_server_accepts_is_accepted(case: str) -> None:
    assert problems(ACCEPTED[case]) == []


def test_a_spec_too_large_for_its_config_map_is_refused() -> None:
    found = problems({"env": [{"name": "BIG", "value": "x" * apiserver_rules.CONFIG_MAP_BYTES}]})
    assert len(found) == 1 and found[0].startswith("spec: ")
    assert "bytes as YAML: the load Job reads the experiment from a ConfigMap" in found[0]
    assert problems({"env": [{"name": "BIG", "value": "x" * 1_000_000}]}) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [("16Gi", 16 * 2**30), ("500m", 0.5), ("1e3", 1000), (".5", 0.5), ("1.", 1), (3, 3), ("1Ki", 1024)],
)
def test_quantities_are_read_as_kubernetes_reads_them(value: int | str, expected: float) -> None:
    assert apiserver_rules.quantity(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["-1", -1, "2 GB", "1.5.0", "Gi", "1Kb", "e3"])
def test_what_is_no_quantity_is_none(value: int | str) -> None:
    assert apiserver_rules.quantity(value) is None


def test_validate_refuses_results_the_operator_would_not_read_at_its_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = experiment_document()
    doc["spec"]["workload"] = {
        "stages": [{"name": f"s{i}", "concurrency": 1} for i in range(4)],
        "requestsPerStage": 1_000_000,
    }
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "at the operator's default limits: spec.workload: up to" in err
    assert "more than the 48 MiB the operator reads (SPECDECODE_RESULTS_MAX_BYTES)" in err


def test_two_experiments_of_one_name_in_a_file_are_each_checked_against_the_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big, small = experiment_document(), experiment_document()
    big["spec"]["workload"] = {"stages": [{"name": "s0", "concurrency": 1}], "requestsPerStage": 1_000_000}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([small, big]))
    assert cli.main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.count("at the operator's default limits: spec.workload") == 1
    assert out.count(": exp: valid") == 1
