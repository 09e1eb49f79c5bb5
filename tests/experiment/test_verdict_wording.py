"""The verdict's words say what the numbers say: a bound compared with a limit at the precision shown."""

from __future__ import annotations

import re

import numpy as np

from specdecode.experiment import comparison


def failing_just_below(limit: float, target: float) -> comparison.MetricVerdict:
    """A fixed-horizon comparison whose upper bound lands at `target` (just below `limit`)."""
    rng = np.random.default_rng(3)
    baseline = rng.uniform(8.0, 12.0, 200)
    noise = rng.normal(0.0, 0.05, 200)
    shift = 0.0
    for _ in range(60):  # the upper bound moves one for one with a shift of the log ratios
        candidate = baseline / np.exp(noise + shift)
        mv = comparison.compare(baseline, candidate, metric="tpot", min_speedup=limit, sequential_ci=False)
        assert mv.ci is not None
        shift += np.log(target) - np.log(mv.ci[1])
    return mv


def test_an_upper_bound_just_below_min_speedup_reads_below_it() -> None:
    mv = failing_just_below(1.05, 1.0498)
    assert mv.label is comparison.Label.FAIL and mv.ci is not None and abs(mv.ci[1] - 1.0498) < 1e-6
    shown = re.search(r"upper bound ([0-9.]+) < ([0-9.]+)", mv.reason)
    assert shown is not None, mv.reason
    assert float(shown[1]) < float(shown[2]), mv.reason  # not "1.050 < 1.05"
    assert mv.reason == "tpot upper bound 1.0498 < 1.0500"


def test_an_upper_bound_well_below_reads_as_before() -> None:
    mv = failing_just_below(1.05, 0.97)
    assert mv.reason == "tpot upper bound 0.970 < 1.05"
