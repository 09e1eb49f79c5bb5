"""Pure parts of the load generator: schedule, workload, SSE and HTTP framing, derived metrics, scraping."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from specdecode.experiment import records, spec, verdict
from specdecode.loadgen import (
    command,
    connection,
    eventloop,
    http,
    pacer,
    plan,
    recording,
    runner,
    schedule,
    scrape,
    sse,
    stamping,
    summary,
    workload,
)
from specdecode.loadgen.recording import diverges_at

# ------------------------------------------------------------------------------------------ schedule


def test_poisson_inter_arrival_times_pass_a_kolmogorov_smirnov_test() -> None:
    rate = 25.0
    gaps = schedule.gaps("poisson", rate, 2000, seed=7, stage="mid")
    result = stats.kstest(gaps, "expon", args=(0, 1 / rate))
    assert result.pvalue > 0.01
    assert sum(gaps) / len(gaps) == pytest.approx(1 / rate, rel=0.1)


def test_gamma_inter_arrival_times_follow_the_gamma_law_with_the_given_burstiness() -> None:
    rate, burstiness = 10.0, 0.5
    gaps = schedule.gaps("gamma", rate, 2000, seed=3, stage="s", burstiness=burstiness)
    result = stats.kstest(gaps, "gamma", args=(burstiness, 0, 1 / (rate * burstiness)))
    assert result.pvalue > 0.01


def test_constant_arrivals_are_evenly_spaced_and_schedules_are_reproducible() -> None:
    assert schedule.offsets("constant", 4.0, 3, seed=1, stage="a") == [0.25, 0.5, 0.75]
    a = schedule.offsets("poisson", 4.0, 50, seed=1, stage="a")
    assert a == schedule.offsets("poisson", 4.0, 50, seed=1, stage="a")
    assert a != schedule.offsets("poisson", 4.0, 50, seed=1, stage="b")
    assert a == sorted(a)


# ------------------------------------------------------------------------------------------ workload


def _spec(**workload_fields: Any) -> spec.ExperimentSpec:
    wl: dict[str, Any] = {"stages": [{"name": "a", "rate": 2.0}, {"name": "b", "concurrency": 2}]}
    wl.update(workload_fields)
    return spec.ExperimentSpec.model_validate(
        {"model": "m", "speculative": {"method": "ngram", "numSpeculativeTokens": 3}, "workload": wl}
    )


def _bodies(p: plan.Plan) -> list[dict[str, Any]]:
    return [json.loads(r.body) for sp in p.stages for r in sp.requests]


def test_synthetic_requests_are_greedy_streamed_with_usage_and_unique_nonce_prefixes() -> None:
    p = plan.plan_from_spec(
        _spec(
            dataset={"type": "synthetic", "inputTokens": 64, "outputTokens": 16},
            requestsPerStage=30,
            warmupRequests=5,
        ),
        Path(),
        salt="s1",
    )
    bodies = _bodies(p)
    assert len(bodies) == 5 + 30 + 2 + 30  # warm-up, a, b's warm-up round (2 requests), b
    for b in bodies:
        assert b["temperature"] == 0.0 and b["max_tokens"] == 16 and b["ignore_eos"] is True
        assert b["stream"] is True
        assert b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert isinstance(b["seed"], int)
        assert "min_p" not in b and "logit_bias" not in b
        assert 50 <= len(b["prompt"].split()) <= 70
    prefixes = {b["prompt"].split()[0] for b in bodies}
    assert len(prefixes) == len(bodies)  # no two requests share a first prefix-cache block
    salted = _bodies(plan.plan_from_spec(_spec(requestsPerStage=30, warmupRequests=5), Path(), salt="s2"))
    assert {b["prompt"].split()[0] for b in salted}.isdisjoint(prefixes)


def test_a_stage_may_set_its_own_lengths_identically_for_both_arms() -> None:
    s = _spec(
        stages=[
            {"name": "short", "concurrency": 2},
            {"name": "long", "concurrency": 2, "inputTokens": 400, "outputTokens": 8},
        ],
        dataset={"type": "synthetic", "inputTokens": 64, "outputTokens": 16},
        requestsPerStage=10,
        warmupRequests=2,
    )
    p = plan.plan_from_spec(s, Path(), salt="x")
    by_stage = {sp.name: [json.loads(r.body) for r in sp.requests] for sp in p.stages}
    assert [len(b["prompt"].split()) for b in by_stage["short"]] == [
        61
    ] * 10  # the nonce word + 60 filler words
    assert {b["max_tokens"] for b in by_stage["short"]} == {16}
    assert [len(b["prompt"].split()) for b in by_stage["long"]] == [397] * 10
    assert {b["max_tokens"] for b in by_stage["long"]} == {8}
    assert p.description["dataset"] == {
        "type": "synthetic",
        "inputTokens": 64,
        "outputTokens": 16,
        "stages": {"long": {"inputTokens": 400, "outputTokens": 8}},
    }
    # each arm plans the run again: the same bodies for the same salt
    again = plan.plan_from_spec(s, Path(), salt="x")
    assert [r.body for sp in again.stages for r in sp.requests] == [
        r.body for sp in p.stages for r in sp.requests
    ]


def test_the_builtin_mixed_set_has_four_categories_and_warmup_prompts_disjoint_from_measured_ones() -> None:
    items = workload.builtin("mixed")
    assert {i.category for i in items} == {"chat", "code", "summarisation", "math"}
    assert len(items) >= 40
    p = plan.plan_from_spec(
        _spec(dataset={"type": "builtin"}, requestsPerStage=40, warmupRequests=10), Path(), salt="x"
    )
    warm = {r.prompt_id for r in p.stages[0].requests}
    measured = {r.prompt_id for sp in p.stages if not sp.warmup for r in sp.requests}
    assert p.stages[0].warmup and len(warm) == 10 and warm.isdisjoint(measured)
    for r in p.stages[1].requests:
        body = json.loads(r.body)
        assert r.path == workload.CHAT and body["messages"][0]["content"].startswith("[")


def test_a_closed_loop_stage_at_a_new_concurrency_opens_with_a_warm_up_round() -> None:
    """Real vLLM paid ~300 ms TTFT on the first round at a batch size it had not run (real-gpu README)."""
    stages = [
        {"name": "c1", "concurrency": 1},
        {"name": "c4", "concurrency": 4},
        {"name": "again", "concurrency": 4},
        {"name": "open", "rate": 3.0},
        {"name": "c4b", "concurrency": 4},
    ]
    p = plan.plan_from_spec(_spec(stages=stages, requestsPerStage=20, warmupRequests=4), Path(), salt="w")
    assert [(sp.name, sp.warmup, sp.concurrency, len(sp.requests)) for sp in p.stages] == [
        ("warmup", True, 4, 4),
        ("warmup-c1", True, 1, 1),
        ("c1", False, 1, 20),
        ("warmup-c4", True, 4, 4),
        ("c4", False, 4, 20),
        ("again", False, 4, 20),  # the same batch size as just before: no round
        ("open", False, None, 20),
        ("warmup-c4b", True, 4, 4),  # after an open-loop stage the batch size is unknown
        ("c4b", False, 4, 20),
    ]
    none = plan.plan_from_spec(_spec(stages=stages, requestsPerStage=20, warmupRequests=0), Path(), salt="w")
    assert not any(sp.warmup for sp in none.stages)


def test_jsonl_prompt_files_accept_prompt_or_messages_and_name_the_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "p.jsonl"
    good.write_text(
        '{"prompt": "hi", "category": "chat"}\n\n{"messages": [{"role": "user", "content": "x"}]}\n'
    )
    items = workload.read_jsonl(good.read_text(), source=str(good))
    assert [i.category for i in items] == ["chat", None] and items[1].messages is not None
    with pytest.raises(workload.DatasetError, match=r"p.jsonl:2: needs exactly one"):
        workload.read_jsonl('{"prompt": "a"}\n{"prompt": "a", "messages": []}\n', source="p.jsonl")
    with pytest.raises(workload.DatasetError, match="not JSON"):
        workload.read_jsonl("{oops\n", source="p.jsonl")


# ------------------------------------------------------------------------------------------ SSE


def _chunk(text: str, tokens: int, finish: str | None = None) -> bytes:
    obj = {
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens},
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_events_are_stamped_at_the_arrival_of_their_first_byte() -> None:
    one, two, three = _chunk("a", 1), _chunk(" b c", 3), _chunk(" d", 4, "length")
    pieces = [(1.0, one + two[:10]), (2.0, two[10:]), (3.0, three + b"data: [DONE]\n\n")]
    events = sse.split_events(pieces)
    assert [t for t, _ in events] == [1.0, 1.0, 3.0, 3.0]
    stream = sse.parse(events)
    assert stream.token_events == [(1.0, 1), (1.0, 3), (3.0, 4)]
    assert stream.text == "a b c d" and stream.completion_tokens == 4 and stream.done
    assert stream.finish_reason == "length" and stream.token_source == "usage"


def test_crlf_framing_comments_and_the_usage_chunk_with_spec_decode_metrics_are_understood() -> None:
    spec_metrics = {"mean_acceptance_length": 2.5, "num_spec_steps": 2}
    usage_chunk = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    usage_chunk["metrics"] = {"speculative_decoding": spec_metrics}
    body = (
        b": keep-alive\r\n\r\n"
        + _chunk("x", 2).replace(b"\n\n", b"\r\n\r\n")
        + b"data: "
        + json.dumps(usage_chunk).encode()
        + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    )
    stream = sse.parse(sse.split_events([(0.5, body)]))
    assert stream.token_events == [(0.5, 2)]
    assert stream.metrics == {"speculative_decoding": spec_metrics}


def test_without_continuous_usage_each_content_event_counts_one_token_and_says_so() -> None:
    chat = [{"choices": [{"delta": {"content": w}}]} for w in ("a", "b", "c")]  # no usage on chunks
    final = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 5}}
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in [*chat, final])
    events = sse.split_events([(1.0, raw)])
    stream = sse.parse(events)
    assert stream.token_source == "chunks"
    assert [n for _, n in stream.token_events] == [1, 2, 5]
    assert stream.completion_tokens == 5


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"data: {nope\n\n", sse.MalformedStreamError),
        (b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n', sse.StreamErrorEvent),
        (b"data: [DONE]\n\ndata: {}\n\n", sse.MalformedStreamError),
        (b"hello: world\n\n", sse.MalformedStreamError),
    ],
)
def test_malformed_streams_and_error_events_raise_their_own_class(
    body: bytes, error: type[Exception]
) -> None:
    with pytest.raises(error):
        sse.parse(sse.split_events([(0.0, body)]))


def test_a_stream_cut_inside_an_event_is_malformed() -> None:
    with pytest.raises(sse.MalformedStreamError):
        sse.split_events([(0.0, _chunk("a", 1)[:-3])])


# ------------------------------------------------------------------------------------------ HTTP


class _Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _feed(pieces: list[bytes]) -> connection.Response:
    async def main() -> connection.Response:
        conn = connection.Connection()
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        fut = conn.start(b"GET / HTTP/1.1\r\n\r\n")
        for p in pieces:
            conn.data_received(p)
        assert fut.done() and conn.reusable
        resp = fut.result()
        resp.decode()
        return resp

    return asyncio.run(main())


def test_chunked_bodies_are_decoded_across_arbitrary_read_boundaries() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n"
    )
    for cut in range(1, len(raw)):
        resp = _feed([raw[:cut], raw[cut:]])
        assert resp.status == 200 and resp.body == b"hello, world"
    resp = _feed([raw[i : i + 1] for i in range(len(raw))])
    assert resp.body == b"hello, world"


def test_content_length_bodies_complete_without_closing() -> None:
    resp = _feed([b"HTTP/1.1 500 Oops\r\ncontent-length: 4\r\n\r\nfa", b"il"])
    assert resp.status == 500 and resp.body == b"fail" and resp.first_byte is not None


def test_a_response_head_of_a_few_kib_arriving_in_pieces_is_read() -> None:
    """Servers behind proxies send heads of several KiB (cookies, tracing headers); only a head past
    64 KiB is refused (mutation benchmark survivor: the limit as 64 + 1024 bytes)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n" + b"x-trace: " + b"a" * 8000 + b"\r\n\r\n"
    resp = _feed([head[:4000], head[4000:], b"ok"])
    assert resp.status == 200 and resp.body == b"ok"


