"""`run --local`'s load, watched: the load generator in this process, stopped as soon as an arm's
process dies, an arm cannot be reached or stops answering (`ArmLost`), or the load runs past
`spec.deadlines.run`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from specdecode.experiment import records, spec
from specdecode.experiment.status import ExperimentStatus
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import runner
from specdecode.local import engines, lifecycle, view


class ArmFailure(lifecycle.Failure):
    """An arm stopped serving during the run."""


def errors_only(recs: Sequence[records.RequestRecord], endpoints: Mapping[spec.Arm, runner.Endpoint]) -> None:
    """ArmFailure `EngineErrors` for an arm that answered every measured request with an error."""
    for arm in endpoints:
        mine = [r for r in recs if r.arm == arm and not r.warmup]
        if mine and not any(r.ok for r in mine):
            classes = sorted({r.error_class or "other" for r in mine})
            example = next((r.error for r in mine if r.error), "")
            raise ArmFailure(
                "EngineErrors",
                f"the {arm} arm answered every request with an error ({', '.join(classes)}): {example}",
            )


def stop_rule(
    s: spec.ExperimentSpec, show: view.View, earlier: Sequence[records.RequestRecord] = ()
) -> Callable[[str, Sequence[records.RequestRecord]], bool]:
    """The load generator's sequential stopping, also feeding the live view's running speed-up.

    `earlier`: records of the other arm measured before this load (one GPU), joined by stage.
    """
    sequential = plan_mod.stop_rule(s)

    def decided(stage: str, recs: Sequence[records.RequestRecord]) -> bool:
        both = [*(r for r in earlier if r.stage == stage), *recs] if earlier else list(recs)
        show.note_speedup(stage, both)
        return sequential is not None and sequential(stage, both)

    return decided


def deadline_of(s: spec.ExperimentSpec, decided: ExperimentStatus) -> float | None:
    """When the load that `decided` asks for must end, on `time.monotonic()`: its phase's start plus
    `spec.deadlines.run`, as the core reckons it (None: no start recorded)."""
    if not decided.phase_started_at:
        return None
    end = datetime.fromisoformat(decided.phase_started_at) + timedelta(seconds=s.deadlines.run_seconds)
    return time.monotonic() + (end - datetime.now(UTC)).total_seconds()


class DeadlinePassed(Exception):
    """The load ran past `spec.deadlines.run` and was stopped; what it measured stays in its DIR, and
    the core ends the run (or the round) as the operator's does (`RunDeadlineExceeded`)."""


#: error classes of a request that never reached a server, or lost it mid-answer
GONE = frozenset({"connect", "disconnect"})


@dataclass(frozen=True)
class Lost:
    """An arm that answered, then stopped: its last `streak` requests could not reach it."""

    arm: spec.Arm
    stage: str
    answered: int
    """Its requests answered (ok) before."""
    streak: int
    classes: tuple[str, ...]


class Reachability:
    """Passes the load's progress on, and notes an arm whose first requests all failed to connect
    (a wrong `--control-url`, a server that is not running): the run stops at the start of the
    warm-up instead of sending every request of every stage into a refused connection. Later, an
    arm that answered and then fails `LOST` requests in a row to connect or mid-answer
    (`disconnect`) is lost (the process gone, the server stopped): the load stops there too, and
    the run fails `ArmLost` instead of ending Reject on the error rate of a server that went away."""

    FIRST = 3
    """Requests per arm that decide (all failed to connect, none answered)."""
    LOST = 5
    """Requests in a row that could not reach an arm that answered before."""

    def __init__(self, progress: runner.Progress) -> None:
        self.progress = progress
        self.outcomes: dict[spec.Arm, list[bool]] = {}
        """Per arm: whether each of its first requests failed to connect."""
        self.unreachable: spec.Arm | None = None
        self.lost: Lost | None = None
        self.answered: dict[spec.Arm, int] = {}
        self.streak: dict[spec.Arm, list[str]] = {}
        self.stop: Callable[[], object] = lambda: None
        """Stops the load (set once it runs)."""

    def __call__(self, event: runner.ProgressEvent) -> None:
        if isinstance(event, runner.RequestDone):
            seen = self.outcomes.setdefault(event.arm, [])
            if len(seen) < self.FIRST:
                seen.append(not event.ok and event.error_class == "connect")
                if len(seen) == self.FIRST and all(seen) and self.unreachable is None:
                    self.unreachable = event.arm
                    self.stop()
            self._note(event)
        self.progress(event)

    def _note(self, event: runner.RequestDone) -> None:
        streak = self.streak.setdefault(event.arm, [])
        if event.ok:
            self.answered[event.arm] = self.answered.get(event.arm, 0) + 1
            streak.clear()
        elif event.error_class in GONE:
            streak.append(event.error_class or "")
        elif event.error_class != "cancelled":
            streak.clear()
        answered = self.answered.get(event.arm, 0)
        if answered and len(streak) >= self.LOST and self.lost is None and self.unreachable is None:
            self.lost = Lost(event.arm, event.stage, answered, len(streak), tuple(sorted(set(streak))))
            self.stop()


