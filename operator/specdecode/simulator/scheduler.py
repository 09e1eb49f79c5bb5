"""The simulator's step model and batch scheduler: pure, no I/O, no clock.

The engine (real time) and the calibration driver (virtual time) both run this code: they call
`plan(now)` at a step boundary, wait `step.duration_s`, then call `complete(step, at)`.

Scheduling (like vLLM's V1 scheduler with chunked prefill):
- a FIFO waiting queue; at each step boundary requests are admitted while fewer than
  `max_num_seqs` run;
- a step holds every running sequence: decode sequences take k+1 tokens of the step's budget
  (`max_num_batched_tokens`), prefilling ones take their next prompt chunk from what is left;
- a sequence whose prompt finishes in a step emits its first token at the end of that step; a
  decode sequence emits 1 + accepted draft tokens, all in ONE chunk, at the end of the step.

Acceptance (treatment): at each position i < k a draft token is accepted with the conditional
probability `acceptance[i]` given all earlier ones were (`acceptanceRate` for every i, or the
conditional form of `synthetic_acceptance_rates` from `--speculative-config`), drawn from a
generator seeded by `--seed`. Mean tokens per step with a constant α: (1 − α^(k+1)) / (1 − α).

Batch-size schedule (vLLM's `num_speculative_tokens_per_batch_size`, reference §1.6): each step's k
is looked up by the number of running sequences after admission (inclusive `[start, end, k]`
ranges, gaps and the tail carry the previous k forward, capped at `num_speculative_tokens`); k = 0
turns speculation off for that step: no drafts, no draft cost, and decode sequences verify one token.

Step time, in ms, with B decode sequences, P prefill tokens in the step, D = sequences that
produce a token (decode + prefill finished) and k speculative tokens (0 for the control):

    target = decode_step_ms + batch_token_ms × B × (k+1) + prefill_token_ms × P
    draft  = k × (draft_fixed_ms + draft_cost_ratio × (decode_step_ms + batch_token_ms × D))    if D > 0
           + draft_cost_ratio × prefill_token_ms × P                                  (draft prefill)
    step   = target + draft                                      (draft = 0 without speculation)

Decode tokens (verified tokens, k+1 per sequence) and prefill tokens have separate slopes: a decode
token also reads its sequence's KV cache, so on the H200 it costs about as much as a prefill token
in a large chunk (both ≈ 0.02 ms); a draft pass costs a fixed launch/sync part plus a fraction of a
target step at the same batch. Speculation thus wins while the target step is memory-bound (small
batch) and loses once k+1 verified tokens per sequence make it compute-bound.
A request enters the waiting queue `request_overhead_ms` after it arrives (API server: HTTP,
tokenisation), which TTFT and E2E include and TPOT does not; the engine and the virtual-time
driver apply it, the scheduler only sees the queue.
Fitted values: `experiment/simprofiles.py`; the fit: `benchmarks/simulator/fit.py`.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from specdecode.experiment import speculative_rules
from specdecode.experiment.simprofiles import SimParams
from specdecode.simulator.metrics import EngineMetrics

PREFIX_BLOCK = 16  # tokens per prefix-cache block, as vLLM's default block size


class Sink(Protocol):
    """Where a sequence's output goes (an HTTP response); `None` in virtual-time runs."""

    def prepare(self, emission: Emission) -> None:
        """Render what this emission will write (called at plan time, before the deadline)."""

    def flush(self, emission: Emission, scheduled: float) -> None:
        """Write it (called at the step boundary `scheduled`)."""


