"""What each supported vLLM release accepts: serve flags, speculative-config keys and values, methods.

Production clusters run many vLLM releases at once, so the release is part of the experiment
(`spec.engine.vllmVersion`; else the image's release tag; in `run --local` the local `vllm --version`;
else the newest supported release, said in the status). Rendering (`manifests.serve_args`),
validation (`speculative_rules.check_speculative`) and the recommendation (`recommendation.recommend`) read this
one table and nothing else about releases.

Every fact below was read from the source of each release's wheel, 0.20.0 to 0.33.0 (vllm/config/
speculative.py, vllm/engine/arg_utils.py, vllm/config/observability.py, vllm/utils/argparse_utils.py),
and the oldest and newest release's own parser checks the rendered command lines in
tests/conformance. The release that introduced a thing is its first minor release that has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from specdecode.experiment import spec

Version = tuple[int, int, int]

OLDEST: Version = (0, 20, 0)
"""The oldest supported release (the one whose torch matches the H200 image of 2026-12)."""
NEWEST: Version = (0, 33, 0)
"""The newest supported release; its rules apply when the release cannot be known."""

PER_REQUEST_SPEC_METRICS_SINCE: Version = (0, 29, 0)
"""`--per-request-spec-decode-metrics` (per-request acceptance in each response's `metrics`)."""
BATCH_SCHEDULE_SINCE: Version = (0, 24, 0)
"""`num_speculative_tokens_per_batch_size`: k by running batch size (0 turns speculation off)."""

# SpeculativeConfig keys (settable through spec.speculative.extra) that are not in every supported
# release: key -> (first release with it, first release without it or None).
_KEY_RANGE: dict[str, tuple[Version, Version | None]] = {
    "speculative_token_tree": (OLDEST, (0, 21, 0)),
    "attention_backend": ((0, 21, 0), None),
    "draft_sample_method": ((0, 21, 0), None),
    "num_speculative_tokens_per_batch_size": (BATCH_SCHEDULE_SINCE, None),
    "use_heterogeneous_vocab": ((0, 25, 0), None),
    "kv_cache_dtype": ((0, 26, 0), None),
    "enable_adaptive_verification": ((0, 28, 0), None),
    "dspark_draft_topk": ((0, 28, 0), None),
    "index_share_for_mtp_iteration": ((0, 29, 0), None),
    "disable_eagle_block_drop": ((0, 30, 0), None),
    "disable_lookahead_block_hashes": ((0, 33, 0), None),
    "draft_lm_head_quantization": ((0, 33, 0), None),
    "xpress_topc": ((0, 33, 0), None),
    "fly_window_size": ((0, 33, 0), None),
    "fly_entropy_threshold": ((0, 33, 0), None),
    "fly_entropy_top_k": ((0, 33, 0), None),
}

# `method` values that are not in every supported release (all others are in 0.20 to 0.33).
_METHOD_SINCE: dict[str, Version] = {
    "custom_class": (0, 22, 0),
    "dspark": (0, 25, 0),
    "mimo_v2_mtp": (0, 21, 0),
    "gemma4_mtp": (0, 21, 0),
    "minimax_m3_mtp": (0, 24, 0),
    "bailing_hybrid_mtp": (0, 25, 0),
    "inkling_mtp": (0, 26, 0),
    "kimi_k3_mtp": (0, 27, 0),
    "dots3_note_mtp": (0, 28, 0),
    "bailing_hybrid_v3_mtp": (0, 28, 0),
    "qwen4_exp_mtp": (0, 29, 0),
    "hy_v4_mtp": (0, 29, 0),
    "glm5_next_mtp": (0, 30, 0),
    "step5_mtp": (0, 33, 0),
}

# `rejection_sample_method` values, by the release that changed the list ("standard" was "strict").
_REJECTION_METHODS: tuple[tuple[Version, tuple[str, ...]], ...] = (
    (OLDEST, ("strict", "probabilistic", "synthetic")),
    ((0, 21, 0), ("standard", "synthetic")),
    ((0, 25, 0), ("standard", "synthetic", "block")),
    ((0, 33, 0), ("standard", "synthetic", "block", "fly")),
)

# `draft_sample_method` values (the key exists from 0.21).
_DRAFT_SAMPLE_METHODS: tuple[tuple[Version, tuple[str, ...]], ...] = (
    ((0, 21, 0), ("greedy", "gumbel")),
    ((0, 22, 0), ("greedy", "probabilistic")),
)

_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post\d+)?$")


class Source(StrEnum):
    """Where the release came from."""

    SPEC = "spec.engine.vllmVersion"
    """Given by the user."""
    IMAGE_TAG = "image tag"
    """The release tag of `spec.engine.image`."""
    LOCAL = "vllm --version"
    """The local vLLM of `run --local`."""
    SIMULATOR = "simulator"
    """The built-in simulator, which speaks the newest release."""
    ASSUMED = "assumed"
    """Unknown: the newest supported release's rules apply."""


