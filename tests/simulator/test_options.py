"""The `specdecode sim` command line accepts what the experiment core renders, and vLLM's spellings."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specdecode.experiment import manifests, spec
from specdecode.experiment.simprofiles import PROFILES
from specdecode.simulator import options

EXAMPLE = Path(__file__).parents[2] / "examples" / "simulator.yaml"


def resolve(argv: list[str]) -> options.SimOptions:
    return options.resolve(options.parse(argv))


@pytest.mark.parametrize("arm", list(spec.Arm))
def test_the_command_line_rendered_by_the_experiment_core_is_accepted(arm: spec.Arm) -> None:
    doc = next(
        d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d.get("kind") == "SpecDecodeExperiment"
    )
    s = spec.ExperimentSpec.model_validate(doc["spec"])
    assert s.engine.simulator is not None
    argv = manifests.serve_args(s, arm)
    assert argv[:2] == ["specdecode", "sim"]
    opts = resolve(argv[2:])
    assert opts.served_model_name == s.served_name
    assert opts.profile == s.engine.simulator.profile
    assert (opts.spec is not None) == (arm is spec.Arm.TREATMENT)
    if opts.spec is not None:
        assert opts.spec.k == s.speculative.num_speculative_tokens
        assert opts.per_request_metrics == "summary"
    for name, value in s.engine.simulator.overrides().items():
        assert getattr(opts.params, name) == value


def test_overrides_replace_profile_values_and_the_rest_come_from_the_profile() -> None:
    opts = resolve(["M", "--profile", "h200-8b-draft-1b", "--decode-step-ms", "7", "--max_num_seqs", "3"])
    assert opts.params.decode_step_ms == 7 and opts.params.max_num_seqs == 3
    assert opts.params.draft_cost_ratio == PROFILES["h200-8b-draft-1b"].draft_cost_ratio


def test_other_vllm_flags_are_ignored_in_either_spelling() -> None:
    opts = resolve(["M", "--max_model_len", "4096", "--dtype", "bfloat16", "--trust-remote-code", "-tp", "2",
                    "--gpu_memory_utilization", "0.9", "--revision", "abc"])  # fmt: skip
    assert opts.max_model_len == 4096
    assert opts.ignored == ("--dtype bfloat16", "--trust-remote-code", "-tp 2", "--gpu_memory_utilization 0.9",
                            "--revision abc")  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[1]", "must be a JSON object"),
        ("{", "invalid JSON"),
        ('{"method": "ngram"}', "num_speculative_tokens"),
        ('{"num_speculative_tokens": 2, "synthetic_acceptance_rates": [0.5]}', "synthetic_acceptance_rates"),
    ],
)
def test_bad_speculative_configs_are_refused(raw: str, message: str) -> None:
    with pytest.raises(options.OptionsError, match=message):
        resolve(["M", "--speculative-config", raw])


def test_synthetic_acceptance_rates_override_the_acceptance_rate() -> None:
    opts = resolve(
        ["M", "--speculative-config", '{"num_speculative_tokens":2,"synthetic_acceptance_rates":[0.9,0.45]}']
    )
    assert opts.spec is not None and opts.spec.acceptance == pytest.approx((0.9, 0.5))


def test_api_key_falls_back_to_vllm_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert resolve(["M"]).api_keys == ("from-env",)
    assert resolve(["M", "--api-key", "a", "b"]).api_keys == ("a", "b")


TIMES = ("decode_step_ms", "batch_token_ms", "prefill_token_ms", "request_overhead_ms", "draft_fixed_ms")


def test_a_slower_host_scales_every_time_parameter_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(options.SPEED_FACTOR_ENV, raising=False)
    nominal = resolve(["--profile", "h200-8b-draft-1b"])
    slow = resolve(["--profile", "h200-8b-draft-1b", "--speed-factor", "1.1"])
    assert (nominal.speed_factor, slow.speed_factor) == (1.0, 1.1)
    assert nominal.params == PROFILES["h200-8b-draft-1b"]
    for name, value in nominal.params.as_dict().items():
        expected = value * 1.1 if name in TIMES else value
        assert getattr(slow.params, name) == pytest.approx(expected), name


def test_the_node_sets_the_speed_factor_through_the_environment_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(options.SPEED_FACTOR_ENV, "1.25")
    assert resolve([]).speed_factor == 1.25
    assert resolve(["--speed-factor", "0.9"]).speed_factor == 0.9
    monkeypatch.setenv(options.SPEED_FACTOR_ENV, "fast")
    with pytest.raises(options.OptionsError, match="SPECDECODE_SIM_SPEED_FACTOR: 'fast' is not a number"):
        resolve([])
    with pytest.raises(options.OptionsError, match="--speed-factor: 0 is out of range"):
        resolve(["--speed-factor", "0"])


@pytest.mark.parametrize("arm", list(spec.Arm))
def test_a_degradation_asked_in_the_spec_is_logged_by_the_treatment_only(arm: spec.Arm) -> None:
    doc = next(
        d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d.get("kind") == "SpecDecodeExperiment"
    )
    doc["spec"]["engine"]["simulator"]["logDegradations"] = ["MaxModelLenLowered", "ChatTemplate"]
    s = spec.ExperimentSpec.model_validate(doc["spec"])
    opts = resolve(manifests.serve_args(s, arm)[2:])
    expected = ("MaxModelLenLowered", "ChatTemplate") if arm is spec.Arm.TREATMENT else ()
    assert opts.degradations == expected


def test_an_unknown_degradation_kind_is_refused() -> None:
    with pytest.raises(SystemExit):
        options.parse(["M", "--log-degradation", "Slow"])


def test_the_batch_size_schedule_reaches_the_simulators_speculation() -> None:
    raw = '{"num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[1,8,4],[9,4096,0]]}'
    opts = resolve(["M", "--speculative-config", raw])
    assert opts.spec is not None and opts.spec.schedule == ((1, 8, 4), (9, 4096, 0))
    assert opts.spec.k_at(8) == 4 and opts.spec.k_at(9) == 0


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("[[2, 8, 4]]", "first range must start at 1"),
        ("[[1, 8, 4], [8, 16, 0]]", "overlaps"),
        ("[[1, 8, -1]]", "k must be >= 0"),
        ("[[1, 8]]", "three integers"),
        ("[]", "non-empty list"),
    ],
)
def test_a_schedule_vllm_would_refuse_is_refused(schedule: str, message: str) -> None:
    raw = f'{{"num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":{schedule}}}'
    with pytest.raises(options.OptionsError, match=message):
        resolve(["M", "--speculative-config", raw])