def test_request_bytes_carry_host_length_and_the_base_path() -> None:
    origin = http.Origin.parse("http://vllm.llm.svc:8000/base/")
    raw = http.request_bytes(origin, "POST", "/v1/completions", {"x-request-id": "r1"}, b"{}")
    assert raw.startswith(b"POST /base/v1/completions HTTP/1.1\r\nHost: vllm.llm.svc:8000\r\n")
    assert b"Content-Length: 2\r\n" in raw and raw.endswith(b"\r\n\r\n{}")
    with pytest.raises(ValueError):
        http.Origin.parse("ftp://x")


# ------------------------------------------------------------------------------------------ metrics


def test_ttft_and_tpot_follow_the_design_definitions() -> None:
    rec = records.RequestRecord(
        stage="s",
        index=0,
        arm="control",
        ok=True,
        intended=0.990,
        sent=1.000,
        first_token=1.050,
        end=1.400,
        events=[(1.050, 1), (1.150, 3), (1.350, 5)],
        completion_tokens=5,
    )
    d = summary.derive(rec)
    assert d.ttft_ms == pytest.approx(50.0)
    assert d.ttft_from_intended_ms == pytest.approx(60.0)
    assert d.schedule_lag_ms == pytest.approx(10.0)
    assert d.tpot_ms == pytest.approx(300.0 / 4)
    assert d.e2e_ms == pytest.approx(400.0)
    per_event, per_token, tpe = summary._itl([d])
    assert per_event == pytest.approx([100.0, 200.0])
    assert per_token == pytest.approx([50.0, 50.0, 100.0, 100.0])
    assert tpe == [1.0, 2.0, 2.0]