def parse(text: str) -> Version | None:
    """`0.20.0`, `v0.33.0`, `0.27` or `0.20.1.post1` -> (0, 20, 0), ...; None for anything else."""
    match = _RELEASE.match(text.strip())
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def image_release(image: str) -> Version | None:
    """The release of an image whose tag is a release tag (`vllm/vllm-openai:v0.33.0`)."""
    reference = image.split("@", 1)[0]
    name, _, tag = reference.rpartition(":")
    if not name or "/" in tag:  # no tag, or the colon was a registry port
        return None
    return parse(tag)


def fmt(version: Version) -> str:
    """(0, 20, 0) -> '0.20.0'."""
    return ".".join(str(part) for part in version)


def minor(version: Version) -> str:
    """(0, 24, 0) -> '0.24': how messages name a release line."""
    return f"{version[0]}.{version[1]}"


@dataclass(frozen=True)
class Release:
    """The vLLM release an experiment's arms run, and what it accepts."""

    version: Version
    source: Source

    @property
    def known(self) -> bool:
        """False when the newest rules were assumed."""
        return self.source is not Source.ASSUMED

    @property
    def supported(self) -> bool:
        """Inside the range this project renders and validates for."""
        return OLDEST[:2] <= self.version[:2] <= NEWEST[:2]

    @property
    def rules(self) -> Version:
        """The release whose rules apply: itself, or the nearest supported one."""
        return min(max(self.version, OLDEST), NEWEST)

    def describe(self) -> str:
        """One line for status and terminal, e.g. `0.20.0 (image tag)`."""
        if not self.known:
            return (
                f"{fmt(self.version)} (assumed: the release is unknown, so the newest supported rules apply; "
                "set spec.engine.vllmVersion)"
            )
        if self.version[:2] > NEWEST[:2]:
            return f"{fmt(self.version)} ({self.source.value}; newer than {fmt(NEWEST)}, whose rules apply)"
        return f"{fmt(self.version)} ({self.source.value})"

    @property
    def per_request_spec_metrics(self) -> bool:
        """`--per-request-spec-decode-metrics summary` exists (else acceptance comes from the counters)."""
        return self.rules >= PER_REQUEST_SPEC_METRICS_SINCE

    @property
    def batch_schedule(self) -> bool:
        """`num_speculative_tokens_per_batch_size` exists."""
        return self.rules >= BATCH_SCHEDULE_SINCE

    def has_key(self, key: str) -> bool:
        """A SpeculativeConfig key (settable through `extra`) exists in this release."""
        since, until = _KEY_RANGE.get(key, (OLDEST, None))
        return since <= self.rules and (until is None or self.rules < until)

    def key_range(self, key: str) -> str:
        """Which releases have the key, for error messages: `>= 0.24` or `< 0.21`."""
        since, until = _KEY_RANGE.get(key, (OLDEST, None))
        if until is not None:
            return f"vLLM < {minor(until)}"
        return f"vLLM >= {minor(since)}"

    def has_method(self, method: spec.SpeculativeMethod) -> bool:
        """The method exists in this release."""
        return self.rules >= _METHOD_SINCE.get(method.value, OLDEST)

    def method_since(self, method: spec.SpeculativeMethod) -> str:
        """The first release with the method, e.g. `0.25`."""
        return minor(_METHOD_SINCE.get(method.value, OLDEST))

    @property
    def rejection_methods(self) -> tuple[str, ...]:
        """Allowed `rejection_sample_method` values; the first is the lossless default."""
        return _latest(_REJECTION_METHODS, self.rules)

    @property
    def draft_sample_methods(self) -> tuple[str, ...]:
        """Allowed `draft_sample_method` values (empty before the key existed)."""
        return _latest(_DRAFT_SAMPLE_METHODS, self.rules)

    @property
    def short(self) -> str:
        """`vLLM 0.20` for messages."""
        return f"vLLM {minor(self.rules)}"


def _latest(table: tuple[tuple[Version, tuple[str, ...]], ...], version: Version) -> tuple[str, ...]:
    values: tuple[str, ...] = ()
    for since, names in table:
        if since <= version:
            values = names
    return values


def resolve(engine: spec.EngineSpec, *, local: str | None = None, here: bool = False) -> Release:
    """The release of an experiment: the spec's, the local vLLM's, the image tag's, or the newest assumed.

    `local` is `vllm --version` of `run --local` on real engines; `here` says the arms run on this
    machine, where no image runs, so its tag says nothing. The simulator speaks the newest release
    unless the spec names one (which the simulator then follows).
    """
    if engine.vllm_version is not None:
        version = parse(engine.vllm_version)
        if version is not None:
            return Release(version, Source.SPEC)
    if engine.simulator is not None:
        return Release(NEWEST, Source.SIMULATOR)
    if local is not None and (version := parse(local)) is not None:
        return Release(version, Source.LOCAL)
    if not here and (version := image_release(engine.image)) is not None:
        return Release(version, Source.IMAGE_TAG)
    return Release(NEWEST, Source.ASSUMED)
