"""Fit the simulator's step model to the H200 measurements (benchmarks/h200-vllm-measurements.md).

Runs the scheduler in virtual time (`specdecode.simulator.virtual.closed_loop`) with the reference
workload (256 prompt tokens, 128 output tokens, k = 4, conditional acceptance 0.8, closed loop at
C = 1, 4, 16, 64 with 24 requests at C <= 4 and 3C above) and searches the parameters on a grid:
first decode_step_ms, batch_token_ms, prefill_token_ms against the control TPOT (p50), with the
control TTFT as a weak secondary target; then draft_cost_ratio and draft_fixed_ms per draft
against the treatment/control TPOT ratio. Objective: the worst absolute relative residual.

    .venv/bin/python benchmarks/simulator/fit.py
"""

from __future__ import annotations

import itertools

from specdecode.experiment.simprofiles import SimParams
from specdecode.simulator.scheduler import SpecConfig
from specdecode.simulator.virtual import closed_loop

CONCURRENCIES = (1, 4, 16, 64)
CONTROL_TPOT = (4.63, 4.67, 4.90, 6.15)
CONTROL_TTFT = (20.6, 41.4, 112.5, 335.4)
TREATMENT_TPOT = {
    "h200-8b-draft-1b": (10.63, 8.95, 11.22, 12.22),
    "h200-8b-draft-tiny": (4.08, 4.15, 5.02, 7.12),
}
SPEC = SpecConfig.constant(4, 0.8)


def requests_at(c: int) -> int:
    """Requests per run, as in the reference."""
    return 24 if c <= 4 else 3 * c


def control(p: SimParams) -> list[tuple[float, float]]:
    """(TPOT p50, TTFT p50) in ms per concurrency."""
    out = []
    for c in CONCURRENCIES:
        r = closed_loop(p, None, concurrency=c, num_requests=requests_at(c))
        out.append((r.tpot_p50_ms, r.ttft_p50_ms))
    return out


def treatment_tpot(p: SimParams) -> list[float]:
    """Treatment TPOT p50 in ms per concurrency."""
    return [
        closed_loop(p, SPEC, concurrency=c, num_requests=requests_at(c)).tpot_p50_ms for c in CONCURRENCIES
    ]


def ratios(p: SimParams) -> list[float]:
    """Treatment/control TPOT p50 per concurrency."""
    return [t / c for t, (c, _) in zip(treatment_tpot(p), control(p), strict=True)]


def fit_control() -> SimParams:
    best: tuple[float, SimParams] | None = None
    for d, b, pf in itertools.product(
        [4.50 + 0.02 * i for i in range(8)],
        [0.008 + 0.001 * i for i in range(20)],
        [0.012 + 0.002 * i for i in range(12)],
    ):
        p = SimParams(decode_step_ms=round(d, 3), batch_token_ms=round(b, 4), prefill_token_ms=round(pf, 4))
        res = control(p)
        err = max(abs(t / m - 1) for (t, _), m in zip(res, CONTROL_TPOT, strict=True))
        ttft_err = max(abs(f / m - 1) for (_, f), m in zip(res[2:], CONTROL_TTFT[2:], strict=True))
        score = err + 0.1 * ttft_err
        if best is None or score < best[0]:
            best = (score, p)
    assert best is not None
    return best[1]


def fit_draft(base: SimParams, measured: tuple[float, ...]) -> SimParams:
    """Coarse grid over (draft_cost_ratio, draft_fixed_ms), then a finer grid around the best."""
    target = [t / c for t, c in zip(measured, CONTROL_TPOT, strict=True)]
    ctl = [c for c, _ in control(base)]

    def score(r: float, f: float) -> float:
        p = base.with_overrides({"draft_cost_ratio": r, "draft_fixed_ms": f})
        got = [t / c for t, c in zip(treatment_tpot(p), ctl, strict=True)]
        return max(abs(g / m - 1) for g, m in zip(got, target, strict=True))

    grid = [(round(0.1 * i, 3), round(0.5 * j, 3)) for i in range(21) for j in range(21)]
    r0, f0 = min(grid, key=lambda rf: score(*rf))
    fine = [
        (round(max(0.0, r0 + 0.02 * i), 3), round(max(0.0, f0 + 0.1 * j), 3))
        for i in range(-5, 6)
        for j in range(-5, 6)
    ]
    r1, f1 = min(fine, key=lambda rf: score(*rf))
    return base.with_overrides({"draft_cost_ratio": r1, "draft_fixed_ms": f1})


def report(name: str, p: SimParams, measured: tuple[float, ...]) -> None:
    ctl = control(p)
    rat = ratios(p)
    print(f"{name}: {p}")
    print("| C | control TPOT sim / H200 (resid) | ratio sim / H200 (resid) | control TTFT sim / H200 |")
    for i, c in enumerate(CONCURRENCIES):
        m_ratio = measured[i] / CONTROL_TPOT[i]
        print(
            f"| {c} | {ctl[i][0]:.2f} / {CONTROL_TPOT[i]:.2f} ({ctl[i][0] / CONTROL_TPOT[i] - 1:+.1%}) "
            f"| {rat[i]:.3f} / {m_ratio:.3f} ({rat[i] / m_ratio - 1:+.1%}) "
            f"| {ctl[i][1]:.0f} / {CONTROL_TTFT[i]:.0f} |"
        )


if __name__ == "__main__":
    import sys

    if "--control" in sys.argv:
        base = fit_control()
    else:  # the control fit is slow (a 1920-point grid); its result (fitted with request_overhead_ms = 0,
        # which only moves control TPOT at C = 64 from +1.5% to -5.8%):
        base = SimParams(
            decode_step_ms=4.64, batch_token_ms=0.011, prefill_token_ms=0.014, request_overhead_ms=12.0
        )
    print("control fit:", base)
    for name, measured in TREATMENT_TPOT.items():
        report(name, fit_draft(base, measured), measured)