def test_divergence_is_the_first_differing_character() -> None:
    assert diverges_at("abc", "abc") is None
    assert diverges_at("abc", "abd") == 2
    assert diverges_at("ab", "abc") == 2
    assert diverges_at(None, "a") is None


METRICS = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""


def test_scraped_counters_are_summed_over_labels_and_differenced_per_window() -> None:
    before = scrape.parse(METRICS)
    after = scrape.parse(METRICS.replace(" 10.0", " 25.0").replace(" 8.0", " 20.0").replace(" 7.0", " 17.0"))
    m = scrape.delta(before, after, kv_max=0.5)
    assert m.num_drafts == 15.0
    assert m.accepted_per_position == [12.0, 0.0]
    assert m.requests_success == 10.0
    assert m.num_draft_tokens is None and m.kv_cache_usage_max == 0.5
    assert scrape.delta(None, after, None).num_drafts is None


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf"])
def test_a_nan_or_infinite_counter_is_unknown_and_never_differenced(bad: str) -> None:
    """#36: NaN in an arm's /metrics crashed `run --local` (round(nan) in the acceptance counts)."""
    before = scrape.parse(METRICS)
    after = scrape.parse(
        METRICS.replace(" 10.0", f" {bad}").replace(" 8.0", f" {bad}").replace(" 0.25", f" {bad}")
    )
    assert after.unusable == {scrape.DRAFTS, scrape.ACCEPTED_PER_POS, scrape.KV_USAGE}
    m = scrape.delta(before, after, kv_max=None)
    assert m.num_drafts is None and m.accepted_per_position == []
    assert m.requests_success == 0.0  # the finite counters are still read
    kv: dict[spec.Arm, float] = {}
    scrape.note_kv_usage({spec.Arm.TREATMENT: after}, kv)
    assert kv == {}


