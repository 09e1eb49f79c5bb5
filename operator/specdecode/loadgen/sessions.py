"""Multi-turn sessions (issue 17): conversations parsed, the built-in set, one request per turn.

A conversations file is JSONL, one conversation per line:

    {"id": "trip", "category": "chat", "messages": [
      {"role": "system", "content": "You are a travel planner."},
      {"role": "user", "content": "Four days in Lisbon: what should I not miss?"},
      {"role": "assistant", "content": "Alfama, Belem, a day in Sintra ..."},
      {"role": "user", "content": "How do I get to Sintra?"}]}

- `messages`: an optional `system` message first, then `user` and `assistant` alternating, starting
  with `user`; every user message is one turn; an assistant message after the last user message is
  allowed and not sent;
- `id` (default `<file>:<line>`) and `category` are optional.

Turn k's request (/v1/chat/completions) carries every message of the conversation before turn k's
user message, then that message; `max_tokens` is `sampling.maxTokens`.

Why the history holds the dataset's replies, not the arm's own: pairing needs the same prompt bytes
on both arms at every turn, and the arms' replies are not the same bytes (the treatment's may
diverge under greedy sampling, which is what the output-match check measures; a failed turn has no
reply at all). With the dataset's replies each turn is a paired request like any other, and both
arms' prefix caches see the same prefixes. The price: a real client sends back the reply the
server generated, part of whose KV vLLM may still hold from decoding; here the history's assistant
text was never generated, so its blocks are computed at the next turn and the hit rate is somewhat
lower than a live chat's (the hit covers the previous turn's prompt).

A stage's sessions: conversations in the seeded shuffled order (cyclic), each taken whole until the
stage has its number of requests, so `requests` counts turns; the last session is cut short where
needed. A session's turns are consecutive request indices (`PreparedRequest.session`, `.turn`).

Nonce: unique to (salt, stage, session), prepended to the session's first message, so the turns of
one session share their prefix and no two sessions (or runs) do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from specdecode.experiment import spec as spec_mod
from specdecode.loadgen import workload

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Conversation:
    """One conversation of a multi-turn dataset."""

    id: str
    messages: tuple[dict[str, str], ...]
    category: str | None = None

    @property
    def turns(self) -> int:
        """User messages: the requests one whole session sends."""
        return sum(m["role"] == "user" for m in self.messages)

    def history(self, turn: int) -> list[dict[str, str]]:
        """The messages of turn `turn` (from 1): everything up to and including its user message."""
        seen = 0
        for i, m in enumerate(self.messages):
            if m["role"] == "user":
                seen += 1
                if seen == turn:
                    return [dict(x) for x in self.messages[: i + 1]]
        raise IndexError(f"{self.id} has {self.turns} turns, not {turn}")


def _check_messages(messages: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(messages, list) or not messages:
        raise workload.DatasetError(f"{where}: 'messages' must be a non-empty list of {{role, content}}")
    out: list[dict[str, str]] = []
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") in ROLES):
            raise workload.DatasetError(
                f"{where}: messages[{j}] must be {{role: {'|'.join(ROLES)}, content: str}}"
            )
        out.append({"role": m["role"], "content": m["content"]})
    body = out[1:] if out[0]["role"] == "system" else out
    for j, m in enumerate(body):
        expected = "user" if j % 2 == 0 else "assistant"
        if m["role"] != expected:
            at = j + len(out) - len(body)
            raise workload.DatasetError(
                f"{where}: messages[{at}] is {m['role']!r} where {expected!r} is due (an optional system"
                " message first, then user and assistant alternating, starting with user)"
            )
    if not body:
        raise workload.DatasetError(f"{where}: has no user message")
    return tuple(out)


def read_conversations(text: str, *, source: str) -> list[Conversation]:
    """Parse a JSONL conversations file; errors name the line (`workload.DatasetError`)."""
    out: list[Conversation] = []
    for n, obj in workload.json_lines(text, source=source):
        where = f"{source}:{n}"
        unknown = sorted(set(obj) - {"id", "category", "messages"})
        if unknown:
            raise workload.DatasetError(
                f"{where}: unknown field {unknown[0]!r} (a conversation has id, category, messages)"
            )
        category = obj.get("category")
        out.append(
            Conversation(
                id=str(obj.get("id", f"{Path(source).name}:{n}")),
                messages=_check_messages(obj.get("messages"), where),
                category=str(category) if category is not None else None,
            )
        )
    if not out:
        raise workload.DatasetError(f"{source}: holds no conversation")
    return out


def builtin(name: str) -> list[Conversation]:
    """A conversation set shipped with the package (`conversations`)."""
    text = resources.files("specdecode.loadgen").joinpath("data", f"{name}.jsonl").read_text(encoding="utf-8")
    return read_conversations(text, source=f"builtin:{name}")


def load(
    dataset: spec_mod.MultiTurnDataset, base_dir: Path, dataset_file: Path | None = None
) -> list[Conversation]:
    """The conversations of a multiTurn dataset (`dataset_file` overrides, e.g. the mounted ConfigMap key)."""
    if dataset.builtin is not None and dataset_file is None:
        return builtin(dataset.builtin)
    text, source = workload.dataset_text(dataset.path, base_dir, dataset_file, what="dataset")
    return read_conversations(text, source=source)


def mean_turns(conversations: Sequence[Conversation]) -> float:
    """Mean user turns per conversation."""
    return sum(c.turns for c in conversations) / len(conversations)


def covering(conversations: Sequence[Conversation], n: int) -> int:
    """How many conversations from the first, whole, hold `n` turns (all of them when they hold fewer)."""
    total = 0
    for used, conv in enumerate(conversations, start=1):
        total += conv.turns
        if total >= n:
            return used
    return len(conversations)


def requests(
    conversations: Sequence[Conversation],
    *,
    n: int,
    first: int,
    model: str,
    sampling: spec_mod.Sampling,
    seed: int,
    salt: str,
    stage: str,
) -> tuple[tuple[workload.PreparedRequest, ...], int]:
    """`n` requests: whole sessions of `conversations[first:]` (cyclic), the last cut at `n`.

    Returns the requests and how many conversations they used (the next stage's `first` offset).
    """
    out: list[workload.PreparedRequest] = []
    session = 0
    while len(out) < n:
        conv = conversations[(first + session) % len(conversations)]
        prefix = workload.nonce(salt, stage, session)
        for turn in range(1, min(conv.turns, n - len(out)) + 1):
            index = len(out)
            messages = conv.history(turn)
            messages[0]["content"] = prefix + messages[0]["content"]
            rseed = workload.request_seed(seed, stage, index)
            payload = workload.body(model=model, sampling=sampling, seed=rseed, messages=messages)
            out.append(
                workload.PreparedRequest(
                    index,
                    f"{conv.id}#{turn}",
                    conv.category,
                    workload.CHAT,
                    payload,
                    rseed,
                    session=session,
                    turn=turn,
                )
            )
        session += 1
    return tuple(out), session


def groups(reqs: Sequence[workload.PreparedRequest]) -> list[list[int]]:
    """The request indices of each session, turns in order (sessions in order of their first turn)."""
    by_session: dict[int, list[int]] = {}
    for r in reqs:
        assert r.session is not None
        by_session.setdefault(r.session, []).append(r.index)
    return list(by_session.values())
