"""`run --local`'s shell around the operator's lifecycle: observe -> `reconcile.decide` -> carry out.

The phases, their deadlines, failure reasons, conditions and events come from the same pure core as
the operator's (`experiment/reconcile.py`); this loop only feeds it what the local world looks like
and carries out what it asks for, as the kopf handler does with Kubernetes (`controller/handlers.py`).
What differs is the world (`World`): arms are local processes (or servers given by URL), the load
runs in this process, the analysis is judged here. Their actions block until done (starting an arm
waits for its `/health`, the load runs to its end), so each tick finds the world settled and
`decide()` moves on at once; a world whose action has not finished yet is asked again a tick later.

A local failure (an arm that crashed, cannot be reached or answers only errors, an engine that does
not start) is a permanent `reconcile.Fault` as the operator's tick faults are: the core ends the
experiment with its reason and message (or, in a round, the round), as `decide_after_fault` says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

from specdecode.experiment import reconcile
from specdecode.experiment.status import ExperimentStatus

BY_HAND = "stop the arms' processes by hand (the run ends here)"
"""What the message says of a cleanup that failed: `run --local` does not tick again."""

TICK_S = 0.05
"""Pause before the next tick when a tick changed nothing (an action still under way)."""


class Failure(Exception):
    """The local world failed in a way that ends the experiment (or the round): `reason` for status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class World(Protocol):
    """What `drive` observes and acts on."""

    def observe(self, current: ExperimentStatus) -> reconcile.Observed:
        """The world now (raises `Failure` when observing it fails, e.g. the analysis' Prometheus)."""
        ...

    def carry_out(self, action: reconcile.Action, decided: ExperimentStatus) -> None:
        """Do `action` of the decision whose status is `decided` (raises `Failure`)."""
        ...

    def decided(self, decision: reconcile.Decision) -> None:
        """Each decision, before its actions: its events to show, its status to keep (an interruption
        ends the run from the last one)."""
        ...


def drive(
    subject: reconcile.Subject,
    world: World,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    current: ExperimentStatus | None = None,
) -> ExperimentStatus:
    """Ticks until the experiment is Completed or Failed; the final status (conditions included)."""
    current = current or ExperimentStatus()
    fault: reconcile.Fault | None = None
    while True:
        now = clock()
        decision = _decide(subject, world, current, fault, now)
        fault = None
        world.decided(decision)
        try:
            for action in decision.actions:
                world.carry_out(action, decision.status)
        except Failure as exc:
            fault = replace(_fault(exc), action=action)
            if decision.status.phase.is_terminal:  # its cleanup failed: the message says so
                ended = reconcile.decide_after_fault(
                    subject, current, fault, now, attempted=decision, by_hand=BY_HAND
                )
                world.decided(ended)
                return ended.status
        if decision.status.phase.is_terminal and fault is None:
            return decision.status
        if decision.status == current and fault is None:
            time.sleep(TICK_S)
        current = decision.status


def _decide(
    subject: reconcile.Subject,
    world: World,
    current: ExperimentStatus,
    fault: reconcile.Fault | None,
    now: datetime,
) -> reconcile.Decision:
    """One tick's decision: after a failure (of the last actions, or of observing now) as the
    operator decides after a fault, else from what was observed."""
    try:
        observed = world.observe(current)
    except Failure as exc:
        return reconcile.decide_after_fault(subject, current, fault or _fault(exc), now)
    if fault is not None:
        return reconcile.decide_after_fault(subject, current, fault, now, observed=observed)
    return reconcile.decide(subject, current, observed, now)


def _fault(exc: Failure) -> reconcile.Fault:
    """A local failure never fixes itself by retrying: permanent (the experiment, or the round, ends)."""
    return reconcile.Fault(exc.reason, str(exc), permanent=True)
