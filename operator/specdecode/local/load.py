"""`run --local`'s load, watched: the load generator in this process, stopped as soon as an arm's
process dies, an arm cannot be reached, or the load runs past `spec.deadlines.run`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
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


class Reachability:
    """Passes the load's progress on, and notes an arm whose first requests all failed to connect
    (a wrong `--control-url`, a server that is not running): the run stops at the start of the
    warm-up instead of sending every request of every stage into a refused connection."""

    FIRST = 3
    """Requests per arm that decide (all failed to connect, none answered)."""

    def __init__(self, progress: runner.Progress) -> None:
        self.progress = progress
        self.outcomes: dict[spec.Arm, list[bool]] = {}
        """Per arm: whether each of its first requests failed to connect."""
        self.unreachable: spec.Arm | None = None
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
        self.progress(event)


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