def test_a_counter_that_went_down_is_unknown_over_the_window() -> None:
    """The server restarted between the scrapes: its counters began again, a delta would be negative."""
    before = scrape.parse(METRICS)
    after = scrape.parse(METRICS.replace(" 10.0", " 3.0"))
    assert scrape.delta(before, after, None).num_drafts is None
    assert scrape.delta(before, after, None).requests_success == 0.0


@pytest.mark.parametrize("field", ["num_drafts", "kv_cache_usage_max", "generation_tokens"])
def test_server_metrics_hold_no_nan_or_infinity_whatever_wrote_them(field: str) -> None:
    """A windows.json written from a garbage scrape (or by hand) reads back unknown, not NaN."""
    doc = {
        field: float("nan"),
        "requests_success": float("inf"),
        "accepted_per_position": [1.0, float("nan")],
    }
    m = records.ArmServerMetrics.model_validate(doc)
    assert getattr(m, field) is None and m.requests_success is None and m.accepted_per_position == []


# ------------------------------------------------------------------------------------------ pacer


def test_the_pacer_never_wakes_before_its_target_and_uses_a_timerfd_on_linux() -> None:
    async def main() -> tuple[bool, list[float]]:
        lags: list[float] = []
        with pacer.Pacer() as clock:
            target = time.monotonic()
            for _ in range(50):
                target += 0.002
                await clock.sleep_until(target)
                lags.append(time.monotonic() - target)
            return clock.precise, lags

    precise, lags = asyncio.run(main())
    assert min(lags) >= 0.0
    assert precise == sys.platform.startswith("linux")


