"""The step model and scheduler, in virtual time (no sockets, no sleeping)."""

from __future__ import annotations

import math

import pytest

from specdecode.experiment import promql
from specdecode.experiment.simprofiles import SimParams
from specdecode.loadgen import scrape
from specdecode.simulator.metrics import EngineMetrics
from specdecode.simulator.scheduler import Scheduler, Sequence, SpecConfig
from specdecode.simulator.virtual import closed_loop


def make(params: SimParams, spec: SpecConfig | None, seed: int = 1) -> Scheduler:
    return Scheduler(
        params, spec, seed=seed, metrics=EngineMetrics(model_name="m", num_spec_tokens=spec.k if spec else 0)
    )


def seq(i: int, *, prompt: int = 8, out: int = 10**9) -> Sequence:
    return Sequence(
        request_id=str(i), prompt_tokens=prompt, output_tokens=out, finish_reason="length", arrival=0.0
    )


@pytest.mark.parametrize(("alpha", "k"), [(0.8, 4), (0.5, 3), (0.9, 7), (0.0, 2)])
def test_mean_tokens_per_step_for_one_sequence_matches_the_geometric_formula(alpha: float, k: int) -> None:
    sched = make(SimParams(), SpecConfig.constant(k, alpha))
    sched.add(seq(0))
    now = 0.0
    tokens: list[int] = []
    for _ in range(20_001):
        step = sched.plan(now)
        assert step is not None
        now += step.duration_s
        sched.complete(step, now)
        if not step.emissions[0].first:
            tokens.append(step.emissions[0].tokens)
    n = len(tokens)
    mean = sum(tokens) / n
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    var = sum((t - mean) ** 2 for t in tokens) / (n - 1)
    assert abs(mean - expected) <= 4 * math.sqrt(var / n) + 1e-9


def test_step_time_grows_with_the_batch_as_configured() -> None:
    params = SimParams(
        decode_step_ms=5.0, batch_token_ms=0.1, prefill_token_ms=0.0, draft_cost_ratio=0.5, draft_fixed_ms=1.0
    )
    for spec, k in ((None, 0), (SpecConfig.constant(3, 0.0), 3)):
        durations = {}
        for batch in (1, 2, 8, 32):
            sched = make(params, spec)
            for i in range(batch):
                sched.add(seq(i, prompt=1))
            first = sched.plan(0.0)  # the prefill step
            assert first is not None
            sched.complete(first, first.duration_s)
            step = sched.plan(first.duration_s)
            assert step is not None and step.decode_seqs == batch
            durations[batch] = step.duration_s * 1000
            draft = k * (1.0 + 0.5 * (5.0 + 0.1 * batch)) if k else 0.0
            assert durations[batch] == pytest.approx(5.0 + 0.1 * batch * (k + 1) + draft)
        assert durations[1] < durations[2] < durations[8] < durations[32]


def test_max_num_seqs_keeps_further_requests_waiting_in_fifo_order() -> None:
    sched = make(SimParams(max_num_seqs=2), None)
    for i in range(4):
        sched.add(seq(i, prompt=4, out=2))
    now = 0.0
    order: list[str] = []
    while (step := sched.plan(now)) is not None:
        assert len(sched.running) <= 2
        now += step.duration_s
        sched.complete(step, now)
        order += [e.seq.request_id for e in step.emissions if e.finished]
    assert order == ["0", "1", "2", "3"]
    assert sched.metrics.queue_time.count == 4


def test_prefill_is_chunked_under_the_token_budget_and_competes_with_decode() -> None:
    params = SimParams(
        decode_step_ms=1.0, batch_token_ms=0.0, prefill_token_ms=0.01, max_num_batched_tokens=100
    )
    sched = make(params, None)
    sched.add(seq(0, prompt=10))
    step = sched.plan(0.0)
    assert step is not None
    sched.complete(step, step.duration_s)
    sched.add(seq(1, prompt=250))
    step = sched.plan(1.0)
    assert step is not None
    assert step.decode_seqs == 1 and step.prefill_tokens == 99
    assert step.duration_s * 1000 == pytest.approx(1.0 + 0.01 * 99)


def test_spec_decode_counters_add_up() -> None:
    result = closed_loop(SimParams(), SpecConfig.constant(4, 0.7), concurrency=4, num_requests=16)
    m = result.scheduler.metrics
    assert m.spec_draft_tokens == 4 * m.spec_drafts
    assert m.spec_accepted == sum(m.spec_accepted_per_pos)
    assert m.spec_accepted_per_pos == sorted(m.spec_accepted_per_pos, reverse=True)
    assert m.generation_tokens == 16 * 128
    assert m.success["length"] == 16


def test_synthetic_acceptance_rates_become_conditional_probabilities() -> None:
    spec = SpecConfig.from_unconditional([0.8, 0.64, 0.512, 0.4096])
    assert spec.acceptance == pytest.approx((0.8, 0.8, 0.8, 0.8))


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (((1, 4, 3),), {1: 3, 4: 3, 5: 3, 4096: 3}),  # the tail carries the last k forward
        (((1, 2, 4), (3, 4096, 0)), {1: 4, 2: 4, 3: 0, 64: 0}),
        (((1, 2, 1), (5, 8, 2)), {2: 1, 3: 1, 4: 1, 5: 2, 9: 2}),  # a gap carries the previous k
        (((1, 8, 9),), {1: 4, 8: 4}),  # capped at num_speculative_tokens
        ((), {1: 4, 100: 4}),
    ],
)
def test_the_batch_size_schedule_gives_k_by_running_sequences_as_vllm_looks_it_up(
    schedule: tuple[tuple[int, int, int], ...], expected: dict[int, int]
) -> None:
    spec = SpecConfig(k=4, acceptance=(0.5,) * 4, schedule=schedule)
    assert {batch: spec.k_at(batch) for batch in expected} == expected


