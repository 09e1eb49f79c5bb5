"""An in-memory `controller.kube.Kube` for driving the handlers tick by tick, and a helper to do so.

It stores plain dicts by (kind, name) in one namespace, gives each created object a uid, can be
told to refuse a request (`refuse`), and counts what was read (`reads`). The API server's own
behaviour (garbage collection, controllers) is not simulated: tests set status fields themselves.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from specdecode.controller import handlers, kube, ticks
from specdecode.controller.metrics import OperatorMetrics
from specdecode.controller.settings import OperatorSettings

Key = tuple[kube.KindRef, str]
Refusal = Callable[[str, kube.KindRef, Mapping[str, Any] | None], ApiException | None]


class FakeKube:
    """The operator's Kubernetes client, in memory."""

    def __init__(self) -> None:
        self.store: dict[Key, dict[str, Any]] = {}
        self.refuse: Refusal = lambda method, kind, obj: None
        self.reads: list[tuple[str, kube.KindRef, str]] = []
        """(method, kind, name or selector) of every read: GET of one object or a LIST."""
        self.logs: dict[str, str] = {}
        """Pod name -> its log; a pod without one has no kubelet behind it (as under KWOK)."""
        self._uids = itertools.count(1)
        self.replaced: list[str] = []
        """Names of the objects replaced (PUT of an existing object, `Kube.replace`), in order."""
        self.status_patches: list[dict[str, Any]] = []
        """The status merge patches written during a tick (`Kube.patch_status`), in order."""
        self.on_status_patch: Callable[[Mapping[str, Any]], None] = lambda fields: None
        """Applies such a patch where the object lives (`Operator` keeps the experiment's body)."""

    # -- the Kube interface ------------------------------------------------------------------

    async def create_if_absent(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        created = self._create(obj)
        return created if created is not None else copy.deepcopy(self.store[_key(obj)])

    async def put(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        created = self._create(obj)
        if created is not None:
            return created
        self._check("PUT", _kind(obj), obj)
        kept = self.store[_key(obj)]["metadata"]
        stored = copy.deepcopy(dict(obj))
        stored["metadata"] = {**stored["metadata"], "uid": kept["uid"]}
        self.store[_key(obj)] = stored
        return copy.deepcopy(stored)

    async def replace(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        self._check("PUT", _kind(obj), obj)
        self.replaced.append(str(obj["metadata"]["name"]))
        if _key(obj) not in self.store:
            return None
        self.store[_key(obj)] = copy.deepcopy(dict(obj))
        return copy.deepcopy(self.store[_key(obj)])

    async def get(self, kind: kube.KindRef, namespace: str, name: str) -> dict[str, Any] | None:
        self._check("GET", kind, None)
        self.reads.append(("GET", kind, name))
        found = self.store.get((kind, name))
        return copy.deepcopy(found) if found is not None else None

    async def select(
        self, kind: kube.KindRef, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        self._check("LIST", kind, None)
        self.reads.append(("LIST", kind, json.dumps(dict(labels), sort_keys=True)))
        return [copy.deepcopy(o) for (k, _), o in sorted(self.store.items()) if k == kind and _has(o, labels)]

    async def select_metadata(
        self, kind: kube.KindRef, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        self._check("LIST", kind, None)
        self.reads.append(("LIST-metadata", kind, json.dumps(dict(labels), sort_keys=True)))
        return [
            {"metadata": copy.deepcopy(o["metadata"])}
            for (k, _), o in sorted(self.store.items())
            if k == kind and _has(o, labels)
        ]

    async def node(self, name: str) -> dict[str, Any] | None:
        return await self.get(kube.NODE, "", name)

    async def secret_keys(self, namespace: str, name: str) -> frozenset[str] | None:
        return await kube.Kube.secret_keys(self, namespace, name)  # type: ignore[arg-type]  # its GET is ours

    async def pod_log(self, namespace: str, name: str) -> str | None:
        self.reads.append(("LOG", kube.POD, name))
        return self.logs.get(name)

    async def patch_status(
        self, kind: kube.KindRef, namespace: str, name: str, fields: Mapping[str, Any]
    ) -> None:
        self._check("PATCH", kind, None)
        self.status_patches.append(copy.deepcopy(dict(fields)))
        self.on_status_patch(fields)

    async def delete(self, kind: kube.KindRef, namespace: str, name: str) -> None:
        self._check("DELETE", kind, None)
        self.store.pop((kind, name), None)

    # -- helpers -----------------------------------------------------------------------------

    def add(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store an object as another writer would (no refusal applies)."""
        stored = copy.deepcopy(dict(obj))
        stored["metadata"].setdefault("uid", f"uid-{next(self._uids)}")
        self.store[_key(stored)] = stored
        return stored

    def named(self, kind: kube.KindRef, name: str) -> dict[str, Any]:
        return self.store[(kind, name)]

    def names(self, kind: kube.KindRef) -> list[str]:
        return sorted(name for (k, name) in self.store if k == kind)

    def _create(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        self._check("POST", _kind(obj), obj)
        if _key(obj) in self.store:
            return None
        return copy.deepcopy(self.add(obj))

    def _check(self, method: str, kind: kube.KindRef, obj: Mapping[str, Any] | None) -> None:
        refusal = self.refuse(method, kind, obj)
        if refusal is not None:
            raise refusal


def refusal(status: int, message: str) -> ApiException:
    """An API error as the official client raises it (the body is the API server's Status)."""
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return ApiException(status=status, reason="Unprocessable Entity" if status == 422 else "Error", body=body)


def _kind(obj: Mapping[str, Any]) -> kube.KindRef:
    return (str(obj["apiVersion"]), str(obj["kind"]))


def _key(obj: Mapping[str, Any]) -> Key:
    return (_kind(obj), str(obj["metadata"]["name"]))


def _has(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    present = (obj.get("metadata") or {}).get("labels") or {}
    return all(present.get(k) == v for k, v in labels.items())


class Operator:
    """Ticks of the reconcile timer against a `FakeKube`, with the experiment's status kept between
    ticks as the API server would after each status patch."""

    def __init__(
        self, client: FakeKube, document: Mapping[str, Any], *, settings: OperatorSettings | None = None
    ):
        self.kube = client
        self.body: dict[str, Any] = copy.deepcopy(dict(document))
        self.body["metadata"].setdefault("uid", "experiment-uid")
        self.body["metadata"].setdefault("generation", 1)
        self.body.setdefault("status", {})
        settings = settings or OperatorSettings()
        self.memo = kopf.Memo(
            settings=settings, kube=client, metrics=OperatorMetrics(), ticks=ticks.Ticks(settings.interval)
        )
        client.on_status_patch = self._apply
        self.logged: list[str] = []
        """What the handler logged at info (kopf posts only warnings as Events)."""

    def edit(self, spec: Mapping[str, Any]) -> None:
        """`kubectl edit`: a new spec and the next generation."""
        self.body["spec"] = copy.deepcopy(dict(spec))
        self.body["metadata"]["generation"] += 1

    async def tick(self, now: datetime | None = None) -> dict[str, Any]:
        """One timer run; returns the status after its patch (Events go to `kopf.event`: see the
        `operator_events` fixture)."""
        patch = kopf.Patch()
        await handlers._reconcile(kopf.Body(self.body), patch, self.memo, _Logger(self.logged), now=now)  # type: ignore[arg-type]
        self._apply(patch.get("status") or {})
        return dict(self.body["status"])

    def _apply(self, fields: Mapping[str, Any]) -> None:
        """A status merge patch, as the API server applies it."""
        for key, value in fields.items():
            if value is None:
                self.body["status"].pop(key, None)
            else:
                self.body["status"][key] = copy.deepcopy(value)


class _Logger:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def info(self, message: str) -> None:
        self.lines.append(message)

    def warning(self, message: str) -> None:
        pass