def test_validity_flags_schedule_lag_always_and_loop_lag_only_when_the_loop_takes_the_stamps() -> None:
    stage = plan.StagePlan(name="s", requests=(), rate=10.0, offsets=())
    p = plan.Plan(stages=(stage,))
    late = records.RequestRecord(
        stage="s", index=0, arm="control", ok=True, intended=0.0, sent=0.009, first_token=0.05, end=0.1
    )
    window = records.StageWindow(stage="s", start=0.0, end=1.0)
    anchor = records.RunAnchor(monotonic=0.0, wall=0.0)

    def validity(stamps: str, recs: list[records.RequestRecord]) -> dict[str, Any]:
        doc = summary.build(
            p,
            [summary.derive(r) for r in recs],
            [window],
            anchor,
            loop_lags_ms=[20.0] * 10,
            cpu_percent=10.0,
            interrupted=False,
            connections={},
            stamps=stamps,
        )
        result: dict[str, Any] = doc["validity"]
        return result

    kernel = validity("kernel", [late])
    assert not kernel["valid"] and kernel["reasons"] == ["schedule lag p99 9.00 ms > budget 5.00 ms"]
    assert validity("kernel", [])["valid"]
    loop = validity("loop", [])
    assert not loop["valid"] and "event-loop lag" in loop["reasons"][0]


def test_the_validity_block_is_the_json_main_wrote() -> None:
    """The typed block writes the same `loadgen-summary.json` as main's dict (key order included),
    and the run's result reads it back as a `Validity`."""
    from tests.experiment.test_validity import LOADGEN_BLOCK

    stage = plan.StagePlan(name="s", requests=(), rate=10.0, offsets=())
    recs = [
        records.RequestRecord(
            stage="s", index=0, arm=arm, ok=True, intended=0.0, sent=0.009, first_token=0.05, end=0.1
        )
        for arm in ("control", "treatment")
    ]
    doc = summary.build(
        plan.Plan(stages=(stage,)),
        [summary.derive(r) for r in recs],
        [records.StageWindow(stage="s", start=0.0, end=1.0)],
        records.RunAnchor(monotonic=0.0, wall=0.0),
        loop_lags_ms=[20.0] * 10,
        cpu_percent=10.0,
        interrupted=True,
        connections={spec.Arm.CONTROL: 2, spec.Arm.TREATMENT: 3},
        stamps="kernel",
    )
    written = json.loads(json.dumps(doc))
    assert json.dumps(written["validity"]) == json.dumps(LOADGEN_BLOCK)
    assert list(written["stages"][0]["arms"]) == ["control", "treatment"]
    result = runner.RunResult(Path(), records.RunAnchor(monotonic=0.0, wall=0.0), [], written, 2)
    assert result.validity is not None and result.validity.wire() == LOADGEN_BLOCK and not result.valid


