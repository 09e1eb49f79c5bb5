"""An arm's KV-cache capacity, read from what vLLM exposes (issue #18: the draft's memory cost).

Pure: text in, numbers out. Two sources, both of vLLM 0.33 (reference:
shared/reference/vllm-0.33-facts.md §3):

- the info gauge `vllm:cache_config_info` on `/metrics`, whose labels are the CacheConfig fields
  (`num_gpu_blocks`, `block_size`, ...) and whose value is 1;
  Prometheus keeps those labels, so the operator reads the same series through it (`from_labels`);
- the start-up line of `vllm/v1/core/kv_cache_utils.py`, logged once:
  `GPU KV cache size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x`
  (older releases log the two halves as two lines; both forms are read).

`max_concurrency` turns a capacity into the largest batch of requests of a given length
(prompt + output tokens) that fits at once, rounding each request up to whole blocks as vLLM
allocates them. `summary` words the draft's cost for the report (status fields read:
`environment.arms.<arm>.kvCacheTokens`, `.maxConcurrency`; the stages' verdict and batch size).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specdecode.experiment import spec, status

CACHE_CONFIG_METRIC = "vllm:cache_config_info"

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SIZE = re.compile(r"KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


@dataclass(frozen=True)
class KVCapacity:
    """One arm's KV cache."""

    tokens: int
    """Tokens the cache holds (num_gpu_blocks x block_size)."""
    block_size: int | None = None
    """Tokens per block; None when only the log line was read."""

    def max_concurrency(self, tokens_per_request: int) -> int:
        """How many requests of `tokens_per_request` tokens (prompt + output) fit at once."""
        if tokens_per_request <= 0:
            raise ValueError("tokens_per_request must be positive")
        per_request = tokens_per_request
        if self.block_size:
            per_request = math.ceil(tokens_per_request / self.block_size) * self.block_size
        return self.tokens // per_request


def from_metrics(text: str) -> KVCapacity | None:
    """The capacity in a `/metrics` scrape, or None if it has no usable `vllm:cache_config_info`."""
    for line in text.splitlines():
        if not line.startswith(CACHE_CONFIG_METRIC + "{"):
            continue
        return from_labels(dict(_LABEL.findall(line[: line.rfind("}") + 1])))
    return None


def from_labels(labels: Mapping[str, str]) -> KVCapacity | None:
    """The capacity in the labels of one `vllm:cache_config_info` series (a scrape's line, or the
    series Prometheus returns for it), or None if they hold no usable block count."""
    try:
        blocks = int(labels["num_gpu_blocks"])
        block_size = int(labels["block_size"])
    except (KeyError, ValueError):
        return None  # e.g. num_gpu_blocks="None" before the engine profiled memory
    if blocks <= 0 or block_size <= 0:
        return None
    return KVCapacity(tokens=blocks * block_size, block_size=block_size)


def with_capacity(host: status.Host, capacity: KVCapacity | None, request_tokens: int | None) -> status.Host:
    """`host` with the arm's KV-cache capacity and, for requests of `request_tokens` tokens, how many it
    holds at once (`environment.arms.<arm>.kvCacheTokens`, `.maxConcurrency`); unchanged without one."""
    if capacity is None:
        return host
    held = capacity.max_concurrency(request_tokens) if request_tokens is not None else None
    return host.model_copy(update={"kv_cache_tokens": capacity.tokens, "max_concurrency": held})


def from_log(text: str) -> KVCapacity | None:
    """The capacity in a vLLM start-up log, or None if the line is not there.

    Without the "KV cache size" half, the tokens are max_model_len x the concurrency factor (the
    factor is rounded to 2 decimals, so this is approximate)."""
    size = _SIZE.search(text)
    if size:
        return KVCapacity(tokens=int(size.group(1).replace(",", "")))
    conc = _CONCURRENCY.search(text)
    if conc:
        max_model_len = int(conc.group(1).replace(",", ""))
        return KVCapacity(tokens=int(max_model_len * float(conc.group(2))))
    return None


def draft_share(control: KVCapacity, treatment: KVCapacity) -> float:
    """Fraction of the control's KV cache the treatment lacks (the draft's cost; 0 if none)."""
    if control.tokens <= 0:
        raise ValueError("control capacity must be positive")
    return max(0.0, 1.0 - treatment.tokens / control.tokens)


def request_tokens(workload: spec.WorkloadSpec) -> int | None:
    """Tokens one request of the workload holds at its end (prompt + output), when the spec fixes
    them (a synthetic dataset); None for prompts of varying length."""
    dataset = workload.dataset
    if isinstance(dataset, spec.SyntheticDataset):
        return dataset.input_tokens + dataset.output_tokens
    return None


def summary(hosts: status.ArmHosts | None, stages: Sequence[status.StageResult]) -> list[str]:
    """The draft's memory cost in words: one line when both arms' capacities are known, plus one per
    failing stage whose running requests exceed what the treatment's KV cache holds."""
    control = hosts.control if hosts is not None else None
    treatment = hosts.treatment if hosts is not None else None
    if (
        control is None
        or treatment is None
        or not control.kv_cache_tokens
        or treatment.kv_cache_tokens is None
    ):
        return []
    share = draft_share(KVCapacity(control.kv_cache_tokens), KVCapacity(treatment.kv_cache_tokens))
    line = (
        f"memory: the draft takes {share:.0%} of the KV cache "
        f"({treatment.kv_cache_tokens:,} of {control.kv_cache_tokens:,} tokens)"
    )
    held, control_held = treatment.max_concurrency, control.max_concurrency
    if held is None or control_held is None:
        return [line]
    lines = [
        f"{line}: the treatment holds at most {held:,} running requests of this workload's length "
        f"(control {control_held:,})"
    ]
    for s in stages:
        if s.verdict == status.StageVerdict.FAIL and s.batch_size is not None and s.batch_size > held:
            lines.append(
                f"stage {s.name}: about {s.batch_size:.0f} running requests exceed the {held:,} the "
                f"treatment's KV cache holds (control {control_held:,}): the capacity the draft takes "
                "is the likely cause of the loss"
            )
    return lines
