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
- **Too few requests to show a guardrail**: errorRate and (greedy) outputMatch hold only once their
  one-sided bound is within the limit (`guardrails.pairs_to_show`: 299 clean requests for 1% at
  95%); a stage with fewer ends Inconclusive `GuardrailUndecided` however fast the treatment is.
"""

from __future__ import annotations

from specdecode.experiment import guardrails, sequential, spec
from specdecode.experiment.validation import Problem


def advice(s: spec.ExperimentSpec) -> list[Problem]:
    """Every piece of advice for `s`, in stage order (a sweep's stages too short for the guardrails
    in one line)."""
    found: list[Problem] = []
    generated = s.workload.sweep is not None
    limits = _limits(s)
    short: dict[tuple[str, int, bool], list[str]] = {}
    for i, stage in enumerate(s.workload.stages):
        where = "spec.workload.sweep" if generated else f"spec.workload.stages[{i}]"
        found.extend(_waves(s, stage, where))
        n = s.stage_requests(stage)
        if any(n < needed for *_, needed in limits):
            short.setdefault((where, n, generated or stage.requests is None), []).append(stage.name)
    for (where, n, per_stage), names in short.items():
        found.append(_guardrails(s, limits, where, n, names, requests_per_stage=per_stage))
    return found


def _limits(s: spec.ExperimentSpec) -> list[tuple[str, str, int]]:
    """(field, what it asks, clean requests that show it) of each guardrail decided by counting:
    errorRate, and outputMatch under greedy sampling; none in an A/A run or without speculation."""
    a = s.analysis
    if a.mode is spec.AnalysisMode.NOISE_FLOOR or not s.speculates:
        return []
    g = a.guardrails
    wanted = [("maxErrorRate", f"errorRate <= {g.max_error_rate:g}", g.max_error_rate)]
    if s.workload.sampling.temperature == 0.0:
        wanted.append(("minOutputMatch", f"outputMatch >= {g.min_output_match:g}", 1.0 - g.min_output_match))
    return [
        (name, words, needed)
        for name, words, rate in wanted
        if (needed := guardrails.pairs_to_show(rate, a.confidence)) is not None
    ]


def _guardrails(
    s: spec.ExperimentSpec,
    limits: list[tuple[str, str, int]],
    where: str,
    n: int,
    names: list[str],
    *,
    requests_per_stage: bool,
) -> Problem:
    """Stages of `n` requests too few to show errorRate and (greedy) outputMatch at their `limits`."""
    short = [(name, words, needed) for name, words, needed in limits if n < needed]
    most = max(needed for *_, needed in short)
    which = f"stage {names[0]}" if len(names) == 1 else "stages " + ", ".join(names)
    return Problem(
        where,
        f"{which}: {n} requests cannot show "
        + " and ".join(words for _, words, _ in short)
        + f" at confidence {s.analysis.confidence:g} ({most} clean requests do), so "
        + ("it ends" if len(names) == 1 else "each ends")
        + " Inconclusive (GuardrailUndecided) however fast the treatment is: give "
        + ("it" if len(names) == 1 else "each")
        + f" at least {most} requests ({'requestsPerStage' if requests_per_stage else 'its requests'}) "
        "or loosen " + " and ".join(f"spec.analysis.guardrails.{name}" for name, *_ in short),
    )


def _waves(s: spec.ExperimentSpec, stage: spec.Stage, where: str) -> list[Problem]:
    """A closed-loop stage of fewer than `sequential.MIN_WAVES` waves."""
    concurrency = stage.concurrency
    n = s.stage_requests(stage)
    if concurrency is None or concurrency < 2 or n >= sequential.MIN_WAVES * concurrency:
        return []
    wanted = sequential.MIN_WAVES * concurrency
    return [
        Problem(
            where,
            f"stage {stage.name}: {n} requests at concurrency {concurrency} run as about "
            f"{n / concurrency:.1f} wave(s); the requests of a wave start together and share their "
            f"servers' moments, so its interval is too narrow and its speed-up biased toward the "
            f"small batches of a filling and draining wave (benchmarks/verdict/waves.py): give it "
            f"at least {sequential.MIN_WAVES} x {concurrency} = {wanted} requests "
            f"({'requestsPerStage' if stage.requests is None else 'its requests'})",
        )
    ]
