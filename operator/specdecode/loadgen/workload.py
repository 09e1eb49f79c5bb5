"""Prompts and request bodies: what each request of each stage sends (to both arms, byte for byte).

Prompt sources (spec.workload.dataset):
- `synthetic`: English-like text of about `inputTokens` tokens (one common word ≈ one token; the
  server's `usage.prompt_tokens` records the real count) drawn from (seed, stage, index).
- `jsonl`: one object per line, `{"prompt": str}` (→ /v1/completions) or `{"messages": [...]}`
  (→ /v1/chat/completions), optional `category` and `id`.
- `builtin`: `data/<name>.jsonl` shipped in the package, in the `jsonl` format: `mixed` (ours: chat,
  code, summarisation, math), `real-mixed` (the four real-text sets, 40 of each category),
  `humaneval` (code), `gsm8k` (math), `self-instruct` (chat) and `peps` (summarisation); sources,
  licences and sampling in `data/LICENSES.md` (built by `hack/datasets.py`).
- `trace`: a request trace (`trace.py`): prompts or prompt lengths, output lengths and the send
  times of open-loop stages.
- `multiTurn`: conversations (`sessions.py`), one request per user turn, later turns repeating
  earlier ones.

Invariants:
- Every request's prompt starts with a nonce unique to (salt, stage, index): no two requests of a
  run share a prefix-cache block, across stages too (loadgen-anchors (c)13). Multi-turn sessions
  are the one exception, by design: the nonce is unique to (salt, stage, session), so the turns of
  one session share their prefix and no two sessions do.
- Warm-up prompts are taken from the dataset first and never reused by measured stages (when the
  dataset has more items than warm-up requests; the nonce keeps them byte-distinct regardless).
- Bodies: greedy by default, fixed `max_tokens`, `ignore_eos`, `stream` with
  `include_usage` and `continuous_usage_stats`, a per-request `seed`; never `min_p`/`logit_bias`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from specdecode.experiment import spec as spec_mod

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

# Common English words that are single tokens (with their leading space) in the usual BPE vocabularies.
# fmt: off
_WORDS = [
    "the", "of", "and", "to", "in", "is", "that", "it", "for", "on", "with", "as", "was", "at", "by",
    "be", "this", "from", "or", "have", "an", "are", "not", "but", "they", "which", "one", "you", "were",
    "all", "we", "her", "she", "there", "would", "their", "will", "when", "who", "him", "been", "has",
    "more", "if", "no", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them", "can",
    "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do", "first", "any",
    "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "made", "after", "also",
    "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well",
    "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state",
    "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here",
    "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while",
    "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came",
    "right", "used", "take", "three", "small", "house", "water", "light", "night", "city", "river",
    "place",
]
# fmt: on


@dataclass(frozen=True)
class Item:
    """One dataset entry."""

    id: str
    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    category: str | None = None


@dataclass(frozen=True)
class PreparedRequest:
    """One request of a stage, as sent to both arms."""

    index: int
    prompt_id: str
    category: str | None
    path: str
    body: bytes
    seed: int
    session: int | None = None
    """Multi-turn sessions (`sessions.py`): the session within the stage."""
    turn: int | None = None
    """Multi-turn sessions: the turn within the session, from 1."""


class DatasetError(ValueError):
    """The prompt file is unreadable or has a bad line."""


def json_lines(text: str, *, source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of a JSONL file (prompts, a trace, conversations);
    a line that is not a JSON object is a `DatasetError` naming `source:line`."""
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{source}:{n}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{source}:{n}: expected an object")
        yield n, obj


def read_jsonl(text: str, *, source: str) -> list[Item]:
    """Parse a JSONL prompt file."""
    items: list[Item] = []
    for n, obj in json_lines(text, source=source):
        prompt, messages = obj.get("prompt"), obj.get("messages")
        if (prompt is None) == (messages is None):
            raise DatasetError(f"{source}:{n}: needs exactly one of 'prompt' or 'messages'")
        if prompt is not None and not isinstance(prompt, str):
            raise DatasetError(f"{source}:{n}: 'prompt' must be a string")
        if messages is not None and not (
            isinstance(messages, list)
            and messages
            and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
        ):
            raise DatasetError(f"{source}:{n}: 'messages' must be a non-empty list of {{role, content}}")
        category = obj.get("category")
        items.append(
            Item(
                id=str(obj.get("id", f"{Path(source).name}:{n}")),
                prompt=prompt,
                messages=tuple(messages) if messages is not None else None,
                category=str(category) if category is not None else None,
            )
        )
    if not items:
        raise DatasetError(f"{source}: holds no prompt")
    return items