@dataclass(frozen=True)
class SpecConfig:
    """Speculation as the simulator models it."""

    k: int
    acceptance: tuple[float, ...]
    """Conditional acceptance probability per position (length k)."""
    schedule: tuple[tuple[int, int, int], ...] = ()
    """`num_speculative_tokens_per_batch_size` ranges `(start, end, k)`, validated; empty: k always."""

    @staticmethod
    def constant(k: int, alpha: float) -> SpecConfig:
        """Every position accepts with conditional probability `alpha`."""
        return SpecConfig(k=k, acceptance=(alpha,) * k)

    @staticmethod
    def from_unconditional(rates: list[float]) -> SpecConfig:
        """From vLLM's `synthetic_acceptance_rates` (unconditional per-position rates)."""
        cond: list[float] = []
        prev = 1.0
        for r in rates:
            cond.append(0.0 if prev <= 0 else min(1.0, r / prev))
            prev = r
        return SpecConfig(k=len(rates), acceptance=tuple(cond))

    def k_at(self, batch: int) -> int:
        """k for a step with `batch` running sequences (vLLM's lookup, `speculative_rules.batch_schedule_k`)."""
        return speculative_rules.batch_schedule_k(self.schedule, batch, k=self.k)


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    """Tokens to generate (max_tokens, or the deterministic EOS position when earlier)."""
    finish_reason: str
    """"length" or "stop", reported when `output_tokens` are generated."""
    arrival: float
    max_tokens: int = 0
    prompt_blocks: tuple[int, ...] = ()
    """Hashes of the prompt's full 16-token prefix blocks (prefix caching)."""
    sink: Sink | None = None
    error_after: int | None = None
    """Fail in-stream after this many tokens (fault injection)."""
    prefilled: int = 0
    generated: int = 0
    cached_tokens: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    spec_histogram: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Emission:
    """What one sequence emits at the end of a step."""

    seq: Sequence
    tokens: int
    """Tokens in this chunk (1 + accepted, capped at what is left)."""
    generated: int
    """Cumulative output tokens after this chunk."""
    finished: bool
    error: bool = False
    first: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """A planned engine step."""

    duration_s: float
    emissions: list[Emission]
    prefill_tokens: int
    decode_seqs: int
    # spec decode counter deltas, applied at completion
    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_pos: list[int]


