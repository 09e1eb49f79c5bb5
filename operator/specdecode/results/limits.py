"""The results' errors and size limits: what the operator reads, and what an experiment may plan to store.

`check_size` runs at validation, before anything is deployed, against the budget of the store the
operator is configured with (`Limits.store_bytes`): ConfigMaps by default, an S3 bucket when one is
configured (`s3.py`). Whatever the store, the operator inflates at most `Limits.max_bytes` of one
bundle (its memory while judging grows with this).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdecode.experiment import spec

# ConfigMaps are limited to 1 MiB in total; base64 grows data by 4/3, so 700 KiB of bundle per part.
PART_BYTES = 700 * 1024
SAMPLE_PAIRS = 3
"""Pairs a stage whose texts are kept even when they agree (to eyeball in the report)."""


class ResultsError(Exception):
    """The results cannot be used; `reason` is the experiment's status reason."""

    reason = "ResultsMissing"
    transient = False
    """True: retried within the operator's analysis grace (an object store that did not answer)."""


class ResultsMissing(ResultsError):
    """The load Job stored nothing, or not every part."""

    reason = "ResultsMissing"


class ResultsUntrusted(ResultsError):
    """A part that this generation's load Job did not write."""

    reason = "ResultsUntrusted"


class ResultsTooLarge(ResultsError):
    """More than the operator reads."""

    reason = "ResultsTooLarge"


class ResultsCorrupt(ResultsError):
    """The parts do not hash, inflate or parse to one bundle."""

    reason = "ResultsCorrupt"


class ResultsUnsupported(ResultsError):
    """A bundle format this operator does not read (a load image newer than the operator)."""

    reason = "ResultsUnsupported"


CONFIG_MAP_MAX_BYTES = 48 * 1024 * 1024
"""The most results that go through ConfigMaps, inflated (`SPECDECODE_RESULTS_CONFIGMAP_MAX_BYTES`):
each experiment then keeps up to ~`max_parts` ConfigMaps of up to 1 MiB in etcd. Beyond it, the S3
store (`s3.py`)."""


@dataclass(frozen=True)
class Limits:
    """How much of the results the operator reads (its memory while judging grows with this), and
    how much an experiment may plan to store where the operator keeps results."""

    max_bytes: int = 48 * 1024 * 1024
    """The bundle, uncompressed (`SPECDECODE_RESULTS_MAX_BYTES`), whatever the store."""
    config_map_bytes: int = CONFIG_MAP_MAX_BYTES
    """The results through ConfigMaps, uncompressed (`SPECDECODE_RESULTS_CONFIGMAP_MAX_BYTES`)."""
    s3: bool = False
    """The results go to the S3 store (chart values `resultsStore.s3`), not to ConfigMaps."""

    @property
    def max_parts(self) -> int:
        """Gzip of incompressible data is barely larger than the data: one part more covers it."""
        return self.max_bytes // PART_BYTES + 2

    @property
    def store_bytes(self) -> int:
        """What an experiment's planned results may inflate to in the configured store: the S3 store's
        own limit (5 GiB an object) is far above what the operator reads, so `max_bytes` there."""
        return self.max_bytes if self.s3 else min(self.max_bytes, self.config_map_bytes)


# A packed record (version 2): 267 bytes of typed columns (int64/float64 numbers, int32 string
# codes) and ~33 of its text hash in the hash table (one hash per agreeing pair). A lower bound:
# request and prompt ids, the acceptance histogram and the texts of mismatched pairs add to it
# (tests/results: within 2x of a measured bundle).
RECORD_BYTES = 300
# The texts kept of `SAMPLE_PAIRS` pairs a stage: at least 3 bytes a token of JSON text.
TOKEN_BYTES = 3


def planned_bytes(experiment: spec.ExperimentSpec) -> int:
    """At least how large the load Job's results inflate to when no stage stops early."""
    workload = experiment.workload
    texts = 2 * SAMPLE_PAIRS * len(workload.stages) * workload.sampling.max_tokens * TOKEN_BYTES
    return 2 * _planned_requests(experiment) * RECORD_BYTES + texts


def _planned_requests(experiment: spec.ExperimentSpec) -> int:
    """Requests sent to each arm when no stage stops early (warm-up included)."""
    workload = experiment.workload
    return workload.warmup_requests + sum(experiment.stage_requests(s) for s in workload.stages)


def check_size(experiment: spec.ExperimentSpec, limits: Limits) -> str | None:
    """Why the experiment's results could outgrow what the operator reads (None: they cannot).

    Checked before anything is deployed: better than hours of GPUs ending in ResultsTooLarge.
    """
    planned = planned_bytes(experiment)
    if planned <= limits.store_bytes:
        return None
    workload = experiment.workload
    size = (
        f"spec.workload: up to {mib(planned)} of packed results ({_planned_requests(experiment)} "
        "requests to each arm: "
        f"{len(workload.stages)} stage(s) of up to {workload.requests_per_stage} requests, and "
        f"{workload.warmup_requests} warm-up)"
    )
    lower = "lower requestsPerStage or the number of stages"
    if planned <= limits.max_bytes:  # within what the operator reads, beyond what it keeps in ConfigMaps
        return (
            f"{size}, more than the {mib(limits.config_map_bytes)} the operator stores in ConfigMaps "
            f"(SPECDECODE_RESULTS_CONFIGMAP_MAX_BYTES, the chart's resultsStore.configMaps.maxBytes); "
            f"{lower}, or give the operator an S3 bucket for results (the chart's resultsStore.s3)"
        )
    where = "from its S3 store" if limits.s3 else f"in up to {limits.max_parts} ConfigMaps"
    return (
        f"{size}, more than the {mib(limits.max_bytes)} the operator reads "
        f"(SPECDECODE_RESULTS_MAX_BYTES) {where}; {lower}, or raise that limit with the operator's memory"
    )


def too_large(max_bytes: int) -> ResultsTooLarge:
    return ResultsTooLarge(
        f"the results inflate to more than {mib(max_bytes)} (the operator's "
        "SPECDECODE_RESULTS_MAX_BYTES); lower spec.workload.requestsPerStage, the number "
        "of stages or sampling.maxTokens, or raise that limit with the operator's memory"
    )


def mib(n: int) -> str:
    return f"{n / 1024 / 1024:.0f} MiB"
