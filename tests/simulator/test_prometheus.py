"""A real Prometheus server scrapes the simulator: the acceptance rate with PromQL, and the operator's
own queries (`sources.prometheus`) over one stage."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from specdecode.experiment import promql
from specdecode.sources import prometheus

from .conftest import FAST, Prometheus, StartSim

ACCEPTANCE = (
    "sum(increase(vllm:spec_decode_num_accepted_tokens_total[5m]))"
    " / sum(increase(vllm:spec_decode_num_draft_tokens_total[5m]))"
)
RATES = (0.8, 0.64, 0.512)  # unconditional per-position acceptance rates
DRAFTS = 6000


def test_prometheus_scrapes_the_simulator_and_answers_the_acceptance_rate(
    start_sim: StartSim, start_prometheus: Callable[[list[str]], Prometheus]
) -> None:
    """Prometheus's answers equal the simulator's own counters, and those counters hold the configured
    acceptance within sampling error.

    The sampling error is that of whole drafts: a draft accepts 0..3 tokens, positions are nested (the
    second is accepted only after the first), so accepted/drafted over n drafts has a standard error of
    sd(accepted per draft)/3/sqrt(n), about 0.40/sqrt(n), not that of independent tokens."""
    spec = (
        '{"method":"draft_model","model":"d","num_speculative_tokens":3,'
        f'"synthetic_acceptance_rates":{json.dumps(list(RATES))}}}'
    )
    sim = start_sim(*FAST, "--speculative-config", spec)
    prom = start_prometheus([f"127.0.0.1:{sim.port}"])
    deadline = time.monotonic() + 30
    while not (up := prom.query('up{job="sim"}')) or up[0]["value"][1] != "1":
        assert time.monotonic() < deadline, "Prometheus never scraped the simulator"
        time.sleep(0.2)
    # The first scrape came before any request: increase() over the window sees every draft.
    i = 0
    deadline = time.monotonic() + 120
    while counters(sim.metrics()).get("vllm:spec_decode_num_drafts_total", 0.0) < DRAFTS:
        assert time.monotonic() < deadline, "the simulator did not draft enough in two minutes"
        for _ in range(10):
            code, _ = sim.post(
                "/v1/completions", {"model": "m", "prompt": f"p{i}", "max_tokens": 200, "ignore_eos": True}
            )
            assert code == 200
            i += 1
    own = counters(sim.metrics())
    drafts = own["vllm:spec_decode_num_drafts_total"]
    deadline = time.monotonic() + 30
    while (
        not (seen := prom.query("sum(vllm:spec_decode_num_drafts_total)"))
        or float(seen[0]["value"][1]) != drafts
    ):
        assert time.monotonic() < deadline, "Prometheus never scraped the idle simulator's counters"
        time.sleep(0.2)

    expected = (
        own["vllm:spec_decode_num_accepted_tokens_total"] / own["vllm:spec_decode_num_draft_tokens_total"]
    )
    result = prom.query(ACCEPTANCE)
    assert result and float(result[0]["value"][1]) == pytest.approx(expected, rel=1e-9)
    per_pos = prom.query(
        "sum by (position) (vllm:spec_decode_num_accepted_tokens_per_pos_total)"
        " / ignoring(position) group_left"
        " sum(vllm:spec_decode_num_drafts_total)"
    )
    rates = {r["metric"]["position"]: float(r["value"][1]) for r in per_pos}
    assert rates == pytest.approx(
        {str(p): own[f"vllm:spec_decode_num_accepted_tokens_per_pos_total/{p}"] / drafts for p in range(3)},
        rel=1e-9,
    )

    # Within 4.5 standard errors (a false alarm about once in 150,000 runs).
    accepted = [1 - RATES[0], RATES[0] - RATES[1], RATES[1] - RATES[2], RATES[2]]  # P(0..3 accepted)
    mean = sum(k * p for k, p in enumerate(accepted))
    sd_per_draft = (sum(k * k * p for k, p in enumerate(accepted)) - mean**2) ** 0.5 / 3
    assert abs(expected - sum(RATES) / 3) < 4.5 * sd_per_draft / drafts**0.5
    for p, rate in enumerate(RATES):
        assert abs(rates[str(p)] - rate) < 4.5 * (rate * (1 - rate) / drafts) ** 0.5, (p, rates)


def counters(sim_metrics: str) -> dict[str, float]:
    """The simulator's /metrics text -> metric name (with its `position` label, if any) -> sum over series."""
    sums: dict[str, float] = {}
    for line in sim_metrics.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        if 'position="' in series:
            name += "/" + series.split('position="', 1)[1].split('"', 1)[0]
        sums[name] = sums.get(name, 0.0) + float(value)
    return sums


