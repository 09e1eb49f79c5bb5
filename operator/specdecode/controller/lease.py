"""Leader election over a `coordination.k8s.io/v1` Lease: two operator replicas never act on one
experiment.

Only the replica holding the Lease runs the reconcile timer's body (handlers.py); the others watch
and wait. The rules are client-go's (k8s.io/client-go/tools/leaderelection), so they hold whatever
the replicas' clocks say, since no replica compares its clock with a time another one wrote:

- A candidate takes the Lease only when it is absent, released (no holder), or its record
  (holder, renewTime, resourceVersion) has not changed for `leaseDurationSeconds` *as measured on
  the candidate's own monotonic clock since it first saw that record*.
- The holder renews every `retry_period` and counts itself leader only for `renew_deadline` after
  the start of its last successful renewal; `renew_deadline` < `duration`, so a holder that cannot
  renew (API blip, partition) stops acting before anyone else may start.
- Every write carries the `resourceVersion` it read (or is a create): of two candidates, one wins,
  the other gets 409 Conflict and stays a follower.
- On shutdown the holder releases the Lease (holder cleared, duration 1 s), so a rolling restart
  hands over at once; a replica that is killed is replaced after `duration`.

A tick that began while leading runs to its end even if leadership lapses meanwhile; that is safe
because children are created idempotently under deterministic names and all state is in `.status`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from specdecode.controller import kube

_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class LeaseApi(Protocol):
    """What the election needs of the API (controller/kube.py's `Kube`)."""

    async def get(self, kind: kube.KindRef, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any] | None: ...

    async def replace(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Config:
    """One election: the Lease's name and namespace, this replica's identity, the timings (s)."""

    name: str
    namespace: str
    identity: str
    duration: float = 15.0
    """How long a record must stay unchanged before another replica takes the Lease."""
    renew_deadline: float = 10.0
    """How long the holder counts itself leader after the start of its last renewal."""
    retry_period: float = 2.0
    """Seconds between attempts to acquire or renew."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration "
                f"(got {self.retry_period}, {self.renew_deadline}, {self.duration})"
            )


class Elector:
    """Acquires and renews the Lease; `leading()` says whether this replica may act now."""

    def __init__(
        self,
        api: LeaseApi,
        config: Config,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api
        self.config = config
        self._clock = clock
        self._wall = wall
        self._renewed_at: float | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0

    def leading(self) -> bool:
        """True while the last successful renewal began less than `renew_deadline` ago."""
        if self._renewed_at is None:
            return False
        return self._clock() - self._renewed_at < self.config.renew_deadline

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        started = self._clock()
        config = self.config
        current = await self._api.get(kube.LEASE, config.namespace, config.name)
        if current is None:
            won = await self._api.create(self._record(None), config.namespace) is not None
            return self._outcome(won, started)
        spec = dict(current.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), current["metadata"].get("resourceVersion"))
        if record != self._observed:
            self._observed, self._observed_at = record, started
        duration = float(spec.get("leaseDurationSeconds") or config.duration)
        held_by_other = holder and holder != config.identity
        if held_by_other and started - self._observed_at < duration:
            return self._outcome(False, started)
        won = await self._api.replace(self._record(current), config.namespace) is not None
        return self._outcome(won, started)

    async def release(self) -> None:
        """Give the Lease up if this replica holds it (a graceful shutdown hands over at once)."""
        if not self.leading():
            return
        self._renewed_at = None
        config = self.config
        current = await self._api.get(kube.LEASE, config.namespace, config.name)
        if current is None or (current.get("spec") or {}).get("holderIdentity") != config.identity:
            return
        released = self._record(current)
        released["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
        await self._api.replace(released, config.namespace)

    async def run(self, logger: logging.Logger | Any) -> None:
        """Acquire, then keep renewing, until cancelled; logs each change of leadership."""
        was_leading = False
        while True:
            try:
                await self.try_acquire_or_renew()
            except Exception as exc:  # an API blip: leadership lapses at the renew deadline
                logger.warning(f"leader election: {type(exc).__name__}: {exc}")
            leading = self.leading()
            if leading != was_leading:
                what = "acquired" if leading else "lost"
                logger.warning(
                    f"leader election: {what} Lease {self.config.namespace}/{self.config.name} "
                    f"as {self.config.identity}"
                )
                was_leading = leading
            await asyncio.sleep(self.config.retry_period)

    def _outcome(self, won: bool, started: float) -> bool:
        if won:
            self._renewed_at = started
        elif self._observed is not None and self._observed[0] != self.config.identity:
            # Someone else holds the Lease now: stop acting at once, not at the renew deadline.
            self._renewed_at = None
        return won

    def _record(self, current: Mapping[str, Any] | None) -> dict[str, Any]:
        """The Lease as this replica writes it: held by it, renewed now."""
        config = self.config
        now = self._wall().strftime(_MICRO_TIME)
        old = dict((current or {}).get("spec") or {})
        ours = old.get("holderIdentity") == config.identity
        metadata: dict[str, Any] = {"name": config.name, "namespace": config.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"].get("resourceVersion")
        transitions = int(old.get("leaseTransitions") or 0)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": config.identity,
                "leaseDurationSeconds": max(1, round(config.duration)),
                "acquireTime": old.get("acquireTime") if ours else now,
                "renewTime": now,
                "leaseTransitions": transitions if ours or current is None else transitions + 1,
            },
        }
