"""Silent degradations (#18): each of vLLM's messages, as its releases print them, is recognised."""

from __future__ import annotations

import json
import typing
from datetime import timedelta

import pytest

from specdecode.experiment import degradations, reconcile
from specdecode.experiment.degradations import Kind
from specdecode.experiment.reconcile import Observed
from specdecode.experiment.spec import SimulatorSpec
from specdecode.experiment.status import Degradation, ExperimentStatus, Phase, Verdict
from tests.experiment.test_reconcile import T0, at, condition, hosts, ready_arms, subject

# The message of each logger call, put together from the literals in the releases' source.
REAL = [
    (
        Kind.ASYNC_SCHEDULING_DISABLED,
        "Async scheduling not supported with ngram-based speculative decoding and will be disabled.",
    ),
    (
        Kind.ASYNC_SCHEDULING_DISABLED,
        "Async scheduling is not compatible with disable_padded_drafter_batch=True and will be disabled.",
    ),
    (
        Kind.ASYNC_SCHEDULING_DISABLED,
        "Async scheduling is disabled because the V1 model runner does not support it with "
        "suffix-based speculative decoding.",
    ),
    (
        Kind.ASYNC_SCHEDULING_DISABLED,
        "Async scheduling will be disabled because it is not supported with the `ray` distributed executor "
        "backend. ",
    ),
    (
        Kind.MAX_MODEL_LEN_LOWERED,
        "The draft model's max_model_len (4096) is smaller than the target model's (131072) and the V2 model "
        "runner can't skip speculation for longer sequences; reducing max_model_len to 4096.",
    ),
    (Kind.METHOD_FALLBACK, "method `ernie_mtp` is deprecated and replaced with mtp."),
    (Kind.METHOD_FALLBACK, "Draft model does not support multimodal inputs, falling back to text-only mode"),
    (
        Kind.METHOD_FALLBACK,
        "Speculative Decoding with draft models or parallel drafting does not fully support multimodal "
        "models yet. Proceeding with text-only speculative decoding.",
    ),
    (
        Kind.METHOD_FALLBACK,
        "Draft model Qwen3ForCausalLM does not support external multimodal embeddings. Embeddings from the "
        "target model will not be passed to the drafter; using text-only draft inputs instead.",
    ),
    (
        Kind.DRAFT_LIMITED,
        "Enabling num_speculative_tokens > 1 will run multiple times of forward on same MTP layer,which may "
        "result in lower acceptance rate",
    ),
    (
        Kind.DRAFT_LIMITED,
        "medusa cannot currently be run with tp>1; setting speculative_draft_tensor_parallel_size=1",
    ),
    (Kind.DRAFT_LIMITED, "Very small vocabulary intersection (37 tokens)."),
    (Kind.CHAT_TEMPLATE, "Chat template warmup failed"),
    (
        Kind.CHAT_TEMPLATE,
        "Loading chat template fallback for meta-llama/Llama-3.1-8B as there isn't one defined on HF Hub.",
    ),
    (
        Kind.CHAT_TEMPLATE,
        "You specified `--chat-template-content-format string` which is different from the detected format "
        "'openai'. If our automatic detection is incorrect, please consider opening a GitHub issue so that we "
        "can improve it: https://github.com/vllm-project/vllm/issues/new/choose",
    ),
]


def vllm_line(message: str, level: str = "WARNING") -> str:
    """As vLLM's logger prints it in a pod: process prefix, level, date, file:line, message."""
    return f"(EngineCore_DP0 pid=312) {level} 12-02 00:12:34 [vllm.py:816] {message}"


def test_every_pattern_has_a_real_message_here() -> None:
    assert len(REAL) == len(degradations.PATTERNS)
    for pattern in degradations.PATTERNS:
        assert pattern.regex.search(pattern.example), pattern.example
        assert any(pattern.regex.search(m) for _, m in REAL), pattern.regex.pattern