@pytest.mark.parametrize(
    "event",
    [
        {"choices": ["x"]},
        {"choices": [{"delta": "a"}]},
        {"choices": [{"text": 5}]},
        {"choices": [{"text": "a"}], "usage": [1]},
        {"choices": [{"text": "a"}], "usage": {"completion_tokens": "5"}},
        {"choices": [{"text": "a"}], "usage": {"completion_tokens": True}},
        {"choices": [{"text": "a"}], "usage": {"completion_tokens": -1}},
        {"choices": [{"text": "a", "finish_reason": {"type": "length"}}]},
        {"choices": [], "usage": {"completion_tokens": 1, "prompt_tokens": "many"}},
        {"choices": [], "metrics": {"speculative_decoding": [1]}},
        {"choices": [], "metrics": {"speculative_decoding": {"num_accepted_draft_tokens": "lots"}}},
        {"choices": [], "metrics": {"speculative_decoding": {"num_draft_tokens": 2.5}}},
        {"choices": [], "metrics": {"speculative_decoding": {"mean_acceptance_length": "2"}}},
        {"choices": [], "metrics": {"speculative_decoding": {"acceptance_histogram": [1, "2"]}}},
    ],
    ids=[
        "choice not an object",
        "delta not an object",
        "text not a string",
        "usage a list",
        "tokens a string",
        "tokens a boolean",
        "tokens negative",
        "finish_reason an object",
        "prompt_tokens a string",
        "speculative_decoding an array",
        "accepted count a string",
        "draft count fractional",
        "acceptance length a string",
        "histogram of strings",
    ],
)
def test_json_events_of_the_wrong_shape_are_a_malformed_stream(event: dict[str, Any]) -> None:
    """Not an AttributeError or TypeError, which killed the load's parser task."""
    body = [(0.0, b"data: " + json.dumps(event).encode() + b"\n\n"), (0.1, b"data: [DONE]\n\n")]
    with pytest.raises(sse.MalformedStreamError, match="unexpected shape"):
        sse.parse(sse.split_events(body))
    with pytest.raises(sse.MalformedStreamError, match="unexpected shape"):
        asyncio.run(sse.read(body))


