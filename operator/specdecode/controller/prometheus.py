"""Server-side measurements from Prometheus, through `prometheus-api-client`.

`PrometheusSource` implements the core's `promql.MetricsSource`; `arm_metrics` turns the queries of
`experiment.promql` into the `ArmServerMetrics` the verdict reads. An unreachable Prometheus raises
`PrometheusUnavailable` (transient: retried); one whose answer has an unexpected shape (no `data`,
a non-numeric `position` label, an infinite counter) `PrometheusBadResponse`, a kind of it; a
Prometheus that does not scrape the arm's pods gives `PrometheusNoData` (the experiment fails: it
could not measure). Messages carry the HTTP status, never a response body (the URL is the user's:
a body could be anything the operator's network position can read).

    PrometheusUnavailable
    └── PrometheusBadResponse
    PrometheusNoData
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from specdecode.experiment import kvcache, promql, records, status, telemetry


class PrometheusUnavailable(Exception):
    """Prometheus did not answer."""


class PrometheusBadResponse(PrometheusUnavailable):
    """Prometheus answered, but not with what a query returns (or a value that cannot be a counter)."""


class PrometheusNoData(Exception):
    """Prometheus answered but holds nothing for the arm's pods."""


class PrometheusSource:
    """Instant queries against one Prometheus server."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url
        # One attempt per query: the operator's tick is the retry (with its deadline). `retry=None` would
        # be the client's default, 3 retries with backoff on errors and 5xx: ~6 s blocked per failing query.
        no_retry = Retry(total=0, status_forcelist=(), raise_on_status=False)
        self._client = PrometheusConnect(url=url, disable_ssl=False, retry=no_retry, timeout=timeout)

    def query(self, expression: str, at: float) -> list[promql.Sample]:
        """Evaluate at Unix time `at`."""
        try:
            answer = self._client.custom_query(expression, params={"time": f"{at:.3f}"})
        except requests.RequestException as exc:
            raise PrometheusUnavailable(f"{self.url}: {str(exc)[:200]}") from None
        except PrometheusApiClientException as exc:
            code = re.search(r"HTTP Status Code \d+", str(exc))
            raise PrometheusUnavailable(f"{self.url}: {code.group(0) if code else 'an error'}") from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PrometheusBadResponse(f"{self.url}: not a query result ({type(exc).__name__})") from None
        if not isinstance(answer, list):
            raise PrometheusBadResponse(f"{self.url}: the query result is not a list")
        samples = []
        for series in answer:
            try:
                value = float(series["value"][1])
                labels = dict(series.get("metric") or {})
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                continue
            if math.isinf(value):
                raise PrometheusBadResponse(f"{self.url}: {expression} is infinite")
            samples.append(promql.Sample(labels=labels, value=value))
        return samples


def _scalar(source: promql.MetricsSource, expression: str, at: float) -> float | None:
    samples = source.query(expression, at)
    values = [s.value for s in samples if not math.isnan(s.value)]
    return sum(values) if values else None


def arm_metrics(
    source: promql.MetricsSource,
    labels: Mapping[str, str],
    *,
    start: float,
    end: float,
    speculative: bool,
    pod_label: str = "pod",
) -> records.ArmServerMetrics:
    """One arm's counter deltas and gauges over a stage window (Unix times)."""
    seconds = max(1.0, end - start)
    up = _scalar(source, promql.targets_up(labels), end)
    if not up:
        raise PrometheusNoData(f"no scraped target matches {promql.selector(labels)}")
    per_pod = {
        s.labels.get(pod_label, "?"): s.value
        for s in source.query(promql.increase(promql.REQUEST_SUCCESS, labels, seconds, by=pod_label), end)
    }
    metrics = records.ArmServerMetrics(
        source="prometheus",
        requests_success=_scalar(source, promql.increase(promql.REQUEST_SUCCESS, labels, seconds), end),
        generation_tokens=_scalar(source, promql.increase(promql.GENERATION_TOKENS, labels, seconds), end),
        kv_cache_usage_max=_scalar(source, promql.max_gauge(promql.KV_CACHE_USAGE, labels, seconds), end),
        prefix_cache_queries=_scalar(source, promql.increase(promql.PREFIX_QUERIES, labels, seconds), end),
        prefix_cache_hits=_scalar(source, promql.increase(promql.PREFIX_HITS, labels, seconds), end),
        extra={
            "ttftMeanMs": _ms(_scalar(source, promql.histogram_mean(promql.TTFT, labels, seconds), end)),
            "tpotMeanMs": _ms(_scalar(source, promql.histogram_mean(promql.TPOT, labels, seconds), end)),
            "requestsPerPod": per_pod,
        },
    )
    if not speculative:
        return metrics
    positions = source.query(
        promql.increase(promql.SPEC_ACCEPTED_PER_POS, labels, seconds, by="position"), end
    )
    try:
        by_position = sorted((int(s.labels.get("position", "0")), s.value) for s in positions)
    except ValueError:
        raise PrometheusBadResponse("a `position` label of the acceptance counter is not a number") from None
    return metrics.model_copy(
        update={
            "num_drafts": _scalar(source, promql.increase(promql.SPEC_DRAFTS, labels, seconds), end),
            "num_draft_tokens": _scalar(
                source, promql.increase(promql.SPEC_DRAFT_TOKENS, labels, seconds), end
            ),
            "num_accepted_tokens": _scalar(
                source, promql.increase(promql.SPEC_ACCEPTED, labels, seconds), end
            ),
            "accepted_per_position": [value for _, value in by_position],
        }
    )


def arm_gpu(source: promql.MetricsSource, selector: str, *, start: float, end: float) -> status.ArmGpu | None:
    """One arm's GPUs over a stage window (Unix times) from the DCGM exporter's series that `selector`
    picks (`telemetry.pod_selector`); None when Prometheus holds none."""
    seconds = max(1.0, end - start)
    values = {key: _scalar(source, query, end) for key, query in telemetry.queries(selector, seconds).items()}
    return telemetry.arm_gpu(values)


def kv_capacity(
    source: promql.MetricsSource, labels: Mapping[str, str], *, at: float
) -> kvcache.KVCapacity | None:
    """One arm's KV-cache capacity from its `vllm:cache_config_info` (the smallest of its pods':
    each pod's batch fits in its own cache), or None when Prometheus holds no usable series."""
    found = [
        capacity
        for sample in source.query(promql.info(kvcache.CACHE_CONFIG_METRIC, labels), at)
        if (capacity := kvcache.from_labels(sample.labels)) is not None
    ]
    return min(found, key=lambda capacity: capacity.tokens) if found else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or math.isnan(seconds) else seconds * 1000.0
