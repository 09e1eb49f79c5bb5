from __future__ import annotations

import http.server
import json
import math
import threading
from collections.abc import Callable, Iterator, Mapping

import pytest

from specdecode.experiment import promql
from specdecode.sources import prometheus

LABELS = {"namespace": "llm", "specdecode_io_experiment": "exp", "specdecode_io_arm": "treatment"}


class FakeSource:
    """Canned answers by metric name, as Prometheus would give them (strings, NaN, empty)."""

    def __init__(self, answers: Mapping[str, list[tuple[dict[str, str], str]]]) -> None:
        self.answers = answers
        self.queries: list[str] = []

    def query(self, expression: str, at: float) -> list[promql.Sample]:
        self.queries.append(expression)
        for metric, series in self.answers.items():
            if metric in expression:
                return [promql.Sample(labels, float(value)) for labels, value in series]
        return []


def test_selectors_escape_label_values() -> None:
    assert promql.selector({"a": 'x"y\\z'}) == '{a="x\\"y\\\\z"}'


def test_increase_covers_the_stage_plus_a_scrape_on_each_side() -> None:
    query = promql.increase(promql.SPEC_ACCEPTED, LABELS, 30.2, by="pod")
    assert query.startswith("sum by (pod)(increase(vllm:spec_decode_num_accepted_tokens_total{")
    assert query.endswith("[33s]))")


def test_treatment_counters_are_read_per_position() -> None:
    source = FakeSource(
        {
            "up": [({}, "1")],
            "per_pos": [({"position": "1"}, "60"), ({"position": "0"}, "80")],
            "num_drafts": [({"pod": "a"}, "100")],
            "num_draft_tokens": [({"pod": "a"}, "400")],
            "num_accepted_tokens_total": [({"pod": "a"}, "250"), ({"pod": "b"}, "NaN")],
            "request_success": [({"pod": "exp-treatment-1"}, "12")],
        }
    )
    metrics = prometheus.arm_metrics(source, LABELS, start=0, end=30, speculative=True)
    assert metrics.source == "prometheus"
    assert metrics.num_drafts == 100 and metrics.num_draft_tokens == 400
    assert metrics.num_accepted_tokens == 250  # NaN series ignored
    assert metrics.accepted_per_position == [80, 60]
    assert metrics.extra["requestsPerPod"] == {"exp-treatment-1": 12}


def test_the_control_arm_has_no_speculative_queries() -> None:
    source = FakeSource({"up": [({}, "1")]})
    metrics = prometheus.arm_metrics(source, LABELS, start=0, end=30, speculative=False)
    assert metrics.num_drafts is None
    assert not any("spec_decode" in q for q in source.queries)


def test_no_scraped_target_is_no_data() -> None:
    with pytest.raises(prometheus.PrometheusNoData, match="no scraped target"):
        prometheus.arm_metrics(FakeSource({}), LABELS, start=0, end=30, speculative=True)


def test_an_unreachable_prometheus_is_unavailable() -> None:
    source = prometheus.PrometheusSource("http://127.0.0.1:1", timeout=1)
    with pytest.raises(prometheus.PrometheusUnavailable):
        source.query("up", 0)


