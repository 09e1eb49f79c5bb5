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
from collections.abc import Callable, Mapping, Sequence
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
        return [
            promql.Sample(labels=labels, value=value)
            for labels, value in self._series(expression, at, lambda _: expression)
        ]

    def query_many(self, expressions: Mapping[str, str], at: float) -> dict[str, list[promql.Sample]]:
        """Each of `expressions` at Unix time `at`, in one request (`promql.tagged`): its series under
        its key, without the tag."""
        answers: dict[str, list[promql.Sample]] = {key: [] for key in expressions}
        if not expressions:
            return answers

        def named(labels: Mapping[str, str]) -> str:
            return expressions.get(labels.get(promql.TAG, ""), "a query")

        for labels, value in self._series(promql.tagged(expressions), at, named):
            key = labels.pop(promql.TAG, None)
            if key in answers:
                answers[key].append(promql.Sample(labels=labels, value=value))
        return answers

    def _series(
        self, expression: str, at: float, named: Callable[[Mapping[str, str]], str]
    ) -> list[tuple[dict[str, str], float]]:
        """The answer's series as (labels, value); `named` says which expression a series answers,
        for the error of an infinite value."""
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
        found = []
        for series in answer:
            try:
                value = float(series["value"][1])
                labels = dict(series.get("metric") or {})
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                continue
            if math.isinf(value):
                raise PrometheusBadResponse(f"{self.url}: {named(labels)} is infinite")
            found.append((labels, value))
        return found


def _total(samples: Sequence[promql.Sample]) -> float | None:
    """The sum of an answer's series (NaN ones dropped), or None when it has none."""
    values = [s.value for s in samples if not math.isnan(s.value)]
    return sum(values) if values else None


def arm_queries(
    labels: Mapping[str, str], *, seconds: float, speculative: bool, pod_label: str = "pod"
) -> dict[str, str]:
    """The queries of one arm over a stage window of `seconds` (evaluated at its end), by the
    figure they answer (`arm_figures`)."""
    queries = {
        "up": promql.targets_up(labels),
        "requestsPerPod": promql.increase(promql.REQUEST_SUCCESS, labels, seconds, by=pod_label),
        "requests_success": promql.increase(promql.REQUEST_SUCCESS, labels, seconds),
        "generation_tokens": promql.increase(promql.GENERATION_TOKENS, labels, seconds),
        "kv_cache_usage_max": promql.max_gauge(promql.KV_CACHE_USAGE, labels, seconds),
        "prefix_cache_queries": promql.increase(promql.PREFIX_QUERIES, labels, seconds),
        "prefix_cache_hits": promql.increase(promql.PREFIX_HITS, labels, seconds),
        "ttftMeanMs": promql.histogram_mean(promql.TTFT, labels, seconds),
        "tpotMeanMs": promql.histogram_mean(promql.TPOT, labels, seconds),
    }
    if speculative:
        queries |= {
            "accepted_per_position": promql.increase(
                promql.SPEC_ACCEPTED_PER_POS, labels, seconds, by="position"
            ),
            "num_drafts": promql.increase(promql.SPEC_DRAFTS, labels, seconds),
            "num_draft_tokens": promql.increase(promql.SPEC_DRAFT_TOKENS, labels, seconds),
            "num_accepted_tokens": promql.increase(promql.SPEC_ACCEPTED, labels, seconds),
        }
    return queries


