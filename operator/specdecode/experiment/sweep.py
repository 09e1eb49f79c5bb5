"""Load sweeps: `workload.sweep` expanded into named stages (issue 17).

A sweep names one load axis, concurrency (closed loop) or rate (open loop), and its values: a list,
or `from`/`to`/`steps` spaced geometrically (load effects are multiplicative: 1, 2, 4, ... 64). The
expansion happens while `workload` is parsed, before any other validation, so every later rule,
the operator and `run --local` see ordinary `stages`; `specdecode validate` prints the expansion.

Invariants:
- Pure: no I/O; the same sweep always gives the same stages, in ascending load.
- Concurrency values are whole numbers (a geometric series is rounded); duplicates after
  rounding are dropped, so stage names are unique.
- Stage names: `c<N>` for concurrency, `r<rate>` for rate with `.` written `-` (`r0-5`): DNS labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: the most stages a sweep may produce (the CRD's limit on `workload.stages`)
MAX_STAGES = 32

#: significant digits a geometric rate is rounded to (so `r2-83`, not `r2-828427`)
RATE_DIGITS = 3


def geometric(start: float, stop: float, steps: int) -> list[float]:
    """`steps` values from `start` to `stop` (both included), evenly spaced on a log scale."""
    if steps == 1:
        return [start]
    ratio = (stop / start) ** (1.0 / (steps - 1))
    return [start * ratio**i for i in range(steps - 1)] + [stop]


def concurrency_values(values: Sequence[float]) -> list[int]:
    """Whole concurrencies, ascending, without duplicates (rounding may merge neighbours)."""
    return sorted({max(1, round(v)) for v in values})


def rate_values(values: Sequence[float]) -> list[float]:
    """Rates rounded to `RATE_DIGITS` significant digits, ascending, without duplicates."""
    return sorted({float(f"{v:.{RATE_DIGITS}g}") for v in values})


def stage_name(axis: str, value: float) -> str:
    """`c16` or `r0-5`: a DNS label that says the load."""
    if axis == "concurrency":
        return f"c{int(value)}"
    return "r" + f"{value:g}".replace(".", "-")


def axis_values(
    values: Sequence[float] | None, start: float | None, stop: float | None, steps: int | None
) -> list[float]:
    """The raw values of one axis: the list, or the geometric series."""
    if values is not None:
        return list(values)
    assert start is not None and stop is not None and steps is not None
    return geometric(start, stop, steps)


def expand(axis: str, raw: Sequence[float], *, requests: int | None = None) -> list[dict[str, Any]]:
    """The stages (as wire-format mappings) of a sweep over `axis` (`concurrency` or `rate`)."""
    loads: list[float] = list(concurrency_values(raw)) if axis == "concurrency" else rate_values(raw)
    stages: list[dict[str, Any]] = []
    for load in loads:
        stage: dict[str, Any] = {
            "name": stage_name(axis, load),
            axis: int(load) if axis == "concurrency" else load,
        }
        if requests is not None:
            stage["requests"] = requests
        stages.append(stage)
    return stages
