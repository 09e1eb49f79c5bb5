"""Trace replay (issue 17): the JSONL trace format, its send times and the built-in `bursty` trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specdecode.controller import handlers
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import spec, validation
from specdecode.loadgen import plan, trace, workload
from tests.factories import ROOT, experiment_document

EXAMPLE_TRACE = ROOT / "examples" / "trace-replay.jsonl"


def _trace(*records: dict[str, Any]) -> str:
    return "\n".join(json.dumps(r) for r in records)


def _spec(dataset: dict[str, Any], **workload_fields: Any) -> spec.ExperimentSpec:
    wl: dict[str, Any] = {
        "dataset": dataset,
        "stages": [{"name": "slow", "rate": 2.0}, {"name": "fast", "rate": 8.0}],
        "requestsPerStage": 40,
        "warmupRequests": 3,
    }
    wl.update(workload_fields)
    return spec.ExperimentSpec.model_validate(
        {"model": "m", "speculative": {"method": "ngram", "numSpeculativeTokens": 3}, "workload": wl}
    )


def test_a_trace_record_gives_the_prompt_or_its_length_the_output_length_and_an_optional_session() -> None:
    text = _trace(
        {"timestamp": 10.0, "promptTokens": 100, "outputTokens": 20, "sessionId": "u1"},
        {"timestamp": 10.5, "prompt": "Say hi.", "outputTokens": 7},
    )
    t = trace.read_trace(text + "\n\n", source="t.jsonl")
    assert [(r.line, r.timestamp, r.prompt_tokens, r.prompt, r.output_tokens) for r in t.records] == [
        (1, 10.0, 100, None, 20),
        (2, 10.5, None, "Say hi.", 7),
    ]
    assert [r.prompt_id for r in t.records] == ["u1:1", "trace:2"]
    assert t.span == 0.5
    assert t.duration == 1.0  # the span plus one mean gap
    assert t.rate == 2.0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"timestamp": 0, "promptTokens": 8, "outputTokens": 4}', "{oops"], "t.jsonl:2: not JSON"),
        (['{"promptTokens": 8, "outputTokens": 4}'], "t.jsonl:1: 'timestamp' is missing"),
        (
            ['{"timestamp": "0", "promptTokens": 8, "outputTokens": 4}'],
            "t.jsonl:1: 'timestamp' must be a number",
        ),
        (
            [
                '{"timestamp": 2, "promptTokens": 8, "outputTokens": 4}',
                "",
                '{"timestamp": 1, "prompt": "x", "outputTokens": 4}',
            ],
            "t.jsonl:3: 'timestamp' 1 is before line 1's 2; timestamps must be non-decreasing",
        ),
        (
            ['{"timestamp": 0, "outputTokens": 4}'],
            "t.jsonl:1: needs exactly one of 'prompt' or 'promptTokens'",
        ),
        (
            ['{"timestamp": 0, "prompt": "x", "promptTokens": 3, "outputTokens": 4}'],
            "t.jsonl:1: needs exactly one of 'prompt' or 'promptTokens'",
        ),
        (
            ['{"timestamp": 0, "promptTokens": 0, "outputTokens": 4}'],
            "t.jsonl:1: 'promptTokens' must be a whole number",
        ),
        (['{"timestamp": 0, "promptTokens": 8}'], "t.jsonl:1: 'outputTokens' is missing"),
        (
            ['{"timestamp": 0, "promptTokens": 8, "outputTokens": 2.5}'],
            "t.jsonl:1: 'outputTokens' must be a whole number",
        ),
        (
            ['{"timestamp": 0, "promptTokens": 8, "output_tokens": 4}'],
            "t.jsonl:1: unknown field 'output_tokens' (a trace record has timestamp, prompt, promptTokens",
        ),
        (["[1, 2]"], "t.jsonl:1: expected an object"),
        (
            ['{"timestamp": 0, "promptTokens": 8, "outputTokens": 4}'],
            "t.jsonl: a trace needs at least two records (it has 1)",
        ),
        (
            ['{"timestamp": 3, "promptTokens": 8, "outputTokens": 4}'] * 2,
            "t.jsonl: every 'timestamp' is 3; a trace must span time",
        ),
    ],
)
def test_a_bad_trace_is_refused_naming_the_line_and_the_field(lines: list[str], message: str) -> None:
    with pytest.raises(workload.DatasetError) as info:
        trace.read_trace("\n".join(lines), source="t.jsonl")
    assert str(info.value).startswith(message), str(info.value)


def test_send_times_are_the_trace_s_gaps_scaled_to_the_stage_rate_and_repeat_past_its_end() -> None:
    t = trace.read_trace(
        _trace(*({"timestamp": ts, "promptTokens": 8, "outputTokens": 4} for ts in (5.0, 5.0, 6.0, 8.0))),
        source="t",
    )
    assert t.duration == pytest.approx(3.0 + 1.0)  # span 3 s + mean gap 1 s: 4 records per 4 s
    assert t.rate == pytest.approx(1.0)
    assert t.offsets(4, rate=1.0) == pytest.approx([0.0, 0.0, 1.0, 3.0])  # as recorded
    assert t.time_scale(2.0) == pytest.approx(0.5)
    assert t.offsets(6, rate=2.0) == pytest.approx([0.0, 0.0, 0.5, 1.5, 2.0, 2.0])  # twice as fast, wrapped
    long = t.offsets(400, rate=4.0)
    assert long == sorted(long)
    assert long[396] == pytest.approx(99.0)  # the 100th pass starts after 99 cycles of 4 s / 4


def test_the_builtin_bursty_trace_is_deterministic_in_the_seed_and_has_bursts_and_idle_gaps() -> None:
    a, b, other = trace.bursty(42), trace.bursty(42), trace.bursty(43)
    assert a == b
    assert a.records != other.records
    gaps = [y.timestamp - x.timestamp for x, y in zip(a.records, a.records[1:], strict=False)]
    idle = [g for g in gaps if g >= trace.IDLE_S[0]]
    assert len(idle) == trace.BURSTS - 1  # exactly one idle gap between consecutive bursts
    inside = sorted(g for g in gaps if g < trace.IDLE_S[0])
    assert inside[len(inside) // 2] < 0.2  # within a burst, requests come tens of milliseconds apart
    assert all(r.prompt_tokens and r.output_tokens for r in a.records)
    assert len({r.session_id for r in a.records}) == trace.BURSTS


def test_both_arms_get_the_same_requests_on_the_same_schedule_and_every_stage_replays_the_trace(
    tmp_path: Path,
) -> None:
    s = _spec({"type": "trace", "builtin": "bursty"})
    first = plan.plan_from_spec(s, tmp_path, salt="x")
    again = plan.plan_from_spec(s, tmp_path, salt="x")  # one GPU: each arm's run plans it again
    assert first.stages == again.stages
    bursty = trace.bursty(s.engine.seed)
    by_name = {sp.name: sp for sp in first.stages}
    slow, fast = by_name["slow"], by_name["fast"]
    assert slow.offsets is not None and fast.offsets is not None
    assert slow.offsets == pytest.approx(tuple(bursty.offsets(40, rate=2.0)))
    # the same shape at 4x the speed
    assert fast.offsets == pytest.approx(tuple(o / 4.0 for o in slow.offsets))
    for sp in (slow, fast):
        bodies = [json.loads(r.body) for r in sp.requests]
        assert [b["max_tokens"] for b in bodies] == [r.output_tokens for r in bursty.records[:40]]
        assert [r.prompt_id for r in sp.requests] == [r.prompt_id for r in bursty.records[:40]]
    assert first.stages[0].warmup and first.stages[0].concurrency is not None  # warm-up stays closed loop
    described = first.description["dataset"]
    assert isinstance(described, dict)
    assert described["trace"]["timeScale"] == {
        "slow": pytest.approx(bursty.rate / 2.0, rel=1e-5),
        "fast": pytest.approx(bursty.rate / 8.0, rel=1e-5),
    }
    assert first.description["arrival"] == "trace"


def test_a_trace_file_s_prompt_text_or_length_becomes_the_request_body(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(
        _trace(
            {"timestamp": 0, "prompt": "Tell me a story.", "outputTokens": 9},
            {"timestamp": 1, "promptTokens": 50, "outputTokens": 3},
        )
    )
    p = plan.plan_from_spec(
        _spec(
            {"type": "trace", "path": "t.jsonl"},
            stages=[{"name": "c2", "concurrency": 2}],
            requestsPerStage=4,
        ),
        tmp_path,
        salt="y",
    )
    measured = [sp for sp in p.stages if not sp.warmup]
    assert [sp.name for sp in measured] == ["c2"]
    assert measured[0].offsets is None  # a closed-loop stage sends the trace's requests without its timing
    bodies = [json.loads(r.body) for r in measured[0].requests]
    assert [b["max_tokens"] for b in bodies] == [9, 3, 9, 3]
    assert bodies[0]["prompt"].endswith("] Tell me a story.")
    assert 45 <= len(bodies[1]["prompt"].split()) <= 50  # the nonce (~4 tokens) + filler
    assert len({b["prompt"] for b in bodies}) == 4  # a unique nonce each


def test_the_example_trace_file_parses() -> None:
    t = trace.read_trace(EXAMPLE_TRACE.read_text(), source=str(EXAMPLE_TRACE))
    assert len(t.records) >= 10
    assert any(r.prompt is not None for r in t.records) and any(r.prompt_tokens for r in t.records)


def test_a_trace_dataset_needs_exactly_one_source_and_no_arrival_process() -> None:
    for bad in ({"type": "trace"}, {"type": "trace", "builtin": "bursty", "path": "t.jsonl"}):
        with pytest.raises(ValidationError, match="exactly one of configMap, path or builtin"):
            _spec(bad)
    s = _spec({"type": "trace", "builtin": "bursty"}, arrival="gamma")
    problems = validation.check_workload(s.workload)
    assert [(p.path, p.message) for p in problems] == [
        ("spec.workload.arrival", "does not apply to a trace dataset: the trace sets the send times")
    ]


def test_a_config_map_trace_is_read_from_the_mounted_dataset_file(tmp_path: Path) -> None:
    mounted = tmp_path / "prompts.jsonl"
    mounted.write_text(EXAMPLE_TRACE.read_text())
    s = _spec({"type": "trace", "configMap": {"name": "traces", "key": "t.jsonl"}})
    with pytest.raises(workload.DatasetError, match="needs --dataset-file"):
        plan.plan_from_spec(s, tmp_path, salt="z")
    p = plan.plan_from_spec(s, tmp_path, salt="z", dataset_file=mounted)
    expected = trace.read_trace(EXAMPLE_TRACE.read_text(), source="x")
    slow = next(sp for sp in p.stages if sp.name == "slow")
    assert slow.offsets == pytest.approx(tuple(expected.offsets(40, rate=2.0)))


@pytest.mark.parametrize(
    ("kind", "stage", "builtin", "why"),
    [
        ("trace", {"name": "r2", "rate": 2}, "bursty", validation.TRACE_PATH_LOCAL_ONLY),
        # multi-turn sessions (closed loop): the same rule for their conversations file
        (
            "multiTurn",
            {"name": "c2", "concurrency": 2},
            "conversations",
            validation.CONVERSATIONS_PATH_LOCAL_ONLY,
        ),
    ],
)
def test_the_operator_refuses_a_trace_or_conversations_by_path_and_runs_them_from_a_config_map_or_builtin(
    kind: str, stage: dict[str, Any], builtin: str, why: str
) -> None:
    def subject(dataset: dict[str, Any]) -> Any:
        wl = {"dataset": dataset, "stages": [stage]}
        return handlers._subject("exp", 1, experiment_document(workload=wl), OperatorSettings())

    refused = subject({"type": kind, "path": "t.jsonl"})
    assert refused.spec is None
    assert refused.problems == [f"spec.workload.dataset.path: {why}"]
    assert subject({"type": kind, "configMap": {"name": "traces", "key": "t.jsonl"}}).spec is not None
    assert subject({"type": kind, "builtin": builtin}).spec is not None


def test_send_times_count_from_the_trace_s_first_record() -> None:
    """The first request leaves at once, whatever the trace's first timestamp (mutation benchmark
    survivor in trace: the gaps counted from the second record)."""
    t = trace.read_trace(
        _trace(*({"timestamp": ts, "promptTokens": 8, "outputTokens": 4} for ts in (100.0, 101.0, 103.0))),
        source="t",
    )
    assert t.offsets(3, rate=t.rate) == pytest.approx([0.0, 1.0, 3.0])
