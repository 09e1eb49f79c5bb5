from __future__ import annotations

import pydantic
import pytest

from specdecode.experiment import spec
from tests.factories import experiment_document


def parse(**overrides: object) -> spec.ExperimentSpec:
    return spec.ExperimentSpec.model_validate(experiment_document(**overrides)["spec"])


def test_defaults_make_a_fair_comparison() -> None:
    s = parse()
    assert s.engine.prefix_caching is False
    assert s.workload.sampling.temperature == 0.0
    assert s.workload.sampling.ignore_eos is True
    assert s.engine.seed == 42
    assert s.analysis.primary_metric is spec.PrimaryMetric.TPOT
    assert s.analysis.require_stages == "all"
    assert s.cleanup is spec.Cleanup.ALWAYS


def test_fields_are_camel_case_on_the_wire_and_round_trip() -> None:
    s = parse()
    wire = s.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert wire["speculative"]["numSpeculativeTokens"] == 5
    assert "num_speculative_tokens" not in wire["speculative"]
    assert spec.ExperimentSpec.model_validate(wire) == s


def test_models_are_frozen() -> None:
    s = parse()
    with pytest.raises(pydantic.ValidationError):
        s.model = "other"  # type: ignore[misc]


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="extra"):
        parse(modle="typo")


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("90s", 90)])
def test_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert spec.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "1d", "m30", "-5m"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        spec.parse_duration(text)


def test_stage_requests_fall_back_to_requests_per_stage() -> None:
    s = parse(
        workload={
            "stages": [{"name": "a", "rate": 1}, {"name": "b", "rate": 2, "requests": 7}],
            "requestsPerStage": 50,
        }
    )
    assert [s.stage_requests(stage) for stage in s.workload.stages] == [50, 7]


def test_simulator_overrides_only_hold_what_was_set() -> None:
    sim = spec.SimulatorSpec.model_validate({"profile": "h200-8b-draft-1b", "acceptanceRate": 0.5})
    assert sim.overrides() == {"acceptance_rate": 0.5}
