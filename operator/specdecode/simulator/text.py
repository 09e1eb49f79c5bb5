"""Deterministic tokenizer and output text of the simulator.

Tokenizer: a token is a run of word characters or one other non-space character
(`\\w+|[^\\w\\s]`), so "Hello, world" is 3 tokens. It is the documented stand-in for a real
tokenizer: `usage.prompt_tokens` comes from it, and every output token is one word preceded by a
space, so re-tokenising an output gives exactly `usage.completion_tokens`.

Output text: token i of a request is drawn from a PRNG seeded by a hash of (server seed, prompt),
so it depends only on those. A lossless treatment therefore returns the control's text exactly;
`diverge_at` switches to a second stream from that position (the mismatch fault).
"""

from __future__ import annotations

import hashlib
import random
import re

_TOKEN = re.compile(r"\w+|[^\w\s]")

_ONSETS = ("b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "n")
#: 256 distinct one-token words; output token i is " " + VOCAB[j].
VOCAB: tuple[str, ...] = tuple(o + n + c for o in _ONSETS for n in _NUCLEI for c in _CODAS)
assert len(VOCAB) == 256


def tokenize(text: str) -> list[str]:
    """The simulator's tokens of `text`."""
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    """Number of tokens in `text`."""
    return len(_TOKEN.findall(text))


def stable_hash(*parts: object) -> int:
    """A 64-bit hash of `parts` that is stable across processes (unlike `hash()`)."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "big")


def unit(*parts: object) -> float:
    """A deterministic number in [0, 1) derived from `parts`."""
    return stable_hash(*parts) / 2**64


class TextStream:
    """The output tokens of one request, produced incrementally."""

    __slots__ = ("_alt", "_diverge_at", "_main", "_pos")

    def __init__(self, seed: int, prompt_key: str, *, diverge_at: int | None = None) -> None:
        self._main = random.Random(stable_hash("text", seed, prompt_key))
        self._alt = random.Random(stable_hash("mismatch", seed, prompt_key))
        self._diverge_at = diverge_at
        self._pos = 0

    def take(self, n: int) -> str:
        """The next `n` tokens as text."""
        bits = self._main.getrandbits
        if self._diverge_at is None or self._pos + n <= self._diverge_at:
            self._pos += n
            return "".join([" " + VOCAB[bits(8)] for _ in range(n)])
        pieces = []
        for _ in range(n):
            j = bits(8)
            if self._pos >= self._diverge_at:
                # Never equal to the control's token, so the divergence is visible at this position.
                j = (j + 1 + self._alt.getrandbits(8) % 255) % 256
            pieces.append(" " + VOCAB[j])
            self._pos += 1
        return "".join(pieces)