class Scheduler:
    """Batch state and step planning. Not thread-safe; one engine loop owns it."""

    def __init__(
        self,
        params: SimParams,
        spec: SpecConfig | None,
        *,
        seed: int,
        metrics: EngineMetrics,
        prefix_caching: bool = False,
    ) -> None:
        self.params = params
        self.spec = spec
        self.k = spec.k if spec else 0
        self._kv_tokens = max(1, params.kv_capacity_tokens(speculative=spec is not None))
        self.metrics = metrics
        self.prefix_caching = prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._rng = random.Random(seed)
        self._prefix_blocks: set[int] = set()
        self.steps = 0

    # ----------------------------------------------------------------------------------- intake
    def add(self, seq: Sequence) -> None:
        """Queue a new request (admitted at the next step boundary)."""
        if self.k and not seq.spec_histogram:
            seq.spec_histogram = [0] * (self.k + 1)
        self.waiting.append(seq)
        self.metrics.waiting = len(self.waiting)

    def has_work(self) -> bool:
        """Whether a step would do anything."""
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------------------------- model
    def step_ms(
        self, *, decode_seqs: int, prefill_tokens: int, producing: int, k: int | None = None
    ) -> float:
        """Step duration in ms for a batch (the formula of the module docstring); `k` defaults to the
        configured one (a step's own k under a batch-size schedule)."""
        p = self.params
        k = self.k if k is None else k
        ms = p.decode_step_ms + p.batch_token_ms * decode_seqs * (k + 1) + p.prefill_token_ms * prefill_tokens
        if k > 0:
            if producing > 0:
                ms += k * (
                    p.draft_fixed_ms + p.draft_cost_ratio * (p.decode_step_ms + p.batch_token_ms * producing)
                )
            ms += p.draft_cost_ratio * p.prefill_token_ms * prefill_tokens
        return ms

    def _draw_accepted(self, k: int) -> int:
        assert self.spec is not None
        rnd = self._rng.random
        a = 0
        for prob in self.spec.acceptance[:k]:
            if rnd() >= prob:
                break
            a += 1
        return a

    # ------------------------------------------------------------------------------------- steps
    def _admit(self, now: float) -> None:
        cap = self.params.max_num_seqs
        while self.waiting and len(self.running) < cap:
            seq = self.waiting.popleft()
            if seq.aborted:
                continue
            seq.scheduled_at = now
            if self.prefix_caching and seq.prompt_blocks:
                hit = 0
                for h in seq.prompt_blocks:
                    if h not in self._prefix_blocks:
                        break
                    hit += 1
                # vLLM always recomputes at least the last prompt token.
                seq.cached_tokens = min(hit * PREFIX_BLOCK, seq.prompt_tokens - 1)
                seq.prefilled = seq.cached_tokens
            self.running.append(seq)

    def plan(self, now: float) -> Step | None:
        """Admit, batch and draw acceptance for the step starting at `now`; None when idle."""
        if any(s.aborted for s in self.running):
            self.running = [s for s in self.running if not s.aborted]
        self._admit(now)
        self.metrics.waiting = len(self.waiting)
        self.metrics.running = len(self.running)
        if not self.running:
            return None
        k = self.spec.k_at(len(self.running)) if self.spec is not None else 0
        budget = self.params.max_num_batched_tokens
        emissions: list[Emission] = []
        decode = 0
        prefill = 0
        drafts = draft_tokens = accepted_total = 0
        per_pos = [0] * self.k
        # Decode sequences first (vLLM schedules running decodes before new prefills).
        for seq in self.running:
            if seq.prefilled < seq.prompt_tokens:
                continue
            decode += 1
            budget -= k + 1
            n = 1
            if k > 0:
                a = self._draw_accepted(k)
                drafts += 1
                draft_tokens += k
                accepted_total += a
                for i in range(a):
                    per_pos[i] += 1
                seq.spec_histogram[a] += 1
                seq.num_draft_tokens += k
                n = 1 + a
            emissions.append(self._emission(seq, n, first=False))
        for seq in self.running:
            left = seq.prompt_tokens - seq.prefilled
            if left <= 0 or budget <= 0:
                continue
            chunk = min(left, budget)
            budget -= chunk
            prefill += chunk
            seq.prefilled += chunk
            if seq.prefilled == seq.prompt_tokens:
                emissions.append(self._emission(seq, 1, first=True))
        duration_ms = self.step_ms(decode_seqs=decode, prefill_tokens=prefill, producing=len(emissions), k=k)
        return Step(
            duration_s=duration_ms / 1000.0,
            emissions=emissions,
            prefill_tokens=prefill,
            decode_seqs=decode,
            drafts=drafts,
            draft_tokens=draft_tokens,
            accepted=accepted_total,
            accepted_per_pos=per_pos,
        )

    def _emission(self, seq: Sequence, n: int, *, first: bool) -> Emission:
        n = min(n, seq.output_tokens - seq.generated)
        seq.generated += n
        if seq.error_after is not None and seq.generated >= seq.error_after:
            return Emission(seq, n, seq.generated, finished=True, error=True, first=first)
        return Emission(seq, n, seq.generated, finished=seq.generated >= seq.output_tokens, first=first)

    def complete(self, step: Step, at: float) -> None:
        """Apply a planned step that ended at `at`: timestamps, metrics, finished sequences."""
        m = self.metrics
        self.steps += 1
        m.iteration_tokens.observe(step.prefill_tokens + sum(e.tokens for e in step.emissions))
        m.prompt_tokens_computed += step.prefill_tokens
        m.spec_drafts += step.drafts
        m.spec_draft_tokens += step.draft_tokens
        m.spec_accepted += step.accepted
        for i, v in enumerate(step.accepted_per_pos):
            m.spec_accepted_per_pos[i] += v
        finished = False
        for em in step.emissions:
            seq = em.seq
            m.generation_tokens += em.tokens
            if em.first:
                seq.first_token_at = at
                m.ttft.observe(at - seq.arrival)
                m.prompt_tokens += seq.prompt_tokens
                m.prefix_cache_queries += seq.prompt_tokens if self.prefix_caching else 0
                m.prefix_cache_hits += seq.cached_tokens
                m.request_prompt_tokens.observe(seq.prompt_tokens)
                if self.prefix_caching:
                    self._prefix_blocks.update(seq.prompt_blocks)
                    if len(self._prefix_blocks) > 2_000_000:
                        self._prefix_blocks.clear()
            elif seq.last_token_at is not None:
                m.itl.observe(at - seq.last_token_at)
            seq.last_token_at = at
            if em.finished:
                finished = True
                seq.finished_at = at
                self._observe_finished(seq, "error" if em.error else seq.finish_reason)
        if finished:
            self.running = [s for s in self.running if s.finished_at is None]
        m.running = len(self.running)
        used = sum(s.prefilled + s.generated for s in self.running)
        m.kv_cache_usage = min(1.0, used / self._kv_tokens)

    def _observe_finished(self, seq: Sequence, reason: str) -> None:
        m = self.metrics
        assert seq.finished_at is not None and seq.scheduled_at is not None
        first = seq.first_token_at if seq.first_token_at is not None else seq.finished_at
        m.success[reason] += 1
        m.e2e.observe(seq.finished_at - seq.arrival)
        m.queue_time.observe(seq.scheduled_at - seq.arrival)
        m.prefill_time.observe(first - seq.scheduled_at)
        decode = seq.finished_at - first
        m.decode_time.observe(decode)
        m.inference_time.observe(seq.finished_at - seq.scheduled_at)
        m.tpot.observe(decode / (seq.generated - 1) if seq.generated > 1 else 0.0)
        m.request_generation_tokens.observe(seq.generated)
        m.request_max_tokens.observe(seq.max_tokens)
