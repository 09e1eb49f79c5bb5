"""Break-even acceptance: the draft acceptance a failing stage would have needed to pay (#18).

A speculative step costs the same whatever the verifier accepts: the draft proposes `k` tokens,
the target scores them in one forward pass, and the step emits the accepted ones plus one. So the
treatment's time per output token is `step_cost / L`, where `L` is the mean acceptance length
(tokens emitted per step), and its speed-up over the control scales with `L`:

    speedup(L) = measured_speedup * L / L_measured

Each step drafts `k` tokens, so `L = 1 + k * rate` exactly (rate = accepted / drafted, the number
`status.stages[].acceptance.rate` reports), whatever the acceptance per draft position looks like.
The break-even length is `L* = minSpeedup / measured_speedup * L_measured`, the break-even rate
`(L* - 1) / k`. With independent acceptance per token `alpha` the mean length is the standard
`(1 - alpha^(k+1)) / (1 - alpha)` (Leviathan et al. 2023, https://arxiv.org/abs/2211.17192, eq. 1):
`perToken` states the `alpha` that would give `L*`, the number a draft model card quotes.

Assumptions, stated where the number is shown: the step cost is the one measured at this load
(it does not depend on acceptance); the speed-up is the stage's primary metric, exact for TPOT and
an approximation for E2E and throughput (the time to first token does not scale with `L`, so the
acceptance really needed there is somewhat higher). TTFT does not depend on acceptance: no
break-even. A required rate above 1 means no draft of this length pays at this load
(`reachable: false`).

Pure: no I/O. Owns `status.stages[].breakEven`.
"""

from __future__ import annotations

import math

from specdecode.experiment.status import Acceptance, BreakEven, Speedup

#: the primary metrics whose speed-up scales with the mean acceptance length
SCALING_METRICS = frozenset({"tpot", "e2e", "throughput"})


def expected_length(alpha: float, k: int) -> float:
    """Mean tokens per step with `k` drafted tokens each accepted with independent probability `alpha`."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def per_token_alpha(length: float, k: int) -> float | None:
    """The independent per-token acceptance giving mean length `length` (None outside [1, k + 1])."""
    if not 1.0 <= length <= k + 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):  # expected_length is increasing in alpha: bisection to ~1e-18
        mid = (low + high) / 2.0
        if expected_length(mid, k) < length:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def required_rate(*, speedup: float, min_speedup: float, length: float, k: int) -> float:
    """The acceptance rate at which `speedup` measured at mean length `length` reaches `min_speedup`."""
    return (min_speedup / speedup * length - 1.0) / k


def break_even(
    speedup: Speedup | None,
    acceptance: Acceptance | None,
    *,
    k: int | None,
    min_speedup: float,
    measured_interval: tuple[float, float] | None = None,
) -> BreakEven | None:
    """The acceptance the stage needed for `min_speedup`, next to the one measured; None when unknown.

    `measured_interval` is the confidence interval of the measured rate (Clopper-Pearson on the
    token counts); the required rate's interval comes from the speed-up's interval.
    """
    if speedup is None or acceptance is None or speedup.metric not in SCALING_METRICS:
        return None
    if not k and acceptance.rate and acceptance.mean_length:
        k = round((acceptance.mean_length - 1.0) / acceptance.rate)  # vLLM chose k (MTP): L = 1 + k * rate
    if not k or k <= 0:
        return None
    if speedup.estimate is None or not math.isfinite(speedup.estimate) or speedup.estimate <= 0:
        return None
    length = acceptance.mean_length
    if length is None and acceptance.rate is not None:
        length = 1.0 + k * acceptance.rate
    if length is None or not math.isfinite(length) or length < 1.0:
        return None
    rate = required_rate(speedup=speedup.estimate, min_speedup=min_speedup, length=length, k=k)
    needed_length = min_speedup / speedup.estimate * length
    result = BreakEven(
        k=k,
        acceptance_rate=rate,
        mean_length=needed_length,
        per_token=per_token_alpha(needed_length, k),
        reachable=rate <= 1.0,
        measured_rate=acceptance.rate if acceptance.rate is not None else (length - 1.0) / k,
        measured_mean_length=length,
    )
    # A faster measured speed-up (its upper bound) needs less acceptance: the bounds swap.
    if speedup.ci_high is not None and speedup.ci_high > 0:
        result.ci_low = required_rate(speedup=speedup.ci_high, min_speedup=min_speedup, length=length, k=k)
    if speedup.ci_low is not None and speedup.ci_low > 0:
        result.ci_high = required_rate(speedup=speedup.ci_low, min_speedup=min_speedup, length=length, k=k)
    if measured_interval is not None:
        result.measured_ci_low, result.measured_ci_high = measured_interval
    return result


def describe(stage: str, b: BreakEven) -> str:
    """One line: 'at c16 speculation pays only above acceptance 0.72 [0.70, 0.75]; measured 0.59 [0.57, 0.61]'."""
    measured = "–" if b.measured_rate is None else f"{b.measured_rate:.2f}"
    if b.measured_ci_low is not None and b.measured_ci_high is not None:
        measured += f" [{b.measured_ci_low:.2f}, {b.measured_ci_high:.2f}]"
    if not b.reachable:
        need = f"no acceptance pays (it would need {b.acceptance_rate:.2f} > 1, mean length {b.mean_length:.2f} > k+1)"
    else:
        need = f"speculation pays only above acceptance {max(b.acceptance_rate, 0.0):.2f}"
        if b.ci_low is not None and b.ci_high is not None:
            high = "> 1" if b.ci_high > 1.0 else f"{b.ci_high:.2f}"
            need += f" [{max(b.ci_low, 0.0):.2f}, {high}]"
        if b.per_token is not None:
            need += f" (per token {b.per_token:.2f})"
    return f"at {stage} {need}; measured {measured}"