def arm_figures(
    answers: Mapping[str, Sequence[promql.Sample]], labels: Mapping[str, str], *, pod_label: str = "pod"
) -> records.ArmServerMetrics:
    """One arm's counter deltas and gauges from the answers to its `arm_queries`; raises
    PrometheusNoData when no target of the arm is scraped."""
    if not _total(answers.get("up", [])):
        raise PrometheusNoData(f"no scraped target matches {promql.selector(labels)}")

    def total(key: str) -> float | None:
        return _total(answers.get(key, []))

    metrics = records.ArmServerMetrics(
        source="prometheus",
        requests_success=total("requests_success"),
        generation_tokens=total("generation_tokens"),
        kv_cache_usage_max=total("kv_cache_usage_max"),
        prefix_cache_queries=total("prefix_cache_queries"),
        prefix_cache_hits=total("prefix_cache_hits"),
        extra={
            "ttftMeanMs": _ms(total("ttftMeanMs")),
            "tpotMeanMs": _ms(total("tpotMeanMs")),
            "requestsPerPod": {
                s.labels.get(pod_label, "?"): s.value for s in answers.get("requestsPerPod", [])
            },
        },
    )
    if "accepted_per_position" not in answers:
        return metrics
    try:
        by_position = sorted(
            (int(s.labels.get("position", "0")), s.value) for s in answers["accepted_per_position"]
        )
    except ValueError:
        raise PrometheusBadResponse("a `position` label of the acceptance counter is not a number") from None
    return metrics.model_copy(
        update={
            "num_drafts": total("num_drafts"),
            "num_draft_tokens": total("num_draft_tokens"),
            "num_accepted_tokens": total("num_accepted_tokens"),
            "accepted_per_position": [value for _, value in by_position],
        }
    )


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
    queries = arm_queries(labels, seconds=max(1.0, end - start), speculative=speculative, pod_label=pod_label)
    return arm_figures(promql.query_all(source, queries, end), labels, pod_label=pod_label)


def arms_gpu(
    source: promql.MetricsSource, selectors: Mapping[str, str], *, start: float, end: float
) -> dict[str, status.ArmGpu | None]:
    """Each arm's GPUs over a stage window (Unix times) from the DCGM exporter's series that its
    selector picks (`telemetry.pod_selector`), by a name of the caller's, in one request where the
    source can; None for an arm whose pods Prometheus holds no series of."""
    seconds = max(1.0, end - start)
    queries = {
        f"{arm}.{key}": query
        for arm, selector in selectors.items()
        for key, query in telemetry.queries(selector, seconds).items()
    }
    answers = promql.query_all(source, queries, end)
    return {
        arm: telemetry.arm_gpu(
            {key: _total(answers[f"{arm}.{key}"]) for key in telemetry.queries(selector, seconds)}
        )
        for arm, selector in selectors.items()
    }


def kv_capacities(
    source: promql.MetricsSource, labels: Mapping[str, Mapping[str, str]], *, at: float
) -> dict[str, kvcache.KVCapacity | None]:
    """Each arm's KV-cache capacity from its `vllm:cache_config_info` (the smallest of its pods':
    each pod's batch fits in its own cache), by a name of the caller's, in one request where the
    source can; None for an arm without a usable series."""
    answers = promql.query_all(
        source,
        {arm: promql.info(kvcache.CACHE_CONFIG_METRIC, selected) for arm, selected in labels.items()},
        at,
    )
    found = {}
    for arm, samples in answers.items():
        capacities = [c for s in samples if (c := kvcache.from_labels(s.labels)) is not None]
        found[arm] = min(capacities, key=lambda capacity: capacity.tokens) if capacities else None
    return found


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
    """Each window's server metrics from Prometheus (the load Job's direct scrape kept under extra):
    the arms' queries of a window in one request where the source can.

    `arms`: the arms that ran in these windows (`run --local` on one GPU runs them one after the other).
    """
    labels = {arm: arm_labels(names, namespace, name, arm) for arm in arms}
    updated = []
    for window in windows:
        start = anchor.wall + window.start
        end = anchor.wall + window.end
        seconds = max(1.0, end - start)
        queries = {
            f"{arm.value}.{key}": query
            for arm in arms
            for key, query in arm_queries(
                labels[arm], seconds=seconds, speculative=arm is spec.Arm.TREATMENT, pod_label=names.pod
            ).items()
        }
        answers = promql.query_all(source, queries, end)
        server = {}
        for arm in arms:
            prefix = f"{arm.value}."
            mine = {key[len(prefix) :]: found for key, found in answers.items() if key.startswith(prefix)}
            metrics = arm_figures(mine, labels[arm], pod_label=names.pod)
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
