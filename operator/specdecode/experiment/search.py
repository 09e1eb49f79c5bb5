"""The break-even search (`workload.search`, issue 17): the highest load at which the treatment still
clears `minSpeedup`, by bisection between bounds.

Each probe is a paired stage at one load, judged by the same stage statistics as any other stage
(`verdict.analyse_stage`): it *clears* when its verdict is Pass. This module only decides which load
to probe next and why the search stops; the runner measures.

The order: the lower bound, then the upper bound, then the geometric midpoint of the bracket (the
highest load that cleared below the lowest load that did not), until
- `BelowRange`: the lower bound does not clear (speculation does not pay anywhere in range);
- `AboveRange`: the upper bound clears (it pays everywhere in range);
- `Converged`: the bracket cannot be split further (adjacent concurrencies, or rates within
  `tolerance` of each other);
- `MaxProbes`: `maxProbes` probes were run; the bracket is as wide as they left it.

Invariants: pure; the same outcomes always give the same next load; a probe is never repeated; the
break-even is a load that was measured to clear (never interpolated).

`run --local` runs the probes one after another in its own process (`local/runner.py`); the operator
runs each as a round of the experiment's lifecycle (`rounds.py`). Both plan a probe by `probe_spec`,
judge it by `judge_probe` and write `status.search` from `progress`, so the two report the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdecode.experiment import spec, status, verdict
from specdecode.experiment.records import Request, StageWindow
from specdecode.experiment.validity import Validity

BELOW_RANGE = "BelowRange"
ABOVE_RANGE = "AboveRange"
CONVERGED = "Converged"
MAX_PROBES = "MaxProbes"
PROBE_FAILED = "ProbeFailed"
"""The operator: a probe's round could not be measured (`status.rounds[].message` says why)."""


@dataclass(frozen=True)
class Probe:
    """One measured probe: its load and whether it cleared `minSpeedup` (stage verdict Pass)."""

    load: float
    clears: bool


@dataclass(frozen=True)
class Step:
    """What the search does next: probe `next_load`, or stop (`reason`, `message`)."""

    next_load: float | None
    reason: str | None = None
    message: str = ""
    break_even: float | None = None
    """The highest load measured to clear below the lowest that did not (None: none cleared)."""
    first_failing: float | None = None
    """The lowest load measured not to clear (None: every probe cleared)."""


def _fmt(load: float) -> str:
    return f"{load:g}"


def _rate(value: float) -> float:
    return float(f"{value:.3g}")


def step(
    *,
    lower: float,
    upper: float,
    whole: bool,
    probes: Sequence[Probe],
    max_probes: int,
    tolerance: float,
) -> Step:
    """The next probe, or why the search stops. `whole`: loads are concurrencies (integers)."""
    if not probes:
        return Step(next_load=lower)
    tried = {p.load: p.clears for p in probes}
    if not tried.get(lower, True):
        return Step(
            None,
            BELOW_RANGE,
            f"the lowest load, {_fmt(lower)}, does not clear minSpeedup: no break-even in range",
            first_failing=lower,
        )
    failing = [p.load for p in probes if not p.clears]
    hi = min(failing) if failing else None
    lo = max(p.load for p in probes if p.clears and (hi is None or p.load < hi))
    if hi is None:
        if upper in tried:
            return Step(
                None,
                ABOVE_RANGE,
                f"the highest load, {_fmt(upper)}, still clears minSpeedup: the break-even is at or above it",
                break_even=upper,
            )
        if len(probes) >= max_probes:
            return Step(None, MAX_PROBES, f"{len(probes)} probes, none failed", break_even=lo)
        return Step(next_load=upper, break_even=lo)
    bracket = f"between {_fmt(lo)} (clears) and {_fmt(hi)} (does not)"
    if (whole and hi - lo <= 1) or (not whole and hi <= lo * (1 + tolerance)):
        return Step(None, CONVERGED, f"the break-even lies {bracket}", lo, hi)
    if len(probes) >= max_probes:
        return Step(
            None, MAX_PROBES, f"stopped after {len(probes)} probes; the break-even lies {bracket}", lo, hi
        )
    middle = math.sqrt(lo * hi)
    nxt = float(min(max(round(middle), int(lo) + 1), int(hi) - 1)) if whole else _rate(middle)
    if nxt in tried or not lo < nxt < hi:  # rounding landed on a measured load: nothing left to split
        return Step(None, CONVERGED, f"the break-even lies {bracket}", lo, hi)
    return Step(next_load=nxt, break_even=lo, first_failing=hi)


def progress(
    wanted: spec.Search, judged: Sequence[tuple[float, status.StageResult]]
) -> tuple[Step, status.SearchResult]:
    """The next step after the probes `judged` so far ((load, stage result), in the order run), and
    `status.search` as they leave it."""
    done = step(
        lower=wanted.bounds.from_,
        upper=wanted.bounds.to,
        whole=wanted.axis == "concurrency",
        probes=[Probe(load, result.verdict is status.StageVerdict.PASS) for load, result in judged],
        max_probes=wanted.max_probes,
        tolerance=wanted.tolerance,
    )
    found = status.SearchResult(
        axis=wanted.axis,
        ran=bool(judged),
        reason=done.reason,
        message=done.message or None,
        break_even=done.break_even,
        first_failing=done.first_failing,
        probes=[result for _, result in judged],
    )
    return done, found


def failed(
    wanted: spec.Search, judged: Sequence[tuple[float, status.StageResult]], probe: str, why: str
) -> status.SearchResult:
    """`status.search` when the probe after `judged` could not be measured: it stops there
    (`ProbeFailed`), with the bracket the probes before it left."""
    _, found = progress(wanted, judged)
    return found.model_copy(update={"reason": PROBE_FAILED, "message": f"probe {probe} failed: {why}"})


def probe_spec(s: spec.ExperimentSpec, stage: spec.Stage) -> spec.ExperimentSpec:
    """The spec a probe is loaded and judged by: `s` with the probe as its only stage, no warm-up
    (the arms are warm from the stages)."""
    workload = s.workload.model_copy(update={"stages": [stage], "warmup_requests": 0})
    return s.model_copy(update={"workload": workload})


def judge_probe(
    s: spec.ExperimentSpec,
    stage: spec.Stage,
    records: Sequence[Request],
    windows: Sequence[StageWindow],
    *,
    validity: Validity | None,
    index: int,
) -> status.StageResult:
    """Probe `index` (1-based) judged as any stage (`verdict.analyse_stage`) from its load's records."""
    measured = [r for r in records if r.stage == stage.name and not r.warmup]
    window = next((w for w in windows if w.stage == stage.name), None)
    return verdict.analyse_stage(
        probe_spec(s, stage), stage, measured, window, validity=validity, seed=s.engine.seed + 999 + index
    )


def describe(result: status.SearchResult) -> str:
    """One line for the terminal and the report: why it stopped, then each probe in the order run."""
    head = f"break-even search over {result.axis}: {result.reason or 'not run'}"
    if result.message:
        head += f" ({result.message})"
    probes = [
        f"{p.name} {p.verdict.value}"
        + (f" {p.speedup.estimate:.2f}x" if p.speedup is not None and p.speedup.estimate is not None else "")
        for p in result.probes
    ]
    return head + (f"; probes: {', '.join(probes)}" if probes else "")