def lost_message(lost: Lost, url: str, *, given: bool) -> str:
    """What `ArmLost` says: the arm, where, what was seen, and that the finished stages are kept."""
    seen = " and ".join(
        {"connect": "refused connections", "disconnect": "dropped answers"}[c] for c in lost.classes
    )
    where = f"at {url} (--{lost.arm}-url)" if given else f"at {url}"
    return (
        f"the {lost.arm} arm {where} stopped answering during stage {lost.stage}: after {lost.answered} "
        f"answered requests its last {lost.streak} got {seen}; the load stopped there. The stages "
        "finished before it are kept; is the server still running?"
    )


async def _seen_gone(arms: engines.Engines, *, seconds: float) -> None:
    """Until an arm's process is seen exited, for at most `seconds`."""
    for _ in range(int(seconds / 0.05)):
        if arms.crashed() is not None:
            return
        await asyncio.sleep(0.05)


async def watched(
    plan: plan_mod.Plan,
    endpoints: dict[spec.Arm, runner.Endpoint],
    out: Path,
    arms: engines.Engines,
    stop_rule: Callable[[str, Sequence[records.RequestRecord]], bool],
    progress: runner.Progress,
    *,
    urls_given: bool,
    deadline: float | None,
) -> runner.RunResult:
    """The load, cancelled as soon as an arm's process dies or an arm cannot be reached (ArmFailure),
    or once `time.monotonic()` passes `deadline` (DeadlinePassed)."""
    reach = Reachability(progress)
    load = asyncio.create_task(runner.run(plan, endpoints, out, stop_rule=stop_rule, progress=reach))
    reach.stop = load.cancel  # at once: refused connections fail hundreds of requests a second
    # After the load too: a dead arm fails its last requests at once, so the load may end first.
    settled: float | None = None
    while settled is None or time.monotonic() < settled:
        if reach.unreachable is not None:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
            arm = reach.unreachable
            flag = f" (--{arm}-url)" if urls_given else ""
            raise ArmFailure(
                "EngineUnreachable",
                f"the {arm} arm at {endpoints[arm].url}{flag} cannot be reached: its first "
                f"{Reachability.FIRST} requests failed to connect; the load stopped there. Is the "
                "server running, and is the URL right?",
            )
        if reach.lost is not None:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
            # An arm started here that died is EngineCrashed (its exit status and log): give its
            # process a moment to be seen gone before calling it lost.
            if not urls_given:
                await _seen_gone(arms, seconds=2.0)
            if arms.crashed() is None:
                raise ArmFailure(
                    "ArmLost", lost_message(reach.lost, endpoints[reach.lost.arm].url, given=urls_given)
                )
        crashed = arms.crashed()
        if crashed is not None:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
            raise ArmFailure(
                "EngineCrashed",
                f"the {crashed.arm.value} arm exited with status {crashed.exit_code()} during the load; "
                f"its log ends with:\n{crashed.log_tail()}",
            )
        if deadline is not None and not load.done() and time.monotonic() > deadline:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
            raise DeadlinePassed
        if load.done():
            settled = settled or time.monotonic() + 0.3
            await asyncio.sleep(0.05)
        else:
            await asyncio.wait({load}, timeout=0.2)
    return load.result()
