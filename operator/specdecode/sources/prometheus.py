"""Server-side measurements from Prometheus, through `prometheus-api-client`.

`PrometheusSource` implements the core's `promql.MetricsSource`; `arm_metrics` turns the queries of
`experiment.promql` into the `ArmServerMetrics` the verdict reads, and `with_prometheus` fills each
stage window with both arms' (the operator's collection and `run --local` alike). `LabelNames`
says under which labels Prometheus keeps the arms' pod labels (`SPECDECODE_PROM_*`, set by the chart). An unreachable Prometheus raises
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
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from specdecode.experiment import kvcache, promql, records, spec, status, telemetry


@dataclass(frozen=True)
class LabelNames:
    """The Prometheus labels that hold what the arms' series are selected by: Prometheus renames the
    pods' labels as its scrape config says (the chart's PodMonitor writes these names)."""

    experiment: str = "specdecode_io_experiment"
    """Prometheus label holding the pod's `specdecode.io/experiment` label."""
    arm: str = "specdecode_io_arm"
    """Prometheus label holding the pod's `specdecode.io/arm` label."""
    namespace: str = "namespace"
    """Prometheus label holding the pod's namespace."""
    pod: str = "pod"
    """Prometheus label holding the pod's name."""
    dcgm_namespace: str = "namespace"
    """Label of NVIDIA's DCGM exporter series naming the namespace of the pod that holds the GPU
    (`exported_namespace` where Prometheus scrapes the exporter without `honor_labels`)."""
    dcgm_pod: str = "pod"
    """Label of the DCGM exporter series naming the pod that holds the GPU (`exported_pod` likewise)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LabelNames:
        """The names from `SPECDECODE_PROM_*` and `SPECDECODE_DCGM_*` variables, else the defaults."""
        env = os.environ if env is None else env
        default = cls()

        def get(key: str, fallback: str) -> str:
            return env.get(f"SPECDECODE_{key}", fallback)

        return cls(
            experiment=get("PROM_EXPERIMENT_LABEL", default.experiment),
            arm=get("PROM_ARM_LABEL", default.arm),
            namespace=get("PROM_NAMESPACE_LABEL", default.namespace),
            pod=get("PROM_POD_LABEL", default.pod),
            dcgm_namespace=get("DCGM_NAMESPACE_LABEL", default.dcgm_namespace),
            dcgm_pod=get("DCGM_POD_LABEL", default.dcgm_pod),
        )


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


def arm_labels(names: LabelNames, namespace: str, name: str, arm: spec.Arm) -> dict[str, str]:
    """The Prometheus labels of one arm's pods."""
    return {
        names.namespace: namespace,
        names.experiment: name,
        names.arm: arm.value,
    }


def with_prometheus(
    source: promql.MetricsSource,
    windows: list[records.StageWindow],
    anchor: records.RunAnchor,
    *,
    namespace: str,
    name: str,
    names: LabelNames,
    arms: Sequence[spec.Arm] = tuple(spec.Arm),
) -> list[records.StageWindow]:
    """Each window's server metrics from Prometheus (the load Job's direct scrape kept under extra).

    `arms`: the arms that ran in these windows (`run --local` on one GPU runs them one after the other).
    """
    updated = []
    for window in windows:
        start = anchor.wall + window.start
        end = anchor.wall + window.end
        server = {}
        for arm in arms:
            labels = arm_labels(names, namespace, name, arm)
            metrics = arm_metrics(
                source,
                labels,
                start=start,
                end=end,
                speculative=arm is spec.Arm.TREATMENT,
                pod_label=names.pod,
            )
            direct = window.server.get(arm)
            if direct is not None:
                metrics = metrics.model_copy(
                    update={"extra": {**metrics.extra, "direct": direct.model_dump()}}
                )
            server[arm] = metrics
        updated.append(window.model_copy(update={"server": server}))
    return updated


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or math.isnan(seconds) else seconds * 1000.0
