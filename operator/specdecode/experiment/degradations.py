"""Silent degradations: what vLLM logs at start-up when it quietly weakens speculation (#18).

vLLM starts and serves when some settings cannot be honoured, it just logs a line: async scheduling
turned off for the speculative method, the draft's context imposed on the target, a drafter that
falls back to text-only, a chat-template fallback that changes the prompts the draft sees. A
treatment that measures slower for one of those reasons is not "speculation is slower"; the
experiment says so, as the `SpeculationDegraded` condition and in the report.

Every pattern below is the message of a `logger.warning`/`logger.info` call read from the source
of the supported releases' wheels (0.20.0 and 0.33.0, `vllm/config/vllm.py`,
`vllm/config/speculative.py`, `vllm/v1/spec_decode/`, `vllm/renderers/hf.py`, `vllm/renderers/base.py`);
`releases` says where each one appears. The patterns match the message anywhere in a line, so
vLLM's prefixes (`(EngineCore_DP0 pid=1) WARNING 12-02 00:12:34 [vllm.py:816] `), colour codes and
JSON log records all match.

Pure: no I/O. Owns `status.degradations`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from specdecode.experiment.status import Degradation


class Kind(StrEnum):
    """What vLLM weakened (the condition's reason)."""

    ASYNC_SCHEDULING_DISABLED = "AsyncSchedulingDisabled"
    """The scheduler waits for each step's output before scheduling the next: the CPU gap between
    steps is back, in the treatment only."""
    MAX_MODEL_LEN_LOWERED = "MaxModelLenLowered"
    """The serving context was cut to the draft's: longer prompts are refused or truncated."""
    METHOD_FALLBACK = "MethodFallback"
    """The speculative method or its inputs were replaced by a weaker one."""
    DRAFT_LIMITED = "DraftLimited"
    """The draft runs in a configuration vLLM warns lowers acceptance or speed."""
    CHAT_TEMPLATE = "ChatTemplate"
    """The chat template failed or fell back: the prompts are not the ones the draft was trained on."""


@dataclass(frozen=True)
class Pattern:
    """One log message of vLLM that means `kind`."""

    kind: Kind
    regex: re.Pattern[str]
    releases: str
    """Where the message appears in the supported releases' source, e.g. `0.20.0 vllm/config/vllm.py`."""
    example: str
    """The message as vLLM prints it (tests and the simulator use it)."""


def _p(kind: Kind, regex: str, releases: str, example: str) -> Pattern:
    return Pattern(kind, re.compile(regex), releases, example)


PATTERNS: tuple[Pattern, ...] = (
    _p(
        Kind.ASYNC_SCHEDULING_DISABLED,
        r"Async scheduling not supported with (\S+)-based speculative decoding and will be disabled",
        "0.20.0 vllm/config/vllm.py",
        "Async scheduling not supported with ngram-based speculative decoding and will be disabled.",
    ),
    _p(
        Kind.ASYNC_SCHEDULING_DISABLED,
        r"Async scheduling is not compatible with disable_padded_drafter_batch=True and will be disabled",
        "0.20.0 vllm/config/vllm.py",
        "Async scheduling is not compatible with disable_padded_drafter_batch=True and will be disabled.",
    ),
    _p(
        Kind.ASYNC_SCHEDULING_DISABLED,
        r"Async scheduling is disabled because the V1 model runner does not support it with ([^.\"]+)",
        "0.33.0 vllm/config/vllm.py",
        "Async scheduling is disabled because the V1 model runner does not support it with "
        "suffix-based speculative decoding.",
    ),
    _p(
        Kind.ASYNC_SCHEDULING_DISABLED,
        r"Async scheduling will be disabled because it is not supported with the `(\S+)` distributed"
        r" executor backend",
        "0.20.0 and 0.33.0 vllm/config/vllm.py",
        "Async scheduling will be disabled because it is not supported with the `ray` distributed "
        "executor backend. ",
    ),
    _p(
        Kind.MAX_MODEL_LEN_LOWERED,
        r"The draft model's max_model_len \((\d+)\) is smaller than the target model's \((\d+)\) and the"
        r" V2 model runner can't skip speculation for longer sequences; reducing max_model_len to (\d+)",
        "0.33.0 vllm/config/vllm.py",
        "The draft model's max_model_len (2048) is smaller than the target model's (8192) and the V2 "
        "model runner can't skip speculation for longer sequences; reducing max_model_len to 2048.",
    ),
    _p(
        Kind.METHOD_FALLBACK,
        r"method `(\S+)` is deprecated and replaced with mtp",
        "0.20.0 and 0.33.0 vllm/config/speculative.py",
        "method `deepseek_mtp` is deprecated and replaced with mtp.",
    ),
    _p(
        Kind.METHOD_FALLBACK,
        r"Draft model does not support multimodal inputs, falling back to text-only mode",
        "0.20.0 vllm/v1/spec_decode/llm_base_proposer.py",
        "Draft model does not support multimodal inputs, falling back to text-only mode",
    ),
    _p(
        Kind.METHOD_FALLBACK,
        r"Speculative Decoding with draft models or parallel drafting does not fully support multimodal"
        r" models yet\. Proceeding with text-only speculative decoding",
        "0.33.0 vllm/v1/spec_decode/llm_base_proposer.py",
        "Speculative Decoding with draft models or parallel drafting does not fully support multimodal "
        "models yet. Proceeding with text-only speculative decoding.",
    ),
    _p(
        Kind.METHOD_FALLBACK,
        r"Draft model (\S+) does not support external multimodal embeddings",
        "0.33.0 vllm/v1/spec_decode/llm_base_proposer.py",
        "Draft model LlamaForCausalLM does not support external multimodal embeddings. Embeddings from "
        "the target model will not be passed to the drafter; using text-only draft inputs instead.",
    ),
    _p(
        Kind.DRAFT_LIMITED,
        r"Enabling num_speculative_tokens > 1 will run multiple times of forward on same MTP layer",
        "0.20.0 and 0.33.0 vllm/config/speculative.py",
        "Enabling num_speculative_tokens > 1 will run multiple times of forward on same MTP layer,which "
        "may result in lower acceptance rate",
    ),
    _p(
        Kind.DRAFT_LIMITED,
        r"(\S+) cannot currently be run with tp>1; setting speculative_draft_tensor_parallel_size=1",
        "0.20.0 vllm/config/speculative.py",
        "mlp_speculator cannot currently be run with tp>1; setting speculative_draft_tensor_parallel_size=1",
    ),
    _p(
        Kind.DRAFT_LIMITED,
        r"Very small vocabulary intersection \((\d+) tokens\)",
        "0.33.0 vllm/v1/spec_decode/vocab_mapping.py",
        "Very small vocabulary intersection (812 tokens).",
    ),
    _p(
        Kind.CHAT_TEMPLATE,
        r"Chat template warmup failed",
        "0.20.0 and 0.33.0 vllm/renderers/base.py",
        "Chat template warmup failed",
    ),
    _p(
        Kind.CHAT_TEMPLATE,
        r"Loading chat template fallback for (\S+) as there isn't one defined on HF Hub",
        "0.20.0 and 0.33.0 vllm/renderers/hf.py",
        "Loading chat template fallback for sim/llama-8b as there isn't one defined on HF Hub.",
    ),
    _p(
        Kind.CHAT_TEMPLATE,
        r"You specified `--chat-template-content-format (\S+)` which is different from the detected"
        r" format '(\S+)'",
        "0.20.0 and 0.33.0 vllm/renderers/hf.py",
        "You specified `--chat-template-content-format openai` which is different from the detected "
        "format 'string'. If our automatic detection is incorrect, please consider opening a GitHub "
        "issue so that we can improve it: https://github.com/vllm-project/vllm/issues/new/choose",
    ),
)

#: the first example line of each kind (what the simulator prints when asked for that kind)
EXAMPLES: dict[Kind, str] = {}
for _pattern in PATTERNS:
    EXAMPLES.setdefault(_pattern.kind, _pattern.example)

#: ANSI colour codes (vLLM's ColoredFormatter when the log goes to a terminal)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: the longest message kept in status
MAX_MESSAGE = 300


def match(line: str) -> Pattern | None:
    """The pattern whose message the line carries, if any."""
    clean = _ANSI.sub("", line).rstrip()
    return next((p for p in PATTERNS if p.regex.search(clean)), None)


def scan(lines: Iterable[str]) -> list[Degradation]:
    """Each degradation the log reports, once (first occurrence), in log order."""
    found: list[Degradation] = []
    seen: set[str] = set()
    for line in lines:
        pattern = match(line)
        if pattern is None:
            continue
        clean = _ANSI.sub("", line).strip()
        hit = pattern.regex.search(clean)
        message = clean[hit.start() :] if hit is not None else clean
        message = message[:MAX_MESSAGE]
        if message in seen:
            continue
        seen.add(message)
        found.append(Degradation(kind=pattern.kind.value, message=message))
    return found


def summary(found: Iterable[Degradation]) -> str:
    """One line for the condition and the terminal: `AsyncSchedulingDisabled: Async scheduling ...; ...`."""
    return "; ".join(f"{d.kind}: {d.message}" for d in found)
