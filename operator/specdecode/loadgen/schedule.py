"""Intended send times of open-loop stages, precomputed from the seed (loadgen-anchors (e)1).

Offsets are seconds from the stage's start, the cumulative sum of independent gaps:
- `poisson`: exponential gaps with mean 1/rate (a Poisson process);
- `constant`: every gap exactly 1/rate;
- `gamma`: Gamma(shape=burstiness, scale=1/(rate·burstiness)) gaps: mean 1/rate, burstiness < 1 is
  burstier than Poisson, 1 is Poisson, large values approach constant spacing.

Unlike `vllm bench serve`, the gaps are *not* rescaled so that the last arrival lands on N/rate:
that rescaling makes the gaps dependent and the process no longer Poisson.
"""

from __future__ import annotations

import random


def gaps(arrival: str, rate: float, n: int, *, seed: int, stage: str, burstiness: float = 1.0) -> list[float]:
    """`n` inter-arrival gaps (seconds); the first is the wait from the stage start."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(f"{seed}:{stage}:arrivals")  # str seeds hash with sha512: stable across runs
    if arrival == "constant":
        return [1.0 / rate] * n
    if arrival == "poisson":
        return [rng.expovariate(rate) for _ in range(n)]
    if arrival == "gamma":
        if burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        return [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n)]
    raise ValueError(f"unknown arrival process {arrival!r}")


def offsets(
    arrival: str, rate: float, n: int, *, seed: int, stage: str, burstiness: float = 1.0
) -> list[float]:
    """Intended send times, seconds from the stage start (non-decreasing)."""
    total = 0.0
    out: list[float] = []
    for gap in gaps(arrival, rate, n, seed=seed, stage=stage, burstiness=burstiness):
        total += gap
        out.append(total)
    return out
