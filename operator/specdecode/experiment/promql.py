"""PromQL for the server-side measurements of one arm over one stage window. Pure.

Series are selected by the arm's pod labels (as Prometheus' Kubernetes service discovery copies
them), per pod, never through the Service: with several replicas each pod's counters are summed.
Counters are compared with `increase()` over the stage window evaluated at its end; the window is
widened by one scrape interval so the first and last samples of the stage are inside it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
REQUEST_SUCCESS = "vllm:request_success_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
#: prompt tokens looked up in / served from the prefix cache (vllm-0.33-facts §3; hit rate = hits / queries)
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"


@dataclass(frozen=True)
class Sample:
    """One series of an instant-query answer."""

    labels: Mapping[str, str]
    value: float


class MetricsSource(Protocol):
    """Anything that answers an instant PromQL query (Prometheus, or a fake in tests)."""

    def query(self, promql: str, at: float) -> list[Sample]:
        """Evaluate `promql` at Unix time `at`."""
        ...


@runtime_checkable
class BatchedSource(Protocol):
    """A source that answers several instant queries in one request (`PrometheusSource`)."""

    def query_many(self, expressions: Mapping[str, str], at: float) -> dict[str, list[Sample]]:
        """Evaluate each of `expressions` at Unix time `at`: its answer under its key."""
        ...


#: The label `tagged` gives each expression's series: the expression's key.
TAG = "specdecode_query"
_KEY = re.compile(r"[A-Za-z0-9_.:/-]+")


def tagged(expressions: Mapping[str, str]) -> str:
    """Several instant queries as one: each expression's series labelled `TAG="<its key>"`
    (`label_replace` from the empty label, which every series has) and joined with `or`. The keys
    differ, so no expression's series hides another's; `or` binds loosest, so each expression is
    whole inside its `label_replace`."""
    parts = []
    for key, expression in expressions.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"a query's key must match {_KEY.pattern}: {key!r}")
        parts.append(f'label_replace({expression}, "{TAG}", "{key}", "", "")')
    return " or ".join(parts)


def query_all(source: MetricsSource, expressions: Mapping[str, str], at: float) -> dict[str, list[Sample]]:
    """Each expression's answer at `at`: in one request where the source can batch them (a
    collection asks ~30 queries, and each request costs the operator a few ms of CPU), else one by one."""
    if isinstance(source, BatchedSource):
        return source.query_many(expressions, at)
    return {key: source.query(expression, at) for key, expression in expressions.items()}


def selector(labels: Mapping[str, str]) -> str:
    """`{a="x",b="y"}` with PromQL string escaping."""
    escaped = (
        f'{key}="{value.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for key, value in labels.items()
    )
    return "{" + ",".join(escaped) + "}"


def window(seconds: float, scrape_interval: float = 1.0) -> str:
    """A range covering the stage plus one scrape interval on each side, in whole seconds."""
    return f"{max(1, math.ceil(seconds + 2 * scrape_interval))}s"


def increase(metric: str, labels: Mapping[str, str], seconds: float, *, by: str = "") -> str:
    """Sum over the arm's pods of a counter's increase over the window."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping}(increase({metric}{selector(labels)}[{window(seconds)}]))"


def histogram_mean(metric: str, labels: Mapping[str, str], seconds: float) -> str:
    """Mean of a histogram over the window (sum / count), in the histogram's unit."""
    return f"{increase(metric + '_sum', labels, seconds)} / {increase(metric + '_count', labels, seconds)}"


def max_gauge(metric: str, labels: Mapping[str, str], seconds: float) -> str:
    """Highest value of a gauge over the window, across the arm's pods."""
    return f"max(max_over_time({metric}{selector(labels)}[{window(seconds)}]))"


def targets_up(labels: Mapping[str, str], *, pods: tuple[str, Sequence[str]] | None = None) -> str:
    """How many of the arm's pods Prometheus scrapes successfully; with `pods` (the pod label's name,
    the pods' names), only those pods: a round's restarted arm is not counted scraped on its old
    pod's target."""
    matchers = selector(labels)
    if pods is not None:
        label, names = pods
        alternatives = "|".join(name.replace(".", "\\\\.") for name in names)
        matchers = f'{matchers[:-1]},{label}=~"{alternatives}"}}'
    return f"sum(up{matchers})"


def info(metric: str, labels: Mapping[str, str]) -> str:
    """The arm's series of an info gauge, labels and all (one per pod)."""
    return f"{metric}{selector(labels)}"
