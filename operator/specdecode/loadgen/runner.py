"""Running a plan against the arms: paired requests, open and closed loop, streamed results.

Pairing (records.py): request `index` of a stage carries the same prompt bytes and seed to every
arm, and both arms run each stage at the same time from this one process.
- **Open loop**: one pacer per stage sleeps until intended time `t0 + offset[index]`, then starts
  the request on every arm (alternating which arm goes first, so neither is always a few µs
  ahead). Both records carry the same `intended`.
- **Closed loop** at concurrency C: each arm runs its own C worker slots; every slot takes the next
  index of *its arm's* sequence (0, 1, 2, ... in order) when its previous request ends. So each arm
  keeps exactly C requests in flight, index i is the i-th request that arm dispatched, and the pair
  (stage, i) has the same prompt on both arms but not necessarily the same send time (a faster arm
  runs ahead). `intended` is null; `slot` says which worker sent it.
- **Multi-turn sessions** (closed loop, `sessions.py`): a slot takes the next *session* of its
  arm's sequence and sends its turns in order, each once that arm's reply to the turn before has
  been read to its end; C is the number of sessions in flight, and each turn is a pair
  (stage, index) like any request.
- A stage ends when its requests are all sent (or the stop rule fired) and every in-flight
  request has finished: the drain. The next stage starts only after that.

Sequential stopping: when the completed pairs reach one of the stage's planned looks
(`StagePlan.looks`, else every `plan.look_every` pairs) the `stop_rule(stage, records)` is
called with the stage's records of completed pairs; when it returns True no new request is sent,
in-flight ones drain, and the window is marked `stopped_early`.

Outputs under `out_dir` (nothing elsewhere):
- `requests.jsonl`: one `RequestRecord` per line, appended and flushed as each **pair** completes
  (so `diverges_at` can be filled); on cancellation the unpaired and in-flight records are written
  too (in-flight ones with `error_class: cancelled`).
- `windows.json`: `{"anchor": RunAnchor, "windows": [StageWindow...]}`, rewritten after each stage.
- `loadgen-summary.json`: per-stage/arm summaries, metric definitions, validity (`summary.py`).

Beside this module: one request's record (`recording.py`), the HTTP client (`http.py` over
`connection.py`), the event loop, its send gate and lag ticker (`eventloop.py`), the arms'
`/metrics` scrapes (`scrape.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specdecode.experiment import records, spec, validity
from specdecode.loadgen import eventloop, http, pacer, recording, scrape, sse, summary
from specdecode.loadgen.plan import Plan, StagePlan, StopRule

log = logging.getLogger(__name__)

REQUESTS_FILE = "requests.jsonl"
WINDOWS_FILE = "windows.json"
SUMMARY_FILE = "loadgen-summary.json"


@dataclass(frozen=True)
class Endpoint:
    """One arm's server: the base URL (`http://host:port`, without `/v1`), where to scrape, the key."""

    url: str
    metrics_url: str | None = None
    """Base URL for `/metrics` (the pod, not a Service); default: `url`."""
    api_key: str | None = None


@dataclass(frozen=True)
class StageStarted:
    """Progress: a stage began."""

    stage: str
    position: int
    total: int
    requests: int
    load: str
    warmup: bool


@dataclass(frozen=True)
class RequestDone:
    """Progress: one request of one arm finished."""

    stage: str
    index: int
    arm: spec.Arm
    ok: bool
    error_class: str | None


@dataclass(frozen=True)
class StageFinished:
    """Progress: a stage drained."""

    stage: str
    stopped_early: bool
    window: records.StageWindow


ProgressEvent = StageStarted | RequestDone | StageFinished
Progress = Callable[[ProgressEvent], None]


@dataclass
class RunResult:
    """What `run` produced (the files under `out_dir` hold the same)."""

    out_dir: Path
    anchor: records.RunAnchor
    windows: list[records.StageWindow]
    summary: dict[str, Any]
    records_written: int
    interrupted: bool = False

    @property
    def validity(self) -> validity.Validity | None:
        """The summary's validity block (None: the run wrote no summary)."""
        return validity.Validity.of_summary(self.summary)

    @property
    def valid(self) -> bool:
        """The client's own overhead stayed inside its budgets."""
        block = self.validity
        return block is not None and block.valid


