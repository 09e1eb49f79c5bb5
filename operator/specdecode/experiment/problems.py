"""What is wrong with an experiment, one line per problem: `Problem`, `InvalidSpecError`, and the
translation of pydantic's errors into camelCase field paths with the fix (`translate`).

The rules that find problems live in `validation.py` (the spec as a whole) and `speculative_rules.py`
(vLLM's SpeculativeConfig rules); both speak in `Problem`s so the user sees every finding at once.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an experiment: where, what, and how to fix it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidSpecError(Exception):
    """The experiment cannot run as written. `problems` holds every finding."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def kind_of(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


# ------------------------------------------------------------------ pydantic errors -> field lines


def translate(exc: ValidationError, *, prefix: str, model: type[BaseModel] | None = None) -> list[Problem]:
    """One Problem per pydantic error, with a camelCase path and a plain-language message."""
    problems = []
    for error in exc.errors(include_url=False):
        loc = [part for part in error["loc"] if not is_union_tag(part)]
        path = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
        problems.append(Problem(path, _message(error, model, loc)))
    return _dedupe(problems)


def is_union_tag(part: str | int) -> bool:
    # Discriminated unions insert the tag ('synthetic', 'jsonl', ...) into the location.
    return isinstance(part, str) and part in {
        "synthetic",
        "jsonl",
        "builtin",
        "list[str]",
        "literal['all','any']",
    }


def _message(error: Mapping[str, Any], model: type[BaseModel] | None, loc: Sequence[str | int]) -> str:
    kind = error["type"]
    given = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        allowed = _allowed_fields(model, loc[:-1])
        hint = did_you_mean(str(loc[-1]), allowed) if allowed else ""
        listing = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"unknown field{hint}{listing}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"{error['msg'].replace('Input should be', 'must be')} (got {given!r})"
    if kind in ("enum", "literal_error"):
        return f"{error['msg'].replace('Input should be', 'must be')} (got {given!r})"
    if kind == "union_tag_invalid":
        return f"type must be one of {ctx.get('expected_tags', 'synthetic, jsonl, builtin')} (got {ctx.get('tag')!r})"
    if kind == "union_tag_not_found":
        return "needs a type: synthetic, jsonl or builtin"
    if kind == "string_pattern_mismatch":
        return f"{given!r} does not match the expected format {ctx.get('pattern', '')}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{error['msg']} (got {given!r})" if given is not None else str(error["msg"])


def _allowed_fields(model: type[BaseModel] | None, loc: Sequence[str | int]) -> list[str]:
    """The camelCase field names of the model at `loc`, for an 'unknown field' hint."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", {})
        match = next((f for name, f in fields.items() if (f.alias or name) == part), None)
        if match is None:
            return []
        current = _inner_model(match.annotation)
    if current is None or not hasattr(current, "model_fields"):
        return []
    return [f.alias or name for name, f in current.model_fields.items()]


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        inner = _inner_model(arg)
        if inner is not None:
            return inner
    return None


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for problem in problems:
        key = (problem.path, problem.message)
        if key not in seen:
            seen.add(key)
            out.append(problem)
    return out
