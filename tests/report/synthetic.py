"""Synthetic runs of known effect: records and stage windows as the load generator would write them.

Per request: a prompt effect shared by both arms (long prompts are slow in both), independent
per-arm noise, a true speed-up per stage; optional errors, output mismatches and TTFT regression
(`ttft_ratio` on a TTFT of about `ttft_base` ms).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from specdecode.experiment.records import ArmServerMetrics, RequestRecord, StageWindow
from specdecode.experiment.spec import ExperimentSpec


def run(
    spec: ExperimentSpec,
    *,
    speedup: float | Mapping[str, float] = 1.3,
    n: int | None = None,
    noise: float = 0.15,
    error_rate: float = 0.0,
    mismatch_rate: float = 0.0,
    ttft_ratio: float = 1.0,
    ttft_base: float = 40.0,
    acceptance: float = 0.7,
    tokens: int = 24,
    seed: int = 0,
    warmup: int = 2,
    categories: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[list[RequestRecord], list[StageWindow]]:
    """Records of both arms for every stage of `spec`, and one window per stage.

    `categories`: name → (speed-up, acceptance) of that prompt category, assigned to requests in
    turn (request i gets the (i mod len)-th); they replace `speedup` and `acceptance`.
    """
    kinds = list((categories or {}).items())
    rng = np.random.default_rng(seed)
    k = spec.speculative.num_speculative_tokens or 4
    records: list[RequestRecord] = []
    windows: list[StageWindow] = []
    clock = 0.0
    for w in range(warmup):
        for arm in ("control", "treatment"):
            records.append(
                RequestRecord(
                    stage="warmup",
                    index=w,
                    arm=arm,
                    warmup=True,
                    sent=clock,
                    end=clock + 1,
                    ok=True,
                    tpot_ms=1e6,
                    e2e_ms=1e6,
                    ttft_ms=1e6,
                )
            )
    for stage in spec.workload.stages:
        stage_speedup = speedup[stage.name] if isinstance(speedup, Mapping) else speedup
        count = n if n is not None else spec.stage_requests(stage)
        start = clock
        drafted = accepted = drafts = 0
        for i in range(count):
            category, (s, accept) = kinds[i % len(kinds)] if kinds else (None, (stage_speedup, acceptance))
            prompt = rng.normal(0.0, 0.3)
            sent = clock + (i / stage.rate if stage.rate else i * 0.05)
            text = f"text-{stage.name}-{i}"
            for arm in ("control", "treatment"):
                treat = arm == "treatment"
                tpot = 10.0 * np.exp(prompt + rng.normal(0.0, noise)) / (s if treat else 1.0)
                ttft = (
                    ttft_base * np.exp(0.5 * prompt + rng.normal(0.0, noise)) * (ttft_ratio if treat else 1.0)
                )
                e2e = ttft + tpot * (tokens - 1)
                ok = not (error_rate and rng.random() < error_rate)
                body = text + ("-x" if treat and mismatch_rate and rng.random() < mismatch_rate else "")
                events: list[tuple[float, int]] = []
                spec_decode = None
                if ok:
                    t0 = sent + ttft / 1000.0
                    events.append((t0, 1))
                    done = 1
                    step = 0
                    hist = [0] * (k + 1)
                    while done < tokens:
                        if treat:
                            j = 0
                            while j < k and rng.random() < accept:
                                j += 1
                            hist[j] += 1
                            inc = min(j + 1, tokens - done)
                        else:
                            inc = 1
                        done += inc
                        step += 1
                        events.append((t0 + (e2e - ttft) / 1000.0 * done / tokens, done))
                    if treat:
                        acc = sum(j * h for j, h in enumerate(hist))
                        spec_decode = {
                            "num_spec_steps": sum(hist),
                            "num_accepted_draft_tokens": acc,
                            "num_draft_tokens": k * sum(hist),
                            "acceptance_histogram": hist,
                            "num_spec_tokens": k,
                        }
                        drafted += k * sum(hist)
                        accepted += acc
                        drafts += sum(hist)
                records.append(
                    RequestRecord(
                        stage=stage.name,
                        index=i,
                        arm=arm,
                        prompt_id=f"p{i}",
                        category=category,
                        sent=sent,
                        intended=sent if stage.rate else None,
                        first_token=sent + ttft / 1000.0 if ok else None,
                        end=sent + e2e / 1000.0,
                        events=events,
                        ok=ok,
                        error_class=None if ok else "http_5xx",
                        completion_tokens=tokens if ok else None,
                        text_hash=hashlib.sha256(body.encode()).hexdigest() if ok else None,
                        spec_decode=spec_decode,
                        ttft_ms=ttft if ok else None,
                        tpot_ms=tpot if ok else None,
                        e2e_ms=e2e if ok else None,
                    )
                )
        end = max((r.end or 0.0 for r in records if r.stage == stage.name), default=clock)
        server = (
            {
                "treatment": ArmServerMetrics(
                    num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted
                )
            }
            if drafted
            else {}
        )
        windows.append(StageWindow(stage=stage.name, start=start, end=end, server=server))
        clock = end + 1.0
    return records, windows
