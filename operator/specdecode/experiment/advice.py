"""What a valid spec asks that weakens its own measurement: advice, not errors. Pure.

`specdecode validate` prints each as a warning line, `specdecode run --local` says it before the
load, and the operator posts it as a Warning Event (`WeakDesign`) when it accepts a generation.

- **Fewer than `sequential.MIN_WAVES` waves** in a closed-loop stage: n requests at concurrency C
  run as about n / C waves, and the requests of one wave start together and share their server's
  moments, so their pairs are not independent. `benchmarks/verdict/waves.py` measured, at one wave
  of 64 at C = 64, an interval 2.3x narrower than the run-to-run spread and an estimate biased
  toward the small batches of a wave that fills and drains (1.01x against 0.92x at five waves);
  at five waves the interval was right (ratio 0.93). Sequential stopping never looks before
  `MIN_WAVES` waves (`sequential.first_look`), so such a stage also runs to its bound.
"""

from __future__ import annotations

from specdecode.experiment import sequential, spec
from specdecode.experiment.validation import Problem


def advice(s: spec.ExperimentSpec) -> list[Problem]:
    """Every piece of advice for `s`, in stage order."""
    found: list[Problem] = []
    generated = s.workload.sweep is not None
    for i, stage in enumerate(s.workload.stages):
        concurrency = stage.concurrency
        n = s.stage_requests(stage)
        if concurrency is None or concurrency < 2 or n >= sequential.MIN_WAVES * concurrency:
            continue
        where = "spec.workload.sweep" if generated else f"spec.workload.stages[{i}]"
        wanted = sequential.MIN_WAVES * concurrency
        found.append(
            Problem(
                where,
                f"stage {stage.name}: {n} requests at concurrency {concurrency} run as about "
                f"{n / concurrency:.1f} wave(s); the requests of a wave start together and share their "
                f"servers' moments, so its interval is too narrow and its speed-up biased toward the "
                f"small batches of a filling and draining wave (benchmarks/verdict/waves.py): give it "
                f"at least {sequential.MIN_WAVES} x {concurrency} = {wanted} requests "
                f"({'requestsPerStage' if stage.requests is None else 'its requests'})",
            )
        )
    return found