def test_each_arm_s_throughput_divides_by_its_own_active_time_not_the_stage_window() -> None:
    # Closed loop, 4 slots, 8 requests per arm: control takes 1 s per request, treatment 0.5 s.
    def arm(name: str, seconds: float) -> list[records.RequestRecord]:
        return [
            records.RequestRecord(
                stage="s",
                index=i,
                arm=name,
                ok=True,
                sent=(i // 4) * seconds,
                end=(i // 4 + 1) * seconds,
                completion_tokens=10,
            )
            for i in range(8)
        ]

    stage = plan.StagePlan(name="s", requests=(), concurrency=4)
    doc = summary.build(
        plan.Plan(stages=(stage,)),
        arm("control", 1.0) + arm("treatment", 0.5),
        [records.StageWindow(stage="s", start=0.0, end=2.0)],  # ends when control drains
        records.RunAnchor(monotonic=0.0, wall=0.0),
        loop_lags_ms=[],
        cpu_percent=0.0,
        interrupted=False,
        connections={},
    )
    arms = doc["stages"][0]["arms"]
    assert arms["control"]["active_s"] == 2.0 and arms["treatment"]["active_s"] == 1.0
    assert arms["control"]["output_tokens_per_s"] == 40.0
    assert arms["treatment"]["output_tokens_per_s"] == 80.0
    assert arms["treatment"]["requests_per_s"] == 2 * arms["control"]["requests_per_s"]


def test_an_arm_s_throughput_is_its_tokens_over_its_active_time_unrounded() -> None:
    """Output tokens/s and requests/s over the arm's own active time (first send to last end), as
    real numbers; an arm with no finished request has no throughput, not a division by zero
    (mutation benchmark survivors: `//`, `>= 0`)."""

    def rec(index: int, sent: float, end: float | None, tokens: int) -> records.RequestRecord:
        return records.RequestRecord(
            stage="s",
            index=index,
            arm="control",
            ok=end is not None,
            sent=sent,
            end=end,
            completion_tokens=tokens,
        )

    arm = summary.arm_summary([rec(0, 10.0, 11.5, 10), rec(1, 10.5, 12.0, 15)], None)
    assert arm["active_s"] == pytest.approx(2.0)
    assert arm["output_tokens_per_s"] == pytest.approx(12.5)
    assert arm["requests_per_s"] == pytest.approx(1.0)
    unfinished = summary.arm_summary([rec(0, 10.0, None, 0)], None)
    assert unfinished["active_s"] == 0.0
    assert unfinished["output_tokens_per_s"] is None and unfinished["requests_per_s"] is None


def test_kernel_timestamps_are_unsupported_where_the_socket_option_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe answers False (the loop's clock stamps the reads) instead of raising where the kernel
    refuses SO_TIMESTAMPNS (mutation benchmark survivor: the `except OSError`)."""
    import socket

    assert stamping.kernel_timestamps_supported() is sys.platform.startswith("linux")

    def refuse(self: socket.socket, *args: object) -> None:
        raise OSError(92, "Protocol not available")

    monkeypatch.setattr(socket.socket, "setsockopt", refuse)
    assert stamping.kernel_timestamps_supported() is False


def test_output_match_is_the_fraction_of_pairs_whose_texts_agree() -> None:
    """3 of 4 paired treatment outputs equal the control's: 0.75 of 4 pairs (mutation benchmark
    survivor: `/ len(both)` -> `& len(both)`)."""

    def rec(arm: str, index: int, text: str) -> records.RequestRecord:
        return records.RequestRecord(
            stage="s", index=index, arm=arm, ok=True, sent=0.0, end=1.0, text_hash=text, completion_tokens=1
        )

    control = {("s", i): rec("control", i, "same") for i in range(4)}
    treated = [rec("treatment", i, "same" if i else "other") for i in range(4)]
    arm = summary.arm_summary(treated, control)
    assert arm["output_match"] == pytest.approx(0.75)
    assert arm["output_match_pairs"] == 4


def test_the_stop_rule_is_due_once_at_each_planned_look_and_never_between() -> None:
    """Looks planned at 4, 8 and 12 pairs: asked after pairs 4, 8 and 12 only (counting pair by pair),
    and a jump past two looks asks once (mutation benchmark survivors in runner: the loop's test and
    its step)."""
    looks, at, due_at = [4, 8, 12], 0, []
    for pairs in range(1, 16):
        reached = runner.looks_reached(looks, at, pairs)
        if reached > at:
            due_at.append(pairs)
        at = reached
    assert due_at == [4, 8, 12]
    assert runner.looks_reached(looks, 0, 9) == 2
    assert runner.looks_reached(looks, 3, 40) == 3


def test_open_loop_requests_alternate_which_arm_is_written_first() -> None:
    """Neither arm always leaves first: over a stage each arm goes first for half the requests
    (mutation benchmark survivor in runner: control always first)."""
    arms = ["control", "treatment"]
    firsts = [runner.pair_order(arms, i)[0] for i in range(6)]
    assert firsts == ["control", "treatment"] * 3
    assert all(sorted(runner.pair_order(arms, i)) == arms for i in range(6))


def test_the_loop_lag_is_how_late_each_tick_woke_in_milliseconds() -> None:
    """An idle loop wakes its 10 ms ticks a few ms late at most: each lag is small and non-negative,
    not the ratio of two clock readings (mutation benchmark survivor in runner: `now // expected`)."""

    async def main() -> list[float]:
        lags: list[float] = []
        ticker = asyncio.get_running_loop().create_task(eventloop.tick_lags(lags))
        await asyncio.sleep(0.2)
        ticker.cancel()
        return lags

    lags = asyncio.run(main())
    assert len(lags) >= 5
    assert all(0.0 <= lag < 500.0 for lag in lags), lags


def test_the_stop_rule_judges_the_control_arm_against_the_treatment_arm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sequential stop rule hands the verdict each arm's own records (mutation benchmark survivor in
    plan: the treatment's records taken as the control's)."""
    s = spec.ExperimentSpec.model_validate(
        {
            "model": "m",
            "speculative": {"method": "ngram", "numSpeculativeTokens": 3},
            "workload": {"stages": [{"name": "c8", "concurrency": 8}], "requestsPerStage": 40},
            "analysis": {"sequential": True},
        }
    )
    seen: list[tuple[list[str], list[str], int, int | None]] = []

    def decided(
        _: object, control: list[records.RequestRecord], treatment: list[records.RequestRecord], **kw: Any
    ) -> bool:
        seen.append(
            ([r.arm for r in control], [r.arm for r in treatment], kw["max_pairs"], kw["concurrency"])
        )
        return True

    monkeypatch.setattr(verdict, "stage_decided", decided)
    rule = plan.stop_rule(s)
    assert rule is not None
    recs = [
        records.RequestRecord(stage="c8", index=i, arm=arm, ok=True, sent=0.0, end=1.0, completion_tokens=1)
        for i in range(3)
        for arm in ("treatment", "control")
    ]
    assert rule("c8", recs) is True
    assert seen == [(["control"] * 3, ["treatment"] * 3, 40, 8)]


def test_progress_prints_a_count_every_tenth_of_a_stage() -> None:
    """20 requests (40 with both arms): a count line every 4 finished, ten in all, failures counted
    (mutation benchmark survivor in command: the every-10% test)."""
    out = io.StringIO()
    printer = command.ProgressPrinter(out)
    printer(runner.StageStarted(stage="c8", position=0, total=1, requests=20, load="c8", warmup=False))
    for i in range(40):
        printer(runner.RequestDone(stage="c8", index=i // 2, arm="control", ok=i != 7, error_class=None))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[1/1] c8: 20 requests, c8"
    assert lines[1:] == [f"  c8: {n}/40 done, {0 if n < 8 else 1} failed" for n in range(4, 41, 4)]


@pytest.mark.parametrize(
    ("status", "expected"),
    [(200, None), (399, None), (400, "http_4xx"), (499, "http_4xx"), (500, "http_5xx")],
)
def test_a_reply_s_status_is_an_error_class_from_400_on(status: int, expected: str | None) -> None:
    """The 4xx class starts at 400, not below (mutation benchmark survivor in runner: `>= 399`)."""
    ex = http.Exchange(response=connection.Response(status=status))
    assert recording.error_class(ex, None) == expected


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.4, 0.5, 0.7, 0.9, 0.99, 1.0])
def test_quantile_is_numpy_s_linear_interpolation(q: float) -> None:
    """The validity block's p50/p90/p99 are numpy's default quantiles, between any two neighbours
    (mutation benchmark survivor in summary: the upper neighbour taken as `lo ^ 1`)."""
    import numpy as np

    values = [3.0, 10.0, 1.0, 20.0, 30.0, 40.0, 7.0]
    assert summary.quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


def test_a_request_s_tpot_is_its_decode_time_over_the_tokens_after_the_first() -> None:
    """4 tokens, the first at 100 ms, the last at 400 ms: 3 gaps, 100 ms each (mutation benchmark
    survivor in summary: the divisor as `n ^ 1`)."""
    rec = records.RequestRecord(
        stage="s",
        index=0,
        arm="control",
        ok=True,
        sent=0.0,
        first_token=0.1,
        end=0.4,
        completion_tokens=4,
        events=[(0.1, 1), (0.2, 1), (0.3, 1), (0.4, 1)],
    )
    assert summary.derive(rec).tpot_ms == pytest.approx(100.0)


def test_a_request_s_sampling_seed_is_stable_across_releases() -> None:
    """The same experiment seed gives every request the same sampling seed in every release, so a
    re-run compares like with like (mutation benchmark survivor in workload: `%` for `&`)."""
    assert [workload.request_seed(7, "c1", i) for i in range(3)] == [1696574374, 1989830641, 1265162159]
    assert all(0 <= workload.request_seed(7, "c1", i) < 2**31 for i in range(200))


def test_the_summary_names_each_stage_s_load() -> None:
    """A concurrency stage's summary carries its concurrency, a rate stage its rate (mutation benchmark
    survivor in summary: the concurrency dropped)."""
    s = spec.ExperimentSpec.model_validate(
        {
            "model": "m",
            "speculative": {"method": "ngram", "numSpeculativeTokens": 3},
            "workload": {
                "stages": [{"name": "c8", "concurrency": 8}, {"name": "r2", "rate": 2.0}],
                "requestsPerStage": 4,
                "warmupRequests": 0,
                "sampling": {"maxTokens": 16},
            },
        }
    )
    p = plan.plan_from_spec(s, Path())
    assert p.description["sampling"]["maxTokens"] == 16  # as the experiment file spells it
    windows = [records.StageWindow(stage=n, start=0.0, end=1.0) for n in ("c8", "r2")]
    anchor = records.RunAnchor(monotonic=0.0, wall=0.0)
    doc = summary.build(
        p, [], windows, anchor, loop_lags_ms=[], cpu_percent=1.0, interrupted=False, connections={}
    )
    loads = {st["stage"]: (st["concurrency"], st["rate"]) for st in doc["stages"]}
    assert loads == {"c8": (8, None), "r2": (None, 2.0)}
