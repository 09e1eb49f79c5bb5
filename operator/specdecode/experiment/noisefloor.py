"""The noise floor of an A/A run. Pure; owns `status.noiseFloor`.

Noise floor (`analysis.mode: NoiseFloor`, an A/A run: both arms without speculation). Each stage
runs in full (no sequential stop) and is reported in `status.noiseFloor`: the A/A speed-up with its
paired t interval (every pair, one look, cluster-robust over waves or time windows as `comparison.paired_t`; the stage's own `speedup` is computed the same way), `equivalent` (the interval within [1/minSpeedup,
minSpeedup]), `minDetectable` (`min_detectable` at threshold 1.0 with the Compare run's design: the
smallest speed-up the stage tells from none, 9 times in 10, at the noise measured), `measurable`
(minDetectable ≤ minSpeedup), and the greedy-output mismatch rate with its Wilson interval; the
pooled upper Wilson bound is the suggested `baselineMismatchRate`. The stages are not judged and
the verdict is Inconclusive with reason `NoiseFloor`: a measurement, not a gate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specdecode.experiment import sequential
from specdecode.experiment.comparison import (
    MIN_PAIRS_FIXED,
    log_ratios,
    min_detectable,
    paired_t,
    proportion_interval,
)
from specdecode.experiment.guardrails import output_agreement
from specdecode.experiment.pairing import Pairs, paired_values, sampling_unit
from specdecode.experiment.records import Request
from specdecode.experiment.spec import (
    ExperimentSpec,
    PrimaryMetric,
    Stage,
)
from specdecode.experiment.status import (
    NoiseFloor,
    StageNoiseFloor,
)


def stage_noise_floor(spec: ExperimentSpec, stage: Stage, records: Sequence[Request]) -> StageNoiseFloor:
    """What one stage of an A/A run measured (the rule in the module docstring)."""
    a = spec.analysis
    pairs = Pairs.of(r for r in records if r.stage == stage.name)
    both = pairs.both_ok()
    b, c = paired_values(both, a.primary_metric.value)
    d = log_ratios(b, c, higher_is_better=a.primary_metric is PrimaryMetric.THROUGHPUT)
    n = int(d.size)
    result = StageNoiseFloor(name=stage.name, load=stage.load_label, pairs=n)
    unit = sampling_unit(stage.concurrency, stage.rate, list(pairs.treatment.values()))
    if n >= MIN_PAIRS_FIXED:
        mean, low, high, _ = paired_t(d, threshold=0.0, confidence=a.confidence, unit=unit)
        result.speedup = math.exp(mean)
        result.ci_low, result.ci_high = math.exp(low), math.exp(high)
        result.equivalent = 1.0 / a.min_speedup <= result.ci_low and result.ci_high <= a.min_speedup
        result.min_detectable = min_detectable(
            d,
            threshold=0.0,
            confidence=a.confidence,
            horizon=spec.stage_requests(stage),
            sequential_ci=a.sequential,
            first_look=sequential.first_look(stage.concurrency),
            unit=unit,
        )
        if result.min_detectable is not None:
            result.measurable = result.min_detectable <= a.min_speedup
    elif n:
        result.speedup = math.exp(float(np.mean(d)))
    if spec.workload.sampling.temperature == 0.0:
        same, compared = output_agreement(both)
        if compared:
            low, high = proportion_interval(
                compared - same, compared, confidence=a.confidence, method="wilson"
            )
            result.compared, result.mismatches = compared, compared - same
            result.mismatch_rate = (compared - same) / compared
            result.mismatch_ci_low, result.mismatch_ci_high = low, high
    return result


def noise_floor(spec: ExperimentSpec, records: Sequence[Request]) -> NoiseFloor:
    """The A/A result of every stage, and the pooled mismatch bound to carry into a Compare run."""
    a = spec.analysis
    stages = [stage_noise_floor(spec, st, records) for st in spec.workload.stages]
    compared = sum(s.compared for s in stages)
    mismatches = sum(s.mismatches for s in stages)
    suggested = None
    if compared:
        suggested = proportion_interval(mismatches, compared, confidence=a.confidence, method="wilson")[1]
    return NoiseFloor(
        min_speedup=a.min_speedup,
        stages=stages,
        measurable_stages=[s.name for s in stages if s.measurable],
        suggested_baseline_mismatch_rate=suggested,
        note=(
            f"both arms ran without speculation; the speculative config ({spec.speculative.method.value}) "
            "was validated, not used"
        ),
    )


def noise_floor_message(nf: NoiseFloor) -> str:
    able = nf.measurable_stages
    unable = [
        f"{s.name} ({s.min_detectable:.3f}x)" if s.min_detectable is not None else f"{s.name} (unknown)"
        for s in nf.stages
        if not s.measurable
    ]
    line = f"noise floor (A/A): minSpeedup {nf.min_speedup:g} "
    if able and not unable:
        line += "is measurable at every stage"
    elif able:
        line += f"is measurable at {', '.join(able)}; not at {', '.join(unable)} (smallest detectable)"
    else:
        line += f"is measurable at no stage: {', '.join(unable)} (smallest detectable)"
    rates = [f"{s.name} {s.mismatch_rate:.1%}" for s in nf.stages if s.mismatch_rate is not None]
    if rates:
        line += "; identical servers' greedy outputs differ: " + ", ".join(rates)
    if nf.suggested_baseline_mismatch_rate is not None:
        line += f"; suggested baselineMismatchRate {nf.suggested_baseline_mismatch_rate:.3f}"
    return line