@dataclass
class _StageState:
    plan: StagePlan
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    pending: dict[int, dict[str, records.RequestRecord]] = field(default_factory=dict)
    completed: list[records.RequestRecord] = field(default_factory=list)
    pairs: int = 0
    next_look: int = 0
    """Index into `plan.looks` of the next look the stop rule has not been asked about."""
    stopped_early: bool = False
    start: float = 0.0
    last_end: float = 0.0
    kv_max: dict[spec.Arm, float] = field(default_factory=dict)


@dataclass
class _Done:
    """A finished exchange waiting for the parser."""

    st: _StageState
    index: int
    arm: spec.Arm
    rid: str
    ex: http.Exchange
    intended: float | None
    slot: int | None


def looks_reached(looks: Sequence[int], next_look: int, pairs: int) -> int:
    """The index of the first planned look beyond `pairs` completed pairs, counting on from `next_look`
    (the looks before it were asked about already): the stop rule is due when this moved."""
    while next_look < len(looks) and looks[next_look] <= pairs:
        next_look += 1
    return next_look


def pair_order(arms: Sequence[spec.Arm], index: int) -> Sequence[spec.Arm]:
    """The order in which request `index` of an open-loop stage is written to the arms: alternating, so
    neither arm's request always leaves first (the second waits for the first's write)."""
    return arms if index % 2 == 0 else arms[::-1]


