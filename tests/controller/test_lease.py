"""Leader election (controller/lease.py) against an in-memory Lease with optimistic concurrency."""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from specdecode.controller import handlers, kube, lease
from specdecode.controller.settings import OperatorSettings


def synchronous(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """Run an async test body in its own event loop (as test_handlers.py does with asyncio.run)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())  # type: ignore[arg-type]

    return run


class Leases:
    """One namespace's Leases; writes need the resourceVersion they read (409 otherwise)."""

    def __init__(self) -> None:
        self.store: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ApiException(status=503, reason="Service Unavailable")

    async def get(self, kind: kube.KindRef, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        found = self.store.get(name)
        return copy.deepcopy(found) if found is not None else None

    async def create(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        self._check()
        name = obj["metadata"]["name"]
        if name in self.store:
            return None
        return self._write(obj)

    async def replace(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        self._check()
        stored = self.store.get(obj["metadata"]["name"])
        if stored is None or stored["metadata"]["resourceVersion"] != obj["metadata"].get("resourceVersion"):
            return None
        return self._write(obj)

    def _write(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        written = copy.deepcopy(dict(obj))
        written["metadata"]["resourceVersion"] = str(self.version)
        self.store[written["metadata"]["name"]] = written
        return copy.deepcopy(written)

    def holder(self) -> str | None:
        held: str | None = self.store["leader"]["spec"]["holderIdentity"]
        return held


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(api: Leases, clock: Clock, identity: str) -> lease.Elector:
    config = lease.Config(name="leader", namespace="ops", identity=identity)
    return lease.Elector(api, config, clock=clock, wall=lambda: datetime(2026, 12, 1, tzinfo=UTC))


@synchronous
async def test_the_first_replica_takes_the_lease_and_the_second_stands_by() -> None:
    api, clock = Leases(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert (a.leading(), b.leading()) == (True, False)
    assert api.holder() == "a"
    record = api.store["leader"]["spec"]
    assert record["leaseDurationSeconds"] == 15
    assert record["renewTime"] == "2026-12-01T00:00:00.000000Z"


@synchronous
async def test_a_renewing_leader_is_never_replaced() -> None:
    api, clock = Leases(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a.try_acquire_or_renew()
    for _ in range(30):  # a minute of renewals every 2 s
        clock.now += 2
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        assert a.leading() and not b.leading()


@synchronous
async def test_a_dead_leader_is_replaced_only_after_the_lease_duration_on_the_standby_s_clock() -> None:
    api, clock = Leases(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b first sees a's record now
    clock.now += 14.9
    assert not await b.try_acquire_or_renew()
    assert not a.leading()  # a (had it survived, cut off) stopped acting at its renew deadline (10 s)
    clock.now += 0.2
    assert await b.try_acquire_or_renew()
    assert b.leading() and api.holder() == "b"
    assert api.store["leader"]["spec"]["leaseTransitions"] == 1


@synchronous
async def test_a_leader_that_cannot_renew_stops_acting_before_anyone_may_take_over() -> None:
    api, clock = Leases(), Clock()
    a = elector(api, clock, "a")
    await a.try_acquire_or_renew()
    api.down = True
    clock.now += 9.9
    with pytest.raises(ApiException):
        await a.try_acquire_or_renew()
    assert a.leading()
    clock.now += 0.2  # 10.1 s after the last renewal began: past the renew deadline (10 s)
    assert not a.leading()


@synchronous
async def test_of_two_candidates_writing_at_once_only_one_wins() -> None:
    api, clock = Leases(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a.try_acquire_or_renew()
    await a.release()  # released: no holder, free at once
    seen = await api.get(kube.LEASE, "ops", "leader")
    assert seen is not None and seen["spec"]["holderIdentity"] is None
    # b and c both read the released Lease; c writes first, so b's write (its resourceVersion stale) loses.
    c = elector(api, clock, "c")
    original_get = api.get

    async def get_then_let_c_win(kind: kube.KindRef, namespace: str, name: str) -> dict[str, Any] | None:
        found = await original_get(kind, namespace, name)
        api.get = original_get  # type: ignore[method-assign]
        assert await c.try_acquire_or_renew()
        return found

    api.get = get_then_let_c_win  # type: ignore[method-assign]
    assert not await b.try_acquire_or_renew()
    assert (b.leading(), c.leading(), api.holder()) == (False, True, "c")


@synchronous
async def test_a_released_lease_is_taken_at_once() -> None:
    api, clock = Leases(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert not a.leading()
    assert await b.try_acquire_or_renew()


@synchronous
async def test_a_leader_whose_lease_was_taken_stops_at_once() -> None:
    api, clock = Leases(), Clock()
    a = elector(api, clock, "a")
    await a.try_acquire_or_renew()
    # Someone else (e.g. an admin's edit) writes the Lease: a's renewal conflicts, then it reads b.
    stored = api.store["leader"]
    stored["spec"]["holderIdentity"] = "b"
    api.version += 1
    stored["metadata"]["resourceVersion"] = str(api.version)
    clock.now += 2
    assert not await a.try_acquire_or_renew()
    assert not a.leading()


def test_the_timings_must_leave_a_gap_between_the_renew_deadline_and_the_duration() -> None:
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        lease.Config(name="l", namespace="n", identity="i", duration=10, renew_deadline=10)


def test_leader_election_settings_come_from_the_environment() -> None:
    settings = OperatorSettings.from_env(
        {
            "SPECDECODE_LEADER_ELECTION": "true",
            "SPECDECODE_LEADER_ELECTION_NAME": "sdx-leader",
            "SPECDECODE_LEADER_ELECTION_NAMESPACE": "ops",
            "SPECDECODE_LEADER_ELECTION_IDENTITY": "sdx-0",
            "SPECDECODE_LEASE_DURATION": "6",
            "SPECDECODE_RENEW_DEADLINE": "4",
            "SPECDECODE_RETRY_PERIOD": "1",
        }
    )
    assert settings.election == lease.Config(
        name="sdx-leader", namespace="ops", identity="sdx-0", duration=6, renew_deadline=4, retry_period=1
    )
    assert OperatorSettings.from_env({}).election is None


@synchronous
async def test_only_the_replica_that_leads_runs_the_reconcile_timer() -> None:
    api, clock = Leases(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    assert handlers._leading(kopf.Memo(elector=a))
    assert not handlers._leading(kopf.Memo(elector=b))
    assert handlers._leading(kopf.Memo())  # no leader election: the one operator acts
    clock.now += 11  # a could not renew for longer than its renew deadline
    assert not handlers._leading(kopf.Memo(elector=a))