class _Canned(http.server.BaseHTTPRequestHandler):
    """Answers every request with the class's `status` and `body`."""

    status = 200
    body = b""
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[Callable[[int, bytes], prometheus.PrometheusSource]]:
    """A Prometheus on loopback that answers what the test says."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def answer(status: int, body: bytes) -> prometheus.PrometheusSource:
        _Canned.status, _Canned.body, _Canned.hits = status, body, 0
        return prometheus.PrometheusSource(f"http://127.0.0.1:{server.server_address[1]}", timeout=5)

    try:
        yield answer
    finally:
        server.shutdown()
        server.server_close()


def vector(*series: tuple[dict[str, str], str]) -> bytes:
    result = [{"metric": labels, "value": [1.0, value]} for labels, value in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


@pytest.mark.parametrize(
    "body",
    [
        b'{"status": "success"}',
        b"[]",
        b'{"status": "success", "data": {"result": {"a": 1}}}',
        vector(({}, "+Inf")),
    ],
    ids=["no data", "a list", "a result that is no list", "an infinite value"],
)
def test_an_answer_of_an_unexpected_shape_is_a_bad_response(
    canned: Callable[[int, bytes], prometheus.PrometheusSource], body: bytes
) -> None:
    """Not a KeyError or TypeError escaping every tick: a kind of PrometheusUnavailable (retried,
    then the experiment fails at its deadline or grace)."""
    with pytest.raises(prometheus.PrometheusBadResponse):
        canned(200, body).query("up", 0)


def test_an_answer_s_values_are_read_as_numbers_and_nan_is_kept(
    canned: Callable[[int, bytes], prometheus.PrometheusSource],
) -> None:
    """The value of `[timestamp, "value"]`, not its timestamp; NaN stays for `arm_metrics` to drop."""
    samples = canned(200, vector(({"pod": "a"}, "NaN"), ({}, "2.5"))).query("up", 0)
    assert [dict(s.labels) for s in samples] == [{"pod": "a"}, {}]
    assert math.isnan(samples[0].value) and samples[1].value == 2.5


def test_a_position_label_that_is_no_number_is_a_bad_response(
    canned: Callable[[int, bytes], prometheus.PrometheusSource],
) -> None:
    source = canned(
        200, vector(({promql.TAG: "up"}, "1"), ({"position": "x", promql.TAG: "accepted_per_position"}, "3"))
    )
    with pytest.raises(prometheus.PrometheusBadResponse, match="position"):
        prometheus.arm_metrics(source, LABELS, start=0, end=30, speculative=True)


def test_queries_asked_together_answer_each_under_its_key_without_the_tag(
    canned: Callable[[int, bytes], prometheus.PrometheusSource],
) -> None:
    """One request for several queries (`promql.tagged`): the series are split by the tag's value, a
    series of no asked key is dropped, and a key nobody answered is an empty answer."""
    source = canned(
        200,
        vector(
            ({promql.TAG: "a", "pod": "p"}, "1"),
            ({promql.TAG: "b"}, "2"),
            ({promql.TAG: "a", "pod": "q"}, "3"),
            ({promql.TAG: "z"}, "4"),
            ({}, "5"),
        ),
    )
    answers = source.query_many({"a": "sum by (pod)(x)", "b": "sum(y)", "c": "sum(w)"}, 0)
    assert {key: [(dict(s.labels), s.value) for s in found] for key, found in answers.items()} == {
        "a": [({"pod": "p"}, 1.0), ({"pod": "q"}, 3.0)],
        "b": [({}, 2.0)],
        "c": [],
    }


def test_an_infinite_value_of_queries_asked_together_names_its_query(
    canned: Callable[[int, bytes], prometheus.PrometheusSource],
) -> None:
    source = canned(200, vector(({promql.TAG: "a"}, "1"), ({promql.TAG: "b"}, "+Inf")))
    with pytest.raises(prometheus.PrometheusBadResponse, match=r"sum\(y\) is infinite"):
        source.query_many({"a": "sum(x)", "b": "sum(y)"}, 0)


def test_queries_are_tagged_by_a_key_that_needs_no_escaping() -> None:
    assert promql.tagged({"control.up": "sum(up)", "b": "x / y"}) == (
        f'label_replace(sum(up), "{promql.TAG}", "control.up", "", "") or '
        f'label_replace(x / y, "{promql.TAG}", "b", "", "")'
    )
    with pytest.raises(ValueError, match="key"):
        promql.tagged({'a"b': "up"})


def test_an_error_answer_s_body_never_reaches_the_message(
    canned: Callable[[int, bytes], prometheus.PrometheusSource],
) -> None:
    """spec.prometheus.url is the user's: the operator must not read back what it points at."""
    with pytest.raises(prometheus.PrometheusUnavailable) as raised:
        canned(404, b"SECRET-LOOKING BODY").query("up", 0)
    assert "404" in str(raised.value)
    assert "SECRET" not in str(raised.value)


def test_a_failing_query_is_tried_once_the_operator_s_tick_is_the_retry(
    canned: Callable[[int, bytes], prometheus.PrometheusSource],
) -> None:
    """prometheus-api-client's default (`retry=None`) retries a 503 three times with backoff: ~6 s
    blocked per query, on every tick. One attempt; the tick's retry has the phase's deadline."""
    source = canned(503, b"overloaded")
    with pytest.raises(prometheus.PrometheusUnavailable, match="503"):
        source.query("up", 0)
    assert _Canned.hits == 1


def test_an_arm_s_kv_capacity_is_read_from_its_cache_config_info_series() -> None:
    source = FakeSource(
        {
            "vllm:cache_config_info": [
                ({"pod": "exp-treatment-a", "num_gpu_blocks": "2906", "block_size": "16"}, "1"),
                ({"pod": "exp-treatment-b", "num_gpu_blocks": "None", "block_size": "16"}, "1"),
            ]
        }
    )
    capacity = prometheus.kv_capacities(source, {"arm": LABELS}, at=30)["arm"]
    assert capacity is not None and (capacity.tokens, capacity.block_size) == (2906 * 16, 16)
    assert source.queries == [
        'vllm:cache_config_info{namespace="llm",specdecode_io_experiment="exp",specdecode_io_arm="treatment"}'
    ]


def test_an_arm_without_a_cache_config_info_series_has_no_kv_capacity() -> None:
    assert prometheus.kv_capacities(FakeSource({}), {"arm": LABELS}, at=30)["arm"] is None


def test_an_arm_s_gpu_figures_come_from_the_dcgm_series_of_its_pods() -> None:
    selector = '{namespace="llm",pod=~"exp-control-[a-z0-9]+-[a-z0-9]+"}'
    source = FakeSource(
        {
            "count(last_over_time(DCGM_FI_DEV_GPU_UTIL": [({}, "1")],
            "avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL": [({}, "71.25")],
            "avg(avg_over_time(DCGM_FI_DEV_FB_USED": [({}, "129393")],
            "max(max_over_time(DCGM_FI_DEV_FB_USED": [({}, "129393")],
            "DCGM_FI_DEV_POWER_USAGE": [({}, "533.2")],
        }
    )
    gpu = prometheus.arms_gpu(source, {"arm": selector}, start=0, end=30)["arm"]
    assert gpu is not None
    assert (gpu.gpus, gpu.utilization_mean, gpu.memory_used_max_mib, gpu.power_mean_watts) == (
        1,
        71.2,
        129393,
        533.2,
    )
    assert all(selector in query and query.endswith("[32s]))") for query in source.queries)


def test_an_arm_whose_pods_have_no_dcgm_series_has_no_gpu_figures() -> None:
    assert prometheus.arms_gpu(FakeSource({}), {"arm": "{}"}, start=0, end=30)["arm"] is None