class _Run:
    def __init__(
        self,
        plan: Plan,
        endpoints: Mapping[spec.Arm, Endpoint],
        out_dir: Path,
        stop_rule: StopRule | None,
        progress: Progress | None,
    ) -> None:
        self.plan = plan
        self.arms = [a for a in spec.Arm if a in endpoints]
        self.endpoints = endpoints
        self.out_dir = out_dir
        self.stop_rule = stop_rule
        self.progress_cb = progress
        self.origins = {arm: http.Origin.parse(ep.url) for arm, ep in endpoints.items()}
        self.pools = {
            arm: http.Pool(self.origins[arm], kernel_stamps=plan.kernel_timestamps) for arm in self.arms
        }
        self.metric_pools = {
            arm: http.Pool(http.Origin.parse(ep.metrics_url or ep.url)) for arm, ep in endpoints.items()
        }
        mono, wall = time.monotonic(), time.time()
        self.anchor = records.RunAnchor(monotonic=mono, wall=wall)
        self.windows: list[records.StageWindow] = []
        self.records: list[records.RequestRecord] = []
        self.loop_lags: list[float] = []
        self.file: IO[str] | None = None
        self.written = 0
        self.current: _StageState | None = None
        self.summary: dict[str, Any] = {}
        self._parse_queue: asyncio.Queue[_Done] = asyncio.Queue()
        self.gate = eventloop.SendGate()
        self._progress_failed = False

    # ---------------------------------------------------------------------------------- outputs
    def _emit(self, event: ProgressEvent) -> None:
        if self.progress_cb is None:
            return
        try:
            self.progress_cb(event)
        except Exception:
            if not self._progress_failed:
                log.exception("progress callback failed; continuing without it")
                self._progress_failed = True

    def _write(self, rec: records.RequestRecord) -> None:
        self.records.append(rec)
        if self.file is not None:
            self.file.write(rec.model_dump_json() + "\n")
            self.file.flush()
            self.written += 1

    def _write_windows(self) -> None:
        doc = {"anchor": self.anchor.model_dump(), "windows": [w.model_dump() for w in self.windows]}
        (self.out_dir / WINDOWS_FILE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

    # ---------------------------------------------------------------------------------- one request
    def _payload(
        self, arm: spec.Arm, stage: str, req_index: int, path: str, body: bytes
    ) -> tuple[str, bytes]:
        rid = f"{self.plan.salt}-{stage}-{req_index}-{arm}"
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "x-request-id": rid}
        key = self.endpoints[arm].api_key
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return rid, http.request_bytes(self.origins[arm], "POST", path, headers, body)

    async def _one(
        self,
        st: _StageState,
        i: int,
        arm: spec.Arm,
        payload: tuple[str, bytes],
        intended: float | None,
        slot: int | None,
        ex: http.Exchange | None = None,
        started: http.Started | None = None,
    ) -> None:
        ex = ex if ex is not None else http.Exchange()
        try:
            await http.exchange(
                self.pools[arm], payload[1], limit_s=self.plan.request_timeout_s, ex=ex, started=started
            )
        except asyncio.CancelledError:
            rec = recording.record(
                st.plan, self.anchor.monotonic, i, arm, payload[0], ex, intended, slot, None, cancelled=True
            )
            self._done(st, rec)
            raise
        # Parsing waits for the parser task: a closed-loop slot sends its next request now, and a
        # burst of completions never holds up the reading (and stamping) of other streams.
        self._parse_queue.put_nowait(_Done(st, i, arm, payload[0], ex, intended, slot))

    async def _parser(self) -> None:
        """Turns finished exchanges into records, one per event-loop iteration."""
        queue = self._parse_queue
        while True:
            item = await queue.get()
            try:
                parsed = await recording.parse(item.ex)
            except asyncio.CancelledError:
                self._parse_one(item, recording.parse_now(item.ex))  # interrupted: keep it
                queue.task_done()
                raise
            except Exception as exc:  # a parser bug must not end this task: queue.join() would hang
                log.exception("could not parse %s %s #%d", item.st.plan.name, item.arm, item.index)
                parsed = exc
            try:
                self._parse_one(item, parsed)
            except Exception:  # a bug here must not stall the drain (queue.join)
                log.exception("could not record %s %s #%d", item.st.plan.name, item.arm, item.index)
            finally:
                queue.task_done()
            await asyncio.sleep(0)  # let the loop poll sockets between two records

    def _parse_one(self, item: _Done, parsed: sse.Stream | BaseException | None) -> None:
        sp, anchor = item.st.plan, self.anchor.monotonic
        rec = recording.record(
            sp, anchor, item.index, item.arm, item.rid, item.ex, item.intended, item.slot, parsed
        )
        self._done(item.st, rec)

    def _parse_backlog(self) -> None:
        """On interruption: parse what is queued, synchronously."""
        while not self._parse_queue.empty():
            item = self._parse_queue.get_nowait()
            self._parse_one(item, recording.parse_now(item.ex))
            self._parse_queue.task_done()

    def _done(self, st: _StageState, rec: records.RequestRecord) -> None:
        if rec.end is not None:
            st.last_end = max(st.last_end, rec.end + self.anchor.monotonic)
        self._emit(RequestDone(rec.stage, rec.index, rec.arm, rec.ok, rec.error_class))
        slot = st.pending.setdefault(rec.index, {})
        slot[rec.arm] = rec
        if len(slot) < len(self.arms):
            return
        del st.pending[rec.index]
        pair = [slot[a] for a in self.arms]
        if len(pair) == 2:
            at = recording.diverges_at(pair[0].text, pair[1].text)
            pair = [r.model_copy(update={"diverges_at": at}) for r in pair]
        for r in pair:
            self._write(r)
        st.completed.extend(pair)
        st.pairs += 1
        if self.stop_rule is not None and not st.plan.warmup and not st.stop.is_set() and self._look_due(st):
            try:
                stop = self.stop_rule(st.plan.name, list(st.completed))
            except Exception:
                log.exception("stop rule failed; the stage continues to its bound")
                stop = False
            if stop:
                # the design also decides at the stage's last pair: that is its bound, not an early stop
                st.stopped_early = st.pairs < len(st.plan.requests)
                st.stop.set()

    def _look_due(self, st: _StageState) -> bool:
        """Whether the pairs completed so far reached a look not asked about yet."""
        looks = st.plan.looks
        if not looks:
            return st.pairs % self.plan.look_every == 0
        reached = looks_reached(looks, st.next_look, st.pairs)
        due = reached > st.next_look
        st.next_look = reached
        return due

    def _flush_pending(self, st: _StageState) -> None:
        for index in sorted(st.pending):
            for arm in self.arms:
                rec = st.pending[index].get(arm)
                if rec is not None:
                    self._write(rec)
        st.pending.clear()

    # ---------------------------------------------------------------------------------- stages
    def _spawn(self, st: _StageState, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        st.tasks.add(task)
        task.add_done_callback(st.tasks.discard)

    async def _open_loop(self, st: _StageState) -> None:
        sp = st.plan
        assert sp.offsets is not None
        payloads = [
            {arm: self._payload(arm, sp.name, sp.index_of(i), r.path, r.body) for arm in self.arms}
            for i, r in enumerate(sp.requests)
        ]
        t0 = time.monotonic() + self.plan.lead_s
        st.start = t0 + (sp.offsets[0] if sp.offsets else 0.0)
        with pacer.Pacer() as clock:
            await self._send_on_schedule(st, clock, t0, payloads)

    async def _send_on_schedule(
        self,
        st: _StageState,
        clock: pacer.Pacer,
        t0: float,
        payloads: list[dict[spec.Arm, tuple[str, bytes]]],
    ) -> None:
        sp = st.plan
        assert sp.offsets is not None
        for i in range(len(sp.requests)):
            target = t0 + sp.offsets[i]
            await clock.sleep_until(target)
            if st.stop.is_set():
                break
            for arm in pair_order(self.arms, sp.index_of(i)):
                # written here and now when a pooled connection is idle; the task reads the response
                ex = http.Exchange()
                started = http.send_now(self.pools[arm], payloads[i][arm][1], ex)
                self._spawn(st, self._one(st, i, arm, payloads[i][arm], target, None, ex, started))

    async def _closed_loop(self, st: _StageState) -> None:
        sp = st.plan
        assert sp.concurrency is not None
        n = len(sp.requests)
        next_unit = dict.fromkeys(self.arms, 0)

        payloads = {
            arm: [
                self._payload(arm, sp.name, sp.index_of(i), r.path, r.body) for i, r in enumerate(sp.requests)
            ]
            for arm in self.arms
        }
        # a slot's unit of work: one request, or one session's turns in order
        units = sp.sessions or [[i] for i in range(n)]

        async def worker(arm: spec.Arm, slot: int) -> None:
            while not st.stop.is_set():
                await self.gate.turn()
                u = next_unit[arm]
                if u >= len(units) or st.stop.is_set():
                    return
                next_unit[arm] = u + 1
                for turn, i in enumerate(units[u]):
                    if turn:  # the reply to the turn before is complete: _one returned
                        await self.gate.turn()
                        if st.stop.is_set():
                            return
                    await self._one(st, i, arm, payloads[arm][i], None, slot)

        st.start = time.monotonic()
        for slot in range(min(sp.concurrency, len(units))):
            for arm in self.arms:
                self._spawn(st, worker(arm, slot))

    async def _stage(self, sp: StagePlan, position: int) -> None:
        st = _StageState(sp)
        self.current = st
        load = f"{sp.rate:g} req/s" if sp.rate is not None else f"concurrency {sp.concurrency}"
        self._emit(StageStarted(sp.name, position, len(self.plan.stages), len(sp.requests), load, sp.warmup))
        scraping = self.plan.scrape_metrics and not sp.warmup
        before = await scrape.snapshots(self.metric_pools, self.arms) if scraping else {}
        watcher = None
        if scraping and self.plan.scrape_interval_s > 0:
            watch = scrape.watch_kv_usage(
                self.metric_pools, self.arms, self.plan.scrape_interval_s, st.kv_max
            )
            watcher = asyncio.get_running_loop().create_task(watch)
        # connections ready before the first send (open loop: a guess; closed loop: exact)
        warm = sp.concurrency if sp.concurrency else min(256, max(4, int((sp.rate or 1) * 2)))
        await asyncio.gather(*(self.pools[arm].prewarm(warm) for arm in self.arms))
        # no cyclic GC inside a stage: a full collection over the records pauses the loop for
        # milliseconds, which would show up as measurement error; collect at the boundary instead
        gc.collect()
        gc.disable()
        try:
            if sp.open_loop:
                await self._open_loop(st)
            else:
                await self._closed_loop(st)
            while st.tasks:  # drain
                await asyncio.gather(*list(st.tasks))
            await self._parse_queue.join()
        finally:
            gc.enable()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        after = await scrape.snapshots(self.metric_pools, self.arms) if scraping else {}
        scrape.note_kv_usage(after, st.kv_max)
        self._flush_pending(st)
        window = self._window(st)
        if scraping:
            window.server = {
                arm: scrape.delta(before.get(arm), after.get(arm), st.kv_max.get(arm)) for arm in self.arms
            }
        self.windows.append(window)
        self.current = None
        self._write_windows()
        self._emit(StageFinished(sp.name, st.stopped_early, window))

    def _window(self, st: _StageState) -> records.StageWindow:
        start = st.start or time.monotonic()
        end = st.last_end or time.monotonic()
        return records.StageWindow(
            stage=st.plan.name,
            start=start - self.anchor.monotonic,
            end=max(end, start) - self.anchor.monotonic,
            stopped_early=st.stopped_early,
        )

    async def run(self) -> RunResult:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.file = (self.out_dir / REQUESTS_FILE).open("w", encoding="utf-8")
        ticker = asyncio.get_running_loop().create_task(eventloop.tick_lags(self.loop_lags))
        parser = asyncio.get_running_loop().create_task(self._parser())
        cpu0, wall0 = time.process_time(), time.monotonic()
        interrupted = False
        try:
            for position, sp in enumerate(self.plan.stages):
                await self._stage(sp, position)
        except asyncio.CancelledError:
            interrupted = True
            raise
        finally:
            st = self.current
            if st is not None:  # interrupted mid-stage: keep what it measured
                for task in list(st.tasks):
                    task.cancel()
                await asyncio.gather(*list(st.tasks), return_exceptions=True)
            parser.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await parser
            self._parse_backlog()
            if st is not None:
                self._flush_pending(st)
                self.windows.append(self._window(st))
                self._write_windows()
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            cpu = (time.process_time() - cpu0) / max(time.monotonic() - wall0, 1e-9) * 100
            self.summary = summary.build(
                self.plan,
                self.records,
                self.windows,
                self.anchor,
                loop_lags_ms=self.loop_lags,
                cpu_percent=cpu,
                interrupted=interrupted,
                connections={a: p.opened for a, p in self.pools.items()},
                stamps="kernel" if all(p.kernel_timestamps for p in self.pools.values()) else "loop",
            )
            (self.out_dir / SUMMARY_FILE).write_text(
                json.dumps(self.summary, indent=1) + "\n", encoding="utf-8"
            )
            self.file.close()
            for pool in [*self.pools.values(), *self.metric_pools.values()]:
                pool.close()
        return RunResult(self.out_dir, self.anchor, self.windows, self.summary, self.written, interrupted)


async def run(
    plan: Plan,
    endpoints: Mapping[spec.Arm, Endpoint],
    out_dir: Path,
    *,
    stop_rule: StopRule | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Run every stage of `plan` against the arms in `endpoints` (`control`, `treatment`; the arms'
    names are read as `spec.Arm`, so a dict keyed by the names serves too).

    Writes `requests.jsonl`, `windows.json` and `loadgen-summary.json` under `out_dir`. Request
    failures are recorded, never raised. Cancelling the task keeps what was measured (the files
    are complete up to the cancellation) and re-raises `CancelledError`.
    """
    if not endpoints:
        raise ValueError("no endpoint to load")
    known = set(spec.Arm)
    unknown = [str(a) for a in endpoints if a not in known]
    if unknown:
        raise ValueError(f"endpoints: unknown arm(s) {unknown}; the arms are {[a.value for a in spec.Arm]}")
    arms = {spec.Arm(a): ep for a, ep in endpoints.items()}
    return await _Run(plan, arms, out_dir, stop_rule, progress).run()
