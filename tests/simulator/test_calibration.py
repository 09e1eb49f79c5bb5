"""The shipped profiles reproduce the H200 measurements (benchmarks/h200-vllm-measurements.md).

Runs the scheduler in virtual time with the reference workload (256 in / 128 out, closed loop,
k = 4, acceptance 0.8, 24 requests at C <= 4 and 3C above) and compares median TPOT.

The speed-up (control / treatment TPOT) is also held to SPEEDUP_POINTS percentage points of the
measured one (#23): 10% of a treatment/control ratio near 1 is ~10 points of speed-up, enough to
turn the tiny draft's +13% at C <= 4 into +3%. The shipped profiles are within 5.5 points; the worst
is the tiny draft at C = 16, +3% where the H200 measured -2% (break-even, one run per cell).

The sign of the speed-up must be the H200's wherever the measured effect is above SIGN_NOISE_POINTS:
a restart alone moves a stage by up to 2% (the A/A noise floor on real vLLM at c64, 0.980x,
benchmarks/real-gpu/README.md), and the table is one unpaired run per cell. That exempts one cell, the
tiny draft at C = 16 (-2.4 points measured, +3 in the profile): left open, not settled by one run.
Elsewhere the measured effect is 13 points or more, so the sign check and the 6-point bound agree.
"""

from __future__ import annotations

import pytest

from specdecode.experiment.simprofiles import PROFILES
from specdecode.simulator.scheduler import SpecConfig
from specdecode.simulator.virtual import closed_loop

CONTROL_TPOT_MS = {1: 4.63, 4: 4.67, 16: 4.90, 64: 6.15}
#: how far (in percentage points) a profile's speed-up may be from the measured one
SPEEDUP_POINTS = 6.0
#: a measured speed-up within this many points of none has no sign to reproduce (see the docstring)
SIGN_NOISE_POINTS = 3.0
TREATMENT_TPOT_MS = {
    "h200-8b-draft-1b": {1: 10.63, 4: 8.95, 16: 11.22, 64: 12.22},
    "h200-8b-draft-tiny": {1: 4.08, 4: 4.15, 16: 5.02, 64: 7.12},
}


def simulated_tpot_ms(profile: str, concurrency: int) -> tuple[float, float]:
    """Median TPOT of the control and the treatment (k = 4, acceptance 0.8) in virtual time."""
    params = PROFILES[profile]
    n = 24 if concurrency <= 4 else 3 * concurrency
    control = closed_loop(params, None, concurrency=concurrency, num_requests=n).tpot_p50_ms
    treatment = closed_loop(
        params, SpecConfig.constant(4, 0.8), concurrency=concurrency, num_requests=n
    ).tpot_p50_ms
    return control, treatment


@pytest.mark.parametrize("profile", sorted(TREATMENT_TPOT_MS))
@pytest.mark.parametrize("concurrency", [1, 4, 16, 64])
def test_profile_reproduces_h200_control_tpot_and_speculation_ratio_within_10_percent_and_speedup_within_6_points(
    profile: str, concurrency: int
) -> None:
    control, treatment = simulated_tpot_ms(profile, concurrency)
    assert control == pytest.approx(CONTROL_TPOT_MS[concurrency], rel=0.10)
    measured_ratio = TREATMENT_TPOT_MS[profile][concurrency] / CONTROL_TPOT_MS[concurrency]
    assert treatment / control == pytest.approx(measured_ratio, rel=0.10)
    speedup_points = (control / treatment - 1 / measured_ratio) * 100
    assert abs(speedup_points) <= SPEEDUP_POINTS, f"speed-up {speedup_points:+.1f} points off the H200's"


def measured_points(profile: str, concurrency: int) -> float:
    return (CONTROL_TPOT_MS[concurrency] / TREATMENT_TPOT_MS[profile][concurrency] - 1) * 100


CELLS = [(p, c) for p in sorted(TREATMENT_TPOT_MS) for c in sorted(CONTROL_TPOT_MS)]
SIGNED = [cell for cell in CELLS if abs(measured_points(*cell)) > SIGN_NOISE_POINTS]


def test_only_the_tiny_draft_at_c16_is_too_close_to_no_effect_for_a_sign() -> None:
    assert sorted(set(CELLS) - set(SIGNED)) == [("h200-8b-draft-tiny", 16)]


@pytest.mark.parametrize(("profile", "concurrency"), SIGNED)
def test_profile_s_speedup_has_the_h200_s_sign_where_the_h200_measured_one(
    profile: str, concurrency: int
) -> None:
    control, treatment = simulated_tpot_ms(profile, concurrency)
    simulated, measured = (control / treatment - 1) * 100, measured_points(profile, concurrency)
    assert (simulated > 0) == (measured > 0), (
        f"{profile} at C={concurrency}: simulated {simulated:+.1f}%, H200 {measured:+.1f}%"
    )


def test_the_control_s_ttft_at_c1_is_the_h200_s() -> None:
    """TTFT at C = 1 is the request overhead, the prefill and one step: 20.6 ms measured on the H200
    (256-token prompts), within 15% (mutation benchmark survivor in simprofiles: the prefill cost per
    token, shared by every profile, 1.014 ms instead of 0.014)."""
    result = closed_loop(PROFILES["h200-8b-draft-tiny"], None, concurrency=1, num_requests=24)
    assert result.ttft_p50_ms == pytest.approx(20.6, rel=0.15)