def test_a_step_above_the_schedules_switch_off_point_neither_drafts_nor_pays_for_drafting() -> None:
    params = SimParams(
        decode_step_ms=5.0, batch_token_ms=0.1, prefill_token_ms=0.0, draft_cost_ratio=0.5, draft_fixed_ms=1.0
    )
    spec = SpecConfig(k=3, acceptance=(1.0,) * 3, schedule=((1, 2, 3), (3, 4096, 0)))
    for batch, k in ((2, 3), (3, 0), (8, 0)):
        sched = make(params, spec)
        for i in range(batch):
            sched.add(seq(i, prompt=1))
        first = sched.plan(0.0)
        assert first is not None
        sched.complete(first, first.duration_s)
        step = sched.plan(first.duration_s)
        assert step is not None and step.decode_seqs == batch
        draft = k * (1.0 + 0.5 * (5.0 + 0.1 * batch)) if k else 0.0
        assert step.duration_s * 1000 == pytest.approx(5.0 + 0.1 * batch * (k + 1) + draft)
        assert step.drafts == (batch if k else 0) and step.draft_tokens == batch * k
        assert {e.tokens for e in step.emissions} == {1 + k}  # acceptance 1: every draft is kept


def test_under_a_schedule_the_closed_loop_speculates_only_at_low_concurrency() -> None:
    params = SimParams()
    always = SpecConfig.constant(4, 0.7)
    scheduled = SpecConfig(k=4, acceptance=always.acceptance, schedule=((1, 1, 4), (2, 4096, 0)))
    one = closed_loop(params, scheduled, concurrency=1, num_requests=8)
    many = closed_loop(params, scheduled, concurrency=16, num_requests=32)
    plain = closed_loop(params, None, concurrency=16, num_requests=32)
    assert one.scheduler.metrics.spec_drafts > 0
    assert one.tpot_p50_ms == pytest.approx(
        closed_loop(params, always, concurrency=1, num_requests=8).tpot_p50_ms
    )
    # at 16 running sequences nothing is drafted except while the batch fills or drains to one
    m = many.scheduler.metrics
    assert m.spec_drafts < 0.05 * m.generation_tokens
    assert many.tpot_p50_ms == pytest.approx(plain.tpot_p50_ms, rel=0.02)


def _serve_alone(sched: Scheduler, s: Sequence, now: float) -> tuple[int, float]:
    """Run `s` to its end alone; (prefill tokens it computed, when it ended)."""
    sched.add(s)
    prefill = 0
    while (step := sched.plan(now)) is not None:
        prefill += step.prefill_tokens
        now += step.duration_s
        sched.complete(step, now)
    return prefill, now


def test_a_repeated_prefix_is_served_from_the_prefix_cache_and_counted_as_vllm_counts_it() -> None:
    # turn 2 of a session repeats turn 1's 4 blocks of 16 tokens and adds 2 blocks of its own
    turn1 = tuple(range(4))
    turn2 = (*turn1, 101, 102)
    sched = Scheduler(
        SimParams(),
        None,
        seed=1,
        metrics=EngineMetrics(model_name="m", num_spec_tokens=0, prefix_caching=True),
        prefix_caching=True,
    )
    first = Sequence(
        "1", prompt_tokens=70, output_tokens=4, finish_reason="length", arrival=0.0, prompt_blocks=turn1
    )
    prefill1, now = _serve_alone(sched, first, 0.0)
    second = Sequence(
        "2", prompt_tokens=100, output_tokens=4, finish_reason="length", arrival=now, prompt_blocks=turn2
    )
    prefill2, _ = _serve_alone(sched, second, now)
    assert (first.cached_tokens, prefill1) == (0, 70)
    assert (second.cached_tokens, prefill2) == (64, 36)  # only what turn 1 did not have is prefilled
    m = sched.metrics
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (170, 64)
    # the names the load generator (and Prometheus) read: hit rate = hits / queries
    snap = scrape.parse(m.render().decode())
    assert snap.values[scrape.PREFIX_QUERIES] == 170 and snap.values[scrape.PREFIX_HITS] == 64
    assert scrape.PREFIX_QUERIES == promql.PREFIX_QUERIES and scrape.PREFIX_HITS == promql.PREFIX_HITS


def test_without_prefix_caching_nothing_is_looked_up_or_reused() -> None:
    sched = make(SimParams(), None)
    blocks = tuple(range(4))
    for i in range(2):
        s = Sequence(
            str(i),
            prompt_tokens=70,
            output_tokens=2,
            finish_reason="length",
            arrival=0.0,
            prompt_blocks=blocks,
        )
        assert _serve_alone(sched, s, 0.0)[0] == 70
    assert (sched.metrics.prefix_cache_queries, sched.metrics.prefix_cache_hits) == (0, 0)
