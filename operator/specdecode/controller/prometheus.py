"""Server-side measurements from Prometheus, through `prometheus-api-client`.

`PrometheusSource` implements the core's `promql.MetricsSource`; `arm_metrics` turns the queries of
`experiment.promql` into the `ArmServerMetrics` the verdict reads. An unreachable Prometheus raises
`PrometheusUnavailable` (transient: retried); a Prometheus that does not scrape the arm's pods gives
`PrometheusNoData` (the experiment fails: it could not measure).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from specdecode.experiment import promql, records


class PrometheusUnavailable(Exception):
    """Prometheus did not answer."""


class PrometheusNoData(Exception):
    """Prometheus answered but holds nothing for the arm's pods."""


class PrometheusSource:
    """Instant queries against one Prometheus server."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url
        self._client = PrometheusConnect(url=url, disable_ssl=False, retry=None, timeout=timeout)

    def query(self, expression: str, at: float) -> list[promql.Sample]:
        """Evaluate at Unix time `at`."""
        try:
            answer = self._client.custom_query(expression, params={"time": f"{at:.3f}"})
        except (requests.RequestException, PrometheusApiClientException) as exc:
            raise PrometheusUnavailable(f"{self.url}: {exc}") from None
        samples = []
        for series in answer or []:
            try:
                value = float(series["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            samples.append(promql.Sample(labels=series.get("metric", {}), value=value))
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
    by_position = sorted((int(s.labels.get("position", "0")), s.value) for s in positions)
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


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or math.isnan(seconds) else seconds * 1000.0
