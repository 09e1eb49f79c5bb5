"""The small HTML formatting of report.html: numbers without exponents, intervals, badges, values in words."""

from __future__ import annotations

import math
from html import escape


def num(v: float | None, digits: int = 3, *, sign: bool = False) -> str:
    """`digits` significant digits, never an exponent: 1260 ms reads `1,260`, not `1.26e+03`."""
    if v is None or not math.isfinite(v):
        return "–"
    plus = "+" if sign else ""
    if abs(v) >= 10 ** (digits - 1):
        return f"{v:{plus},.0f}"
    text = f"{v:{plus}.{digits}g}"
    if "e" in text:  # tiny: as many decimals as the digits need
        decimals = digits - 1 - math.floor(math.log10(abs(v)))
        text = f"{v:{plus}.{decimals}f}"
    return text


def plain(value: object) -> str:
    """A provenance or validity value in words: no JSON (`key value; ...`, lists comma-separated)."""
    if isinstance(value, dict):
        return "; ".join(f"{k} {plain(v)}" for k, v in value.items() if v not in (None, [], {}))
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return num(value, 4)
    return str(value)


def ci(est: float | None, low: float | None, high: float | None, suffix: str = "x") -> str:
    if est is None:
        return "–"
    if low is None or high is None:
        return f"{est:.2f}{suffix}"
    return f"{est:.2f}{suffix} [{low:.2f}, {high:.2f}]"


def badge(text: str) -> str:
    return f'<span class="verdict {escape(text)}">{escape(text)}</span>'


def share(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def ratio(estimate: float | None, low: float | None, high: float | None) -> str:
    if estimate is None:
        return "–"
    return f"{estimate:.3f}x" + (f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else "")


def yes_no(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def fact(value: object) -> str:
    if value is None:
        return "–"
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)