def builtin(name: str) -> list[Item]:
    """A dataset shipped with the package."""
    text = resources.files("specdecode.loadgen").joinpath("data", f"{name}.jsonl").read_text(encoding="utf-8")
    return read_jsonl(text, source=f"builtin:{name}")


def load_items(
    dataset: spec_mod.JsonlDataset | spec_mod.BuiltinDataset, base_dir: Path, dataset_file: Path | None = None
) -> list[Item]:
    """The items of a non-synthetic dataset (`dataset_file` overrides, e.g. a mounted ConfigMap)."""
    if isinstance(dataset, spec_mod.BuiltinDataset) and dataset_file is None:
        return builtin(dataset.name)
    path = dataset.path if isinstance(dataset, spec_mod.JsonlDataset) else None
    text, source = dataset_text(path, base_dir, dataset_file, what="dataset")
    return read_jsonl(text, source=source)


def dataset_text(
    path: str | None, base_dir: Path, dataset_file: Path | None, *, what: str
) -> tuple[str, str]:
    """The text of a dataset's file and its name for errors: `dataset_file` (the mounted ConfigMap key,
    which wins) or `path` relative to `base_dir`; `what` names the dataset in the error without either."""
    if dataset_file is None:
        if path is None:
            raise DatasetError(f"a configMap {what} needs --dataset-file (the mounted ConfigMap key)")
        dataset_file = base_dir / path
    try:
        return dataset_file.read_text(encoding="utf-8"), str(dataset_file)
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{dataset_file}: cannot read: {exc}") from None


def nonce(salt: str, stage: str, index: int) -> str:
    """The unique prompt prefix of one request."""
    digest = hashlib.sha256(f"{salt}:{stage}:{index}".encode()).hexdigest()[:12]
    return f"[{digest}] "


def request_seed(seed: int, stage: str, index: int) -> int:
    """The per-request sampling seed (same in both arms)."""
    return (
        int.from_bytes(hashlib.sha256(f"{seed}:{stage}:{index}:seed".encode()).digest()[:4], "big")
        & 0x7FFFFFFF
    )


def synthetic_text(seed: int, stage: str, index: int, words: int) -> str:
    """About `words` tokens of English-like filler, deterministic in (seed, stage, index)."""
    rng = random.Random(f"{seed}:{stage}:{index}:text")
    return " ".join(rng.choice(_WORDS) for _ in range(max(words, 1)))


def body(
    *,
    model: str,
    sampling: spec_mod.Sampling,
    seed: int,
    prompt: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    max_tokens: int | None = None,
) -> bytes:
    """The JSON body of one streamed request."""
    obj: dict[str, Any] = {"model": model}
    if messages is not None:
        obj["messages"] = messages
    else:
        obj["prompt"] = prompt
    obj.update(
        max_tokens=max_tokens if max_tokens is not None else sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=seed,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    if sampling.ignore_eos:
        obj["ignore_eos"] = True
    return json.dumps(obj, separators=(",", ":")).encode()


def synthetic_request(
    *,
    model: str,
    sampling: spec_mod.Sampling,
    dataset: spec_mod.SyntheticDataset,
    seed: int,
    salt: str,
    stage: str,
    index: int,
) -> PreparedRequest:
    """One synthetic request: nonce + filler; `max_tokens` is the dataset's `outputTokens`."""
    prefix = nonce(salt, stage, index)
    filler = synthetic_text(seed, stage, index, dataset.input_tokens - 4)  # the nonce is ~4 tokens
    rseed = request_seed(seed, stage, index)
    payload = body(
        model=model, sampling=sampling, seed=rseed, prompt=prefix + filler, max_tokens=dataset.output_tokens
    )
    return PreparedRequest(index, f"synthetic:{stage}:{index}", None, COMPLETIONS, payload, rseed)


def item_request(
    item: Item, *, model: str, sampling: spec_mod.Sampling, seed: int, salt: str, stage: str, index: int
) -> PreparedRequest:
    """One dataset request: the nonce is prepended to the prompt (or the first user message)."""
    prefix = nonce(salt, stage, index)
    rseed = request_seed(seed, stage, index)
    if item.messages is not None:
        messages = [dict(m) for m in item.messages]
        target = next((m for m in messages if m.get("role") == "user"), messages[0])
        target["content"] = prefix + str(target["content"])
        payload = body(model=model, sampling=sampling, seed=rseed, messages=messages)
        return PreparedRequest(index, item.id, item.category, CHAT, payload, rseed)
    payload = body(model=model, sampling=sampling, seed=rseed, prompt=prefix + (item.prompt or ""))
    return PreparedRequest(index, item.id, item.category, COMPLETIONS, payload, rseed)