@pytest.mark.parametrize(("kind", "message"), REAL, ids=[f"{k}-{i}" for i, (k, _) in enumerate(REAL)])
def test_each_message_of_vllm_is_recognised_as_its_kind(kind: Kind, message: str) -> None:
    found = degradations.scan(
        ["INFO 12-02 00:12:30 [api_server.py:1] vLLM API server version 0.20.0", vllm_line(message)]
    )
    assert [d.kind for d in found] == [kind.value]
    assert found[0].message == message.strip()


def test_colour_codes_and_json_records_match_too() -> None:
    message = REAL[0][1]
    coloured = f"\x1b[1;36m(EngineCore_DP0 pid=1)\x1b[0;0m \x1b[33mWARNING\x1b[0m 12-02 00:12:34 [vllm.py:816] {message}"
    record = json.dumps({"level": "WARNING", "message": message})
    assert [d.kind for d in degradations.scan([coloured])] == ["AsyncSchedulingDisabled"]
    assert [d.kind for d in degradations.scan([record])] == ["AsyncSchedulingDisabled"]


def test_a_clean_start_up_log_has_no_degradation() -> None:
    clean = [
        vllm_line("Asynchronous scheduling is enabled.", "INFO"),
        vllm_line("Overriding draft model max model len from 131072 to 8192", "INFO"),
        vllm_line("Detected the chat template content format to be 'string'. You can set ...", "INFO"),
        vllm_line("Loading drafter model...", "INFO"),
    ]
    assert degradations.scan(clean) == []


def test_a_repeated_line_is_reported_once_in_log_order() -> None:
    lines = [vllm_line(REAL[-1][1]), vllm_line(REAL[0][1]), vllm_line(REAL[-1][1])]
    assert [d.kind for d in degradations.scan(lines)] == ["ChatTemplate", "AsyncSchedulingDisabled"]


def test_degradations_raise_the_speculation_degraded_condition_and_only_then() -> None:
    done = ExperimentStatus(phase=Phase.COMPLETED, verdict=Verdict.REJECT)
    assert "SpeculationDegraded" not in reconcile.conditions_for(done)
    found = [Degradation(kind="AsyncSchedulingDisabled", message=REAL[0][1])]
    value, reason, message = reconcile.conditions_for(done.model_copy(update={"degradations": found}))[
        "SpeculationDegraded"
    ]
    assert (value, reason) == ("True", "AsyncSchedulingDisabled")
    assert message == f"AsyncSchedulingDisabled: {REAL[0][1]}"


def test_the_simulators_spec_field_offers_exactly_the_kinds() -> None:
    field = SimulatorSpec.model_fields["log_degradations"]
    (literal,) = typing.get_args(field.annotation)
    assert set(typing.get_args(literal)) == {k.value for k in Kind}


def test_the_load_starts_with_the_treatment_s_degradations_a_condition_and_a_warning() -> None:
    found = [Degradation(kind="MethodFallback", message=REAL[5][1])]
    observed = Observed(arms=ready_arms(), hosts=hosts(), degradations=found)
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), observed, T0 + timedelta(seconds=5))
    assert decision.status.phase is Phase.RUNNING and decision.status.degradations == found
    degraded = condition(decision.status, "SpeculationDegraded")
    assert (degraded.status, degraded.reason) == ("True", "MethodFallback")
    assert ("Warning", "SpeculationDegraded") in [(e.type, e.reason) for e in decision.events]
    # Carried through the later phases, condition included.
    later = reconcile.decide(
        subject(), decision.status, Observed(arms=ready_arms()), T0 + timedelta(seconds=6)
    )
    assert (
        later.status.degradations == found and condition(later.status, "SpeculationDegraded").status == "True"
    )


@pytest.mark.parametrize("read", [[], None], ids=["clean log", "log not readable"])
def test_a_clean_or_unreadable_log_starts_the_load_without_the_condition(
    read: list[Degradation] | None,
) -> None:
    observed = Observed(arms=ready_arms(), hosts=hosts(), degradations=read)
    decision = reconcile.decide(subject(), at(Phase.DEPLOYING), observed, T0 + timedelta(seconds=5))
    assert decision.status.phase is Phase.RUNNING and decision.status.degradations == []
    assert all(c.type != "SpeculationDegraded" for c in decision.status.conditions)
    assert [e.type for e in decision.events] == ["Normal"]
