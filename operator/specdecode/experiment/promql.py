"""PromQL for the server-side measurements of one arm over one stage window. Pure.

Series are selected by the arm's pod labels (as Prometheus' Kubernetes service discovery copies
them), per pod, never through the Service: with several replicas each pod's counters are summed.
Counters are compared with `increase()` over the stage window evaluated at its end; the window is
widened by one scrape interval so the first and last samples of the stage are inside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

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
