"""Multi-turn sessions (issue 17): the conversations format, the built-in set, the spec and its
validation, and the plan: one paired request per turn, whole sessions, a nonce per session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specdecode.experiment import manifests, spec, validation
from specdecode.loadgen import plan, sessions, workload
from tests.factories import ROOT, experiment_document

EXAMPLE = ROOT / "examples" / "multi-turn.jsonl"

TRIP = {
    "id": "trip",
    "category": "chat",
    "messages": [
        {"role": "system", "content": "You plan trips."},
        {"role": "user", "content": "Four days in Lisbon?"},
        {"role": "assistant", "content": "Alfama, Belem, Sintra."},
        {"role": "user", "content": "How do I get to Sintra?"},
        {"role": "assistant", "content": "The train from Rossio."},
        {"role": "user", "content": "Stay overnight?"},
    ],
}


def _spec(dataset: dict[str, Any], **workload_fields: Any) -> spec.ExperimentSpec:
    """Two closed-loop stages of 10 turns over `dataset`, 3 warm-up requests (`workload_fields` replace)."""
    stages = [{"name": "c2", "concurrency": 2}, {"name": "c4", "concurrency": 4}]
    wl = {
        "dataset": dataset,
        "stages": stages,
        "requestsPerStage": 10,
        "warmupRequests": 3,
        **workload_fields,
    }
    return spec.ExperimentSpec.model_validate(experiment_document(workload=wl)["spec"])


def _messages(req: workload.PreparedRequest) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = json.loads(req.body)["messages"]
    return messages


def test_each_user_message_is_a_turn_that_carries_every_earlier_message() -> None:
    [conv] = sessions.read_conversations(json.dumps(TRIP), source="c.jsonl")
    assert (conv.id, conv.category, conv.turns) == ("trip", "chat", 3)
    assert conv.history(1) == TRIP["messages"][:2]
    assert conv.history(3) == TRIP["messages"]
    with pytest.raises(IndexError):
        conv.history(4)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1]", "c.jsonl:1: expected an object"),
        ('{"messages": []}', "'messages' must be a non-empty list"),
        (
            '{"messages": [{"role": "bot", "content": "x"}]}',
            "messages[0] must be {role: system|user|assistant",
        ),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}',
            "messages[1] is 'user' where 'assistant' is due",
        ),
        ('{"messages": [{"role": "system", "content": "s"}]}', "has no user message"),
        ('{"prompt": "x", "messages": [{"role": "user", "content": "a"}]}', "unknown field 'prompt'"),
    ],
)
def test_a_bad_conversation_is_refused_naming_the_line(line: str, message: str) -> None:
    with pytest.raises(workload.DatasetError, match=message.replace("[", r"\[").replace("|", r"\|")):
        sessions.read_conversations(line, source="c.jsonl")


def test_the_builtin_set_and_the_example_file_hold_conversations_of_three_to_five_turns() -> None:
    builtin = sessions.builtin("conversations")
    assert len(builtin) == 16
    assert all(3 <= c.turns <= 5 for c in builtin)
    assert len({c.id for c in builtin}) == 16
    assert sessions.read_conversations(EXAMPLE.read_text(), source=str(EXAMPLE))


def test_a_stage_is_whole_sessions_in_order_with_one_nonce_per_session_and_the_same_bytes_for_both_arms(
    tmp_path: Path,
) -> None:
    (tmp_path / "c.jsonl").write_text(json.dumps(TRIP) + "\n")
    s = _spec({"type": "multiTurn", "path": "c.jsonl"}, requestsPerStage=7, warmupRequests=0)
    first = plan.plan_from_spec(s, tmp_path, salt="x")
    again = plan.plan_from_spec(s, tmp_path, salt="x")  # one GPU: each arm's run plans it again
    assert first.stages == again.stages
    c2 = first.stages[0]
    assert (c2.name, c2.concurrency, len(c2.requests)) == ("c2", 2, 7)  # `requests` counts turns
    # sessions of 3 turns, the last cut at the stage's bound
    assert c2.sessions == [[0, 1, 2], [3, 4, 5], [6]]
    assert [(r.session, r.turn, r.prompt_id) for r in c2.requests[:4]] == [
        (0, 1, "trip#1"),
        (0, 2, "trip#2"),
        (0, 3, "trip#3"),
        (1, 1, "trip#1"),
    ]
    turns = [_messages(r) for r in c2.requests]
    nonce = workload.nonce("x", "c2", 0)
    # turn k = turn k-1's messages, the dataset's reply, the next user message; one prefix per session
    assert turns[1][: len(turns[0])] == turns[0] and turns[2][: len(turns[1]) + 1] == turns[1] + [
        TRIP["messages"][2 + 2]
    ]
    assert turns[0][0]["content"] == nonce + "You plan trips."
    assert all(t[0]["content"].startswith(nonce) for t in turns[:3])
    assert turns[3][0]["content"] == workload.nonce("x", "c2", 1) + "You plan trips."
    assert all(r.path == workload.CHAT for r in c2.requests)
    assert first.description["dataset"]["sessions"] == {
        "conversations": 1,
        "meanTurns": 3.0,
        "prefixCaching": True,
    }


def test_warm_up_takes_whole_conversations_the_stages_do_not_use() -> None:
    s = _spec({"type": "multiTurn", "builtin": "conversations"}, warmupRequests=8)
    p = plan.plan_from_spec(s, Path(), salt="y")
    warm = p.stages[0]
    assert warm.name == plan.WARMUP and warm.warmup and warm.sessions is not None
    warm_ids = {r.prompt_id.split("#")[0] for r in warm.requests}
    measured = [sp for sp in p.stages if not sp.warmup]
    assert [sp.name for sp in measured] == ["c2", "c4"]
    for sp in measured:
        assert not warm_ids & {r.prompt_id.split("#")[0] for r in sp.requests}
        assert len(sp.requests) == 10
    # a stage at a new concurrency opens with a warm-up round of that many sessions (of a mean length)
    warm_c4 = next(sp for sp in p.stages if sp.name == "warmup-c4")
    assert warm_c4.sessions is not None and len(warm_c4.sessions) >= 4


def test_a_multi_turn_dataset_needs_one_source_and_closed_loop_stages() -> None:
    for bad in ({"type": "multiTurn"}, {"type": "multiTurn", "builtin": "conversations", "path": "c.jsonl"}):
        with pytest.raises(ValidationError, match="exactly one of configMap, path or builtin"):
            _spec(bad)
    s = _spec(
        {"type": "multiTurn", "builtin": "conversations"},
        stages=[{"name": "c2", "concurrency": 2}, {"name": "r2", "rate": 2}],
        search={"rate": {"from": 1, "to": 4}},
    )
    problems = validation.check_workload(s.workload)
    assert [(p.path, p.message) for p in problems] == [
        ("spec.workload.stages[1].rate", validation.MULTI_TURN_CLOSED_LOOP),
        ("spec.workload.search.rate", validation.MULTI_TURN_CLOSED_LOOP),
    ]
    assert "set concurrency, the number of sessions in flight" in validation.MULTI_TURN_CLOSED_LOOP


def test_both_arms_run_with_prefix_caching_on_for_sessions_and_off_otherwise() -> None:
    sessions_spec = _spec({"type": "multiTurn", "builtin": "conversations"})
    plain = _spec({"type": "builtin"})
    assert sessions_spec.prefix_caching and not sessions_spec.engine.prefix_caching
    for arm in spec.Arm:
        argv = manifests.serve_args(sessions_spec, arm)
        assert "--enable-prefix-caching" in argv and "--no-enable-prefix-caching" not in argv
        assert "--no-enable-prefix-caching" in manifests.serve_args(plain, arm)


def test_a_config_map_of_conversations_is_read_from_the_mounted_dataset_file(tmp_path: Path) -> None:
    mounted = tmp_path / "prompts.jsonl"
    mounted.write_text(json.dumps(TRIP) + "\n")
    s = _spec({"type": "multiTurn", "configMap": {"name": "chats", "key": "c.jsonl"}}, warmupRequests=0)
    with pytest.raises(workload.DatasetError, match="needs --dataset-file"):
        plan.plan_from_spec(s, tmp_path, salt="z")
    p = plan.plan_from_spec(s, tmp_path, salt="z", dataset_file=mounted)
    assert {r.prompt_id for r in p.stages[0].requests} == {"trip#1", "trip#2", "trip#3"}


def test_a_stage_takes_the_fewest_whole_conversations_that_hold_its_turns() -> None:
    """Conversations of 2, 3 and 4 user turns: 5 turns need the first two, 6 the first three, 2 the
    first one (mutation benchmark survivor in sessions: the count started at 0)."""

    def conversation(turns: int) -> sessions.Conversation:
        messages = tuple(
            m
            for i in range(turns)
            for m in ({"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"})
        )
        return sessions.Conversation(id=f"c{turns}", messages=messages)

    convs = [conversation(2), conversation(3), conversation(4)]
    assert [sessions.covering(convs, n) for n in (1, 2, 3, 5, 6, 9, 50)] == [1, 1, 2, 2, 3, 3, 3]