def test_the_operator_s_queries_read_one_stage_from_a_real_prometheus(
    start_sim: StartSim, start_prometheus: Callable[[list[str]], Prometheus]
) -> None:
    """The production path (`promql`, `PrometheusSource`, `arm_metrics`) against a real Prometheus
    scraping the simulator: each value is the simulator's own counter delta over the stage.

    Counters are read with `increase()`, which extrapolates to the window's end: a count may come out
    a few percent above the true delta, never below it (the load is idle at both ends of the stage).
    Ratios of counters from the same scrapes (acceptance, histogram means) cancel that factor.
    The stage starts before Prometheus has scraped anything: `up` exists only at the stage's end.
    """
    spec = (
        '{"method":"draft_model","model":"d","num_speculative_tokens":3,'
        '"synthetic_acceptance_rates":[0.8,0.64,0.512]}'
    )
    sim = start_sim(*FAST, "--speculative-config", spec)
    start = time.time()
    prom = start_prometheus([f"127.0.0.1:{sim.port}"])
    deadline = time.monotonic() + 30
    while (
        not (scraped := prom.query('count_over_time(up{job="sim"}[1m])')) or float(scraped[0]["value"][1]) < 2
    ):
        assert time.monotonic() < deadline, "Prometheus did not scrape the simulator twice"
        time.sleep(0.2)
    before = counters(sim.metrics())
    for i in range(30):
        code, _ = sim.post(
            "/v1/completions", {"model": "m", "prompt": f"p{i}", "max_tokens": 64, "ignore_eos": True}
        )
        assert code == 200
    delta = {k: v - before.get(k, 0.0) for k, v in counters(sim.metrics()).items()}
    time.sleep(4.0)  # idle: the scrapes after the last request see every increment
    end = time.time()
    while time.time() < end + 1.5:  # a scrape after `end` is ingested, so the query at `end` is complete
        time.sleep(0.1)

    source = prometheus.PrometheusSource(prom.url)
    metrics = prometheus.arm_metrics(
        source, {"job": "sim"}, start=start, end=end, speculative=True, pod_label="instance"
    )
    # The queries go in one request (`promql.tagged`): each answers as it does asked alone.
    queries = prometheus.arm_queries(
        {"job": "sim"}, seconds=end - start, speculative=True, pod_label="instance"
    )

    def by_labels(samples: list[promql.Sample]) -> list[tuple[list[tuple[str, str]], float]]:
        return sorted((sorted(s.labels.items()), s.value) for s in samples)

    batched = source.query_many(queries, end)
    assert {key: by_labels(found) for key, found in batched.items()} == {
        key: by_labels(source.query(query, end)) for key, query in queries.items()
    }
    assert all(batched[key] for key in ("up", "requestsPerPod", "accepted_per_position", "num_drafts"))

    def counted(value: float | None, name: str) -> None:
        assert delta[name] > 0
        assert value is not None and delta[name] - 1e-6 <= value <= delta[name] * 1.25, (
            name,
            value,
            delta[name],
        )

    counted(metrics.requests_success, "vllm:request_success_total")
    assert delta["vllm:request_success_total"] == 30
    counted(metrics.generation_tokens, "vllm:generation_tokens_total")
    counted(metrics.num_drafts, "vllm:spec_decode_num_drafts_total")
    counted(metrics.num_draft_tokens, "vllm:spec_decode_num_draft_tokens_total")
    counted(metrics.num_accepted_tokens, "vllm:spec_decode_num_accepted_tokens_total")
    assert metrics.num_accepted_tokens is not None and metrics.num_draft_tokens is not None
    assert metrics.num_accepted_tokens / metrics.num_draft_tokens == pytest.approx(
        delta["vllm:spec_decode_num_accepted_tokens_total"]
        / delta["vllm:spec_decode_num_draft_tokens_total"],
        rel=1e-6,
    )
    assert metrics.num_drafts is not None
    drafts = delta["vllm:spec_decode_num_drafts_total"]
    per_position = [
        delta[f"vllm:spec_decode_num_accepted_tokens_per_pos_total/{p}"] / drafts for p in range(3)
    ]
    assert [v / metrics.num_drafts for v in metrics.accepted_per_position] == pytest.approx(
        per_position, rel=1e-6
    )
    assert metrics.extra["ttftMeanMs"] == pytest.approx(
        1000
        * delta["vllm:time_to_first_token_seconds_sum"]
        / delta["vllm:time_to_first_token_seconds_count"],
        rel=1e-6,
    )
    assert metrics.extra["tpotMeanMs"] == pytest.approx(
        1000
        * delta["vllm:request_time_per_output_token_seconds_sum"]
        / delta["vllm:request_time_per_output_token_seconds_count"],
        rel=1e-6,
    )
    assert set(metrics.extra["requestsPerPod"]) == {f"127.0.0.1:{sim.port}"}
    assert (
        metrics.kv_cache_usage_max is not None and 0.0 <= metrics.kv_cache_usage_max <= 1.0
    )  # a gauge: 0 between requests
