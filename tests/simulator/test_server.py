"""The simulator as a process on loopback: API shape, determinism, faults, metrics, lifecycle."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from typing import Any

import pytest

from specdecode.experiment import kvcache

from .conftest import FAST, SPEC, Sim, StartSim, wait_healthy

CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "Tell me about the sea."}],
    "max_tokens": 40,
    "ignore_eos": True,
}
USAGE = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def texts(sim: Sim, prompts: list[str], **extra: Any) -> list[str]:
    out = []
    for p in prompts:
        status, body = sim.post("/v1/completions", {"model": "m", "prompt": p, "max_tokens": 30, **extra})
        assert status == 200, body
        out.append(body["choices"][0]["text"])
    return out


PROMPTS = [f"prompt number {i} about topic {i * 7 % 13}" for i in range(40)]


def test_lossless_treatment_returns_exactly_the_control_text(start_sim: StartSim) -> None:
    control = start_sim(*FAST)
    treatment = start_sim(*FAST, "--speculative-config", SPEC)
    assert texts(control, PROMPTS) == texts(treatment, PROMPTS)
    # Streaming concatenates to the same text.
    events = treatment.stream("/v1/completions", {"model": "m", "prompt": PROMPTS[0], "max_tokens": 30})
    assert (
        "".join(e["choices"][0]["text"] for e in events if e != "[DONE]" and e["choices"])
        == texts(control, PROMPTS[:1])[0]
    )


def test_output_mismatch_rate_makes_that_fraction_of_treatment_outputs_diverge(
    start_sim: StartSim,
) -> None:
    control = start_sim(*FAST)
    treatment = start_sim(*FAST, "--speculative-config", SPEC, "--output-mismatch-rate", "0.5")
    a, b = texts(control, PROMPTS), texts(treatment, PROMPTS)
    differ = sum(x != y for x, y in zip(a, b, strict=True))
    assert differ == 20  # exact: faults are a function of the prompt and --seed 42 (#23)
    assert texts(treatment, PROMPTS) == b  # deterministic per prompt
    for x, y in zip(a, b, strict=True):
        assert len(x.split()) == len(y.split()) == 30


def test_batch_variance_rate_makes_identical_servers_disagree_on_about_that_fraction_of_outputs(
    start_sim: StartSim,
) -> None:
    """Two servers without speculation: each request diverges with probability p, per arm (x-request-id)."""
    p = 0.3
    control = start_sim(*FAST, "--batch-variance-rate", str(p))
    twin = start_sim(*FAST, "--batch-variance-rate", str(p))

    def answers(sim: Sim, arm: str) -> list[str]:
        out = []
        for i, prompt in enumerate(PROMPTS):
            body = {"model": "m", "prompt": prompt, "max_tokens": 30}
            status, answer = sim.post("/v1/completions", body, {"x-request-id": f"s-c4-{i}-{arm}"})
            assert status == 200, answer
            out.append(answer["choices"][0]["text"])
        return out

    deterministic = texts(start_sim(*FAST), PROMPTS)
    a, b = answers(control, "control"), answers(twin, "treatment")
    # Each arm alone: about p of its answers leave the deterministic text (40 prompts, p = 0.3: 12 expected).
    for arm in (a, b):
        changed = sum(x != y for x, y in zip(arm, deterministic, strict=True))
        assert 3 <= changed <= 22
    # Between the arms: about 1 - (1 - p)^2 = 51% of pairs differ, where they do at a word boundary.
    differ = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert 10 <= len(differ) <= 32
    assert all(len(x.split()) == len(y.split()) == 30 for x, y in differ)
    assert answers(control, "control") == a  # reproducible per request
    # Off by default: the same server without it gives the deterministic text to every request id.
    assert answers(start_sim(*FAST), "control") == deterministic


def test_error_rate_answers_some_requests_with_vllm_shaped_500_or_in_stream_error(
    start_sim: StartSim,
) -> None:
    sim = start_sim(*FAST, "--error-rate", "0.5")
    http_errors = stream_errors = ok = 0
    for i in range(40):
        status, _, data = sim.request(
            "POST", "/v1/completions", {"model": "m", "prompt": PROMPTS[i], "max_tokens": 20, "stream": True}
        )
        if status == 500:
            assert b'"type": "InternalServerError"' in data and b'"code": 500' in data
            http_errors += 1
        elif b'data: {"error":' in data:
            assert data.endswith(b"data: [DONE]\n\n")
            stream_errors += 1
        else:
            ok += 1
    assert (http_errors, stream_errors, ok) == (9, 3, 28)  # exact: a function of the prompt and --seed 42
    # Deterministic per request: the same prompt fails the same way again.
    first = [
        sim.request("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 5})[0]
        for p in PROMPTS
    ]
    again = [
        sim.request("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 5})[0]
        for p in PROMPTS
    ]
    assert first == again


def test_chat_stream_has_role_chunk_multi_token_chunks_cumulative_usage_and_done(start_sim: StartSim) -> None:
    sim = start_sim(
        *FAST,
        "--speculative-config",
        SPEC,
        "--per-request-spec-decode-metrics",
        "summary",
        "--acceptance-rate",
        "0.9",
    )
    events = sim.stream("/v1/chat/completions", {**CHAT, **USAGE})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["object"] == "chat.completion.chunk"
    usage = [c["usage"]["completion_tokens"] for c in chunks]
    assert usage == sorted(usage) and usage[-1] == 40
    token_chunks = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]][1:]
    assert max(len(c["choices"][0]["delta"]["content"].split()) for c in token_chunks) > 1
    assert token_chunks[-1]["choices"][0]["finish_reason"] == "length"
    final = chunks[-1]
    assert final["choices"] == []
    sd = final["metrics"]["speculative_decoding"]
    assert sd["num_spec_tokens"] == 4 and len(sd["acceptance_histogram"]) == 5
    assert sd["num_accepted_draft_tokens"] == sum(j * n for j, n in enumerate(sd["acceptance_histogram"]))
    assert "metrics" not in chunks[-2]


def test_per_request_spec_metrics_appear_only_with_summary(start_sim: StartSim) -> None:
    plain = start_sim(*FAST, "--speculative-config", SPEC)
    events = plain.stream("/v1/chat/completions", {**CHAT, **USAGE})
    assert all("metrics" not in e for e in events if e != "[DONE]")
    _, body = plain.post("/v1/chat/completions", CHAT)
    assert body["metrics"] is None
    summary = start_sim(*FAST, "--speculative-config", SPEC, "--per-request-spec-decode-metrics", "summary")
    _, body = summary.post("/v1/chat/completions", CHAT)
    assert body["metrics"]["speculative_decoding"]["per_step_accepted"] is None
    no_usage = summary.stream("/v1/chat/completions", CHAT)
    assert all("metrics" not in e for e in no_usage if e != "[DONE]")


def test_min_p_and_logit_bias_are_refused_only_while_speculation_is_on(start_sim: StartSim) -> None:
    control = start_sim(*FAST)
    treatment = start_sim(*FAST, "--speculative-config", SPEC)
    for extra in ({"min_p": 0.1}, {"logit_bias": {"5": 1.0}}):
        assert control.post("/v1/chat/completions", {**CHAT, **extra})[0] == 200
        status, body = treatment.post("/v1/chat/completions", {**CHAT, **extra})
        assert status == 400
        assert body["error"]["message"] == (
            "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
        )
        assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400


def test_api_key_guards_v1_but_not_health_metrics_or_version(start_sim: StartSim) -> None:
    sim = start_sim(*FAST, "--api-key", "sekret")
    assert sim.request("GET", "/v1/models")[0] == 401
    status, _, data = sim.request("GET", "/v1/models", headers={"authorization": "Bearer sekret"})
    assert status == 200 and b'"owned_by":"vllm"' in data
    assert sim.request("GET", "/health")[0] == 200
    assert sim.request("GET", "/metrics")[0] == 200
    assert sim.request("GET", "/version")[2] == b'{"version":"0.33.0"}'


def test_stream_options_without_stream_is_a_400(start_sim: StartSim) -> None:
    sim = start_sim(*FAST)
    status, body = sim.post("/v1/chat/completions", {**CHAT, **USAGE})
    assert (
        status == 400 and "Stream options can only be defined when `stream=True`." in body["error"]["message"]
    )


def test_a_max_tokens_below_one_is_a_400_that_names_the_value_sent(start_sim: StartSim) -> None:
    sim = start_sim(*FAST)
    status, body = sim.post("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 0})
    assert status == 400 and body["error"]["message"] == "max_tokens must be at least 1, got 0."


def test_ground_truth_records_every_chunk_with_its_tokens_and_the_client_request_id(
    start_sim: StartSim,
) -> None:
    sim = start_sim(*FAST, "--speculative-config", SPEC)
    before = time.monotonic()
    events = sim.stream("/v1/chat/completions", {**CHAT, **USAGE}, headers={"x-request-id": "req-42"})
    after = time.monotonic()
    (rec,) = sim.ground_truth("req-42")
    assert rec["status"] == "ok" and rec["completion_tokens"] == 40
    assert sum(n for _, n, _ in rec["chunks"]) == 40
    token_events = [
        e for e in events if e != "[DONE]" and e["choices"] and e["choices"][0]["delta"].get("content")
    ]
    assert len(rec["chunks"]) == len(token_events)
    assert before <= rec["arrival"] <= rec["chunks"][0][0] <= rec["chunks"][-1][0] <= after
    for written, _, boundary in rec["chunks"]:
        assert written >= boundary
    boundaries = [b for _, _, b in rec["chunks"]]
    assert boundaries == sorted(boundaries)


def test_ground_truth_file_gets_one_line_per_request(start_sim: StartSim, tmp_path: Any) -> None:
    path = tmp_path / "truth.jsonl"
    sim = start_sim(*FAST, "--ground-truth", str(path))
    for p in PROMPTS[:3]:
        sim.post("/v1/completions", {"model": "m", "prompt": p, "max_tokens": 3})
    assert sim.stop() == 0  # the file is written every 0.2 s and at exit
    assert len(path.read_text().splitlines()) == 3


def test_mid_stream_disconnects_drop_that_fraction_of_streams(start_sim: StartSim) -> None:
    sim = start_sim(*FAST, "--disconnect-rate", "0.5")
    dropped = 0
    for p in PROMPTS[:20]:
        try:
            _, _, data = sim.request(
                "POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 20, "stream": True}
            )
            dropped += not data.endswith(b"data: [DONE]\n\n")
        except Exception:  # http.client raises IncompleteRead on a cut chunked body
            dropped += 1
    assert dropped == 11  # exact: a function of the prompt and --seed 42
    assert sum(r["status"] == "disconnected" for r in sim.ground_truth()) == dropped


def test_health_is_503_while_loading_then_200(start_sim: StartSim) -> None:
    sim = start_sim(*FAST, "--startup-delay", "1.5", wait=False)
    deadline = time.monotonic() + 10
    while True:
        try:
            status = sim.request("GET", "/health")[0]
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert status == 503
    assert sim.post("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})[0] == 503
    wait_healthy(sim)


def test_crash_switch_ends_the_process_with_status_1(start_sim: StartSim) -> None:
    sim = start_sim(*FAST, "--crash-after", "0.3")
    assert sim.proc.wait(timeout=10) == 1


def test_sigterm_stops_the_simulator_cleanly_even_mid_stream(start_sim: StartSim) -> None:
    sim = start_sim("--decode-step-ms", "50")
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    conn.request(
        "POST", "/v1/completions", body=b'{"prompt":"x","max_tokens":1000,"stream":true,"ignore_eos":true}'
    )
    conn.getresponse()
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.proc.wait(timeout=10) == 0
    conn.close()
    assert "Shutting down" in sim.log.read_text()


def test_bad_flags_exit_with_status_2(start_sim: StartSim) -> None:
    sim = start_sim("--per-request-spec-decode-metrics", "summary", wait=False)
    assert sim.proc.wait(timeout=10) == 2
    sim = start_sim("--speculative-config", "{not json", wait=False)
    assert sim.proc.wait(timeout=10) == 2


def test_unknown_vllm_flags_are_accepted_and_logged(start_sim: StartSim) -> None:
    sim = start_sim(
        *FAST, "--max-model-len", "4096", "--gpu_memory_utilization", "0.9", "-tp", "1", "--enforce-eager"
    )
    assert "ignored vLLM flags: --gpu_memory_utilization 0.9 -tp 1 --enforce-eager" in sim.log.read_text()


# Metric names of vLLM 0.33 (shared/reference/vllm-0.33-facts.md §3.2 and §3.4), as exposed series families.
VLLM_033_METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:engine_sleep_state": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:request_success": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_cached_by_source": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:admission_rejections": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_num_preemptions": "histogram",
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
}
READ_BY_EXPERIMENTS = {
    "vllm:time_to_first_token_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:request_success",
}
SPEC_METRICS = {n for n in VLLM_033_METRICS if n.startswith("vllm:spec_decode_")}
TTFT_LE = [
    "0.001",
    "0.005",
    "0.01",
    "0.02",
    "0.04",
    "0.06",
    "0.08",
    "0.1",
    "0.25",
    "0.5",
    "0.75",
    "1.0",
    "2.5",
    "5.0",
    "7.5",
    "10.0",
    "20.0",
    "40.0",
    "80.0",
    "160.0",
    "640.0",
    "2560.0",
    "+Inf",
]


def families(exposition: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, flags=re.M))


def test_metric_names_types_and_labels_conform_to_vllm_0_33(start_sim: StartSim) -> None:
    control = start_sim(*FAST)
    treatment = start_sim(*FAST, "--speculative-config", SPEC)
    treatment.post("/v1/chat/completions", CHAT)
    for sim, spec in ((control, False), (treatment, True)):
        text = sim.metrics()
        fams = families(text)
        for name, kind in fams.items():
            assert VLLM_033_METRICS.get(name) == kind, name
        assert set(fams) >= READ_BY_EXPERIMENTS
        assert (set(fams) >= SPEC_METRICS) if spec else not (SPEC_METRICS & set(fams))
        for line in text.splitlines():
            if line.startswith("vllm:cache_config_info{"):
                # An info gauge of CacheConfig fields: `engine` but no `model_name`, as in vLLM.
                assert 'engine="0"' in line and "model_name" not in line, line
            elif line.startswith("vllm:"):
                assert 'model_name="m",engine="0"' in line, line
        le = re.findall(r'^vllm:time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"\}', text, flags=re.M)
        assert le == TTFT_LE
    text = treatment.metrics()
    assert re.search(
        r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{.*position="3"\} ', text, flags=re.M
    )
    assert re.search(r"^vllm:generation_tokens_total\{.*\} 40\.0$", text, flags=re.M)
    assert re.search(r'^vllm:request_success_total\{.*finished_reason="length"\} 1\.0$', text, flags=re.M)


@pytest.mark.parametrize("chat", [True, False])
def test_openai_sdk_streams_with_usage(start_sim: StartSim, chat: bool) -> None:
    import openai

    sim = start_sim(*FAST, "--speculative-config", SPEC, "--api-key", "k")
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="k", max_retries=0)
    try:
        assert [m.id for m in client.models.list()] == ["m"]
        opts: Any = {"include_usage": True, "continuous_usage_stats": True}
        if chat:
            stream: Any = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=25,
                stream=True,
                stream_options=opts,
                extra_body={"ignore_eos": True},
            )
            pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
            final = None
        else:
            stream = client.completions.create(
                model="m",
                prompt="hi",
                max_tokens=25,
                stream=True,
                stream_options=opts,
                extra_body={"ignore_eos": True},
            )
            chunks = list(stream)
            pieces = [c.choices[0].text for c in chunks if c.choices]
            final = chunks[-1]
            assert final.usage is not None and final.usage.completion_tokens == 25
        assert len("".join(pieces).split()) == 25
        if chat:
            resp = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=7
            )
            assert resp.usage is not None and resp.usage.completion_tokens <= 7
            assert resp.choices[0].message.role == "assistant"
    finally:
        client.close()


def test_step_boundaries_follow_absolute_deadlines_without_drift(start_sim: StartSim) -> None:
    # One sequence, control: every decode step lasts decode_step_ms + batch_token_ms = 5.0 ms exactly.
    sim = start_sim("--decode-step-ms", "4.9", "--batch-token-ms", "0.1", "--request-overhead-ms", "0")
    sim.stream("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 200, "ignore_eos": True},
               headers={"x-request-id": "drift"})  # fmt: skip
    (rec,) = sim.ground_truth("drift")
    boundaries = [b for _, _, b in rec["chunks"]]
    decode = boundaries[1:]  # after the prefill step
    # Boundaries are computed (anchor + n x step), never re-read from the clock: no lateness carries over.
    for i, b in enumerate(decode):
        assert b - decode[0] == pytest.approx(i * 0.005, abs=1e-9)


def test_without_ignore_eos_the_output_stops_at_a_deterministic_eos(start_sim: StartSim) -> None:
    sim = start_sim(*FAST)
    reasons = set()
    for p in PROMPTS[:10]:
        body = {"model": "m", "prompt": p, "max_tokens": 600}
        _, first = sim.post("/v1/completions", body)
        _, again = sim.post("/v1/completions", body)
        assert first["choices"][0]["text"] == again["choices"][0]["text"]
        n = first["usage"]["completion_tokens"]
        reason = first["choices"][0]["finish_reason"]
        assert (reason == "stop" and n < 600) or (reason == "length" and n == 600)
        reasons.add(reason)
    assert "stop" in reasons


def test_the_simulated_host_reports_its_speed_factor(start_sim: StartSim) -> None:
    status, _, body = start_sim(*FAST, "--speed-factor", "1.1").request("GET", "/sim/host")
    assert (status, json.loads(body)) == (200, {"speedFactor": 1.1})


def test_kv_cache_capacity_is_exposed_and_logged_as_vllm_does_and_the_draft_takes_its_share(
    start_sim: StartSim,
) -> None:
    profile = ("--profile", "h200-8b-draft-1b", "--kv-cache-tokens", "100000", "--max-model-len", "4096")
    control = start_sim(*FAST, *profile)
    treatment = start_sim(*FAST, *profile, "--speculative-config", SPEC)
    control_cap = kvcache.from_metrics(control.metrics())
    treatment_cap = kvcache.from_metrics(treatment.metrics())
    assert control_cap == kvcache.KVCapacity(tokens=100_000, block_size=16)  # 6,250 blocks of 16
    assert treatment_cap == kvcache.KVCapacity(tokens=76_992, block_size=16)  # 77,000 -> 4,812 blocks
    assert re.search(r'^vllm:cache_config_info\{.*num_gpu_blocks="6250".*\} 1\.0$', control.metrics(), re.M)
    line = "GPU KV cache size: 100,000 tokens, Maximum concurrency for 4,096 tokens per request: 24.41x"
    assert line in control.log.read_text()
    assert kvcache.from_log(treatment.log.read_text()) == kvcache.KVCapacity(tokens=76_992)
    assert kvcache.draft_share(control_cap, treatment_cap) == pytest.approx(0.23, abs=0.001)


def test_dcgm_series_of_the_simulated_gpu_are_served_with_the_exporter_s_pod_labels(
    start_sim: StartSim,
) -> None:
    """`--dcgm` (#18): dcgm-exporter's three default gauges of the pod's GPU; without it, none."""
    assert "DCGM_FI" not in start_sim(*FAST).metrics()
    exposition = start_sim(*FAST, "--dcgm").metrics()
    found = {
        match.group(1): (dict(re.findall(r'(\w+)="([^"]*)"', match.group(2))), float(match.group(3)))
        for match in re.finditer(r"^(DCGM_FI_DEV_\w+)\{(.*)\} (\S+)$", exposition, re.M)
    }
    assert set(found) == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"}
    labels, util = found["DCGM_FI_DEV_GPU_UTIL"]
    assert {"gpu", "UUID", "modelName", "Hostname", "pod", "namespace", "container"} <= set(labels)
    assert labels["pod"] == socket.gethostname() and labels["namespace"] == "default"
    assert util == 0.0 and found["DCGM_FI_DEV_POWER_USAGE"][1] == 120.0  # idle
    assert found["DCGM_FI_DEV_FB_USED"][1] == 129393.0  # gpu_memory_utilization 0.9 of 143,771 MiB
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in exposition
