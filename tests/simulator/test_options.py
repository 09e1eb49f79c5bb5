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
