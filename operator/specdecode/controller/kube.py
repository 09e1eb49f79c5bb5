"""The only module that talks to the Kubernetes API (besides kopf itself).

A handful of generic calls over the official client's `ApiClient.call_api`, run in threads so the
kopf event loop never blocks. Objects are plain dicts (as the manifest builders return them).

The calls run in a pool of their own (`API_THREADS`), not in the event loop's default pool: that
one has min(32, cores + 4) threads (6 on 2 cores), and with 50 experiments ticking, their calls
queued there behind each other and behind the Prometheus queries (benchmarks/README.md, "Many
experiments"). The client's connection pool is as large, so no connection is opened per call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from specdecode.experiment import keys

# (apiVersion, kind) -> collection path in a namespace.
_COLLECTIONS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{namespace}/deployments",
    ("v1", "Service"): "/api/v1/namespaces/{namespace}/services",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{namespace}/configmaps",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{namespace}/serviceaccounts",
    ("v1", "Secret"): "/api/v1/namespaces/{namespace}/secrets",
    ("v1", "Pod"): "/api/v1/namespaces/{namespace}/pods",
    ("v1", "Node"): "/api/v1/nodes",  # cluster-scoped: the namespace is ignored
    ("batch/v1", "Job"): "/apis/batch/v1/namespaces/{namespace}/jobs",
    (
        "networking.k8s.io/v1",
        "NetworkPolicy",
    ): "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
    (
        "rbac.authorization.k8s.io/v1",
        "Role",
    ): "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
    ),
    ("policy/v1", "PodDisruptionBudget"): "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
    ("coordination.k8s.io/v1", "Lease"): "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
    (keys.GROUP_VERSION, keys.KIND): f"/apis/{keys.GROUP_VERSION}/namespaces/{{namespace}}/{keys.PLURAL}",
}

KindRef = tuple[str, str]
_T = TypeVar("_T")
#: the most of a pod's log read: its start, where vLLM reports how it configured itself
LOG_LIMIT_BYTES = 4 * 1024 * 1024
# The API server's metadata-only list (falls back to a full list where it cannot).
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
DEPLOYMENT: KindRef = ("apps/v1", "Deployment")
POD: KindRef = ("v1", "Pod")
JOB: KindRef = ("batch/v1", "Job")
CONFIG_MAP: KindRef = ("v1", "ConfigMap")
SERVICE: KindRef = ("v1", "Service")
NODE: KindRef = ("v1", "Node")
SECRET: KindRef = ("v1", "Secret")
LEASE: KindRef = ("coordination.k8s.io/v1", "Lease")
DISRUPTION_BUDGET: KindRef = ("policy/v1", "PodDisruptionBudget")
EXPERIMENT: KindRef = (keys.GROUP_VERSION, keys.KIND)


# Threads (and pooled connections) for API calls in flight at once.
API_THREADS = 32


class Kube:
    """A Kubernetes API client for the operator's children."""

    def __init__(self, api: kubernetes.client.ApiClient, *, threads: int = API_THREADS) -> None:
        self._api = api
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="specdecode-api")

    @classmethod
    def from_environment(cls) -> Kube:
        """In-cluster credentials, else the kubeconfig (`KUBECONFIG` or ~/.kube/config)."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        configuration.connection_pool_maxsize = API_THREADS
        return cls(kubernetes.client.ApiClient(configuration))

    def close(self) -> None:
        """Release the connection pool and the threads."""
        self._pool.shutdown(wait=False)
        self._api.close()  # type: ignore[no-untyped-call]

    async def _in_pool(self, call: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    async def create_if_absent(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Create `obj`; when it exists already, return the existing object unchanged (idempotence)."""
        created = await self._create(obj, namespace)
        if created is not None:
            return created
        existing = await self.get(_kind(obj), namespace, str(obj["metadata"]["name"]))
        return existing or dict(obj)

    async def put(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Create `obj`, or replace it when it exists (results uploads)."""
        created = await self._create(obj, namespace)
        if created is not None:
            return created
        name = str(obj["metadata"]["name"])
        return await self._call("PUT", f"{_path(_kind(obj), namespace)}/{name}", body=dict(obj))

    async def create(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        """Create `obj`; None when an object of that name exists already (someone else won)."""
        return await self._create(obj, namespace)

    async def replace(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        """Replace `obj` if its `metadata.resourceVersion` is still current; None when it is not (409)
        or the object is gone (404): someone else wrote it first."""
        name = str(obj["metadata"]["name"])
        try:
            return await self._call("PUT", f"{_path(_kind(obj), namespace)}/{name}", body=dict(obj))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
        return None

    async def _create(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        """POST `obj`; None when an object of that name exists already."""
        try:
            return await self._call("POST", _path(_kind(obj), namespace), body=dict(obj))
        except ApiException as exc:
            if exc.status != 409:
                raise
        return None

    async def get(self, kind: KindRef, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None when absent."""
        try:
            return await self._call("GET", f"{_path(kind, namespace)}/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def node(self, name: str) -> dict[str, Any] | None:
        """A Node, or None when absent or when the operator may not read Nodes (its RBAC is optional)."""
        try:
            return await self.get(NODE, "", name)
        except ApiException as exc:
            if exc.status == 403:
                return None
            raise

    async def secret_keys(self, namespace: str, name: str) -> frozenset[str] | None:
        """The names of a Secret's keys (`data` and `stringData`), or None when it does not exist.
        Its values never leave this method. Raises the API error otherwise (403: the operator may not
        read Secrets, `kube.refusal` says so)."""
        found = await self.get(SECRET, namespace, name)
        if found is None:
            return None
        return frozenset([*(found.get("data") or {}), *(found.get("stringData") or {})])

    async def pod_log(self, namespace: str, name: str) -> str | None:
        """The start of a pod's log (at most `LOG_LIMIT_BYTES`), or None when the API server cannot
        give it: no kubelet behind the node, the pod gone, or no `pods/log` permission."""

        def call() -> str:
            method_, url, headers, payload, post = self._api.param_serialize(
                "GET",
                f"{_path(POD, namespace)}/{name}/log",
                query_params=[("limitBytes", str(LOG_LIMIT_BYTES))],
                header_params={"Accept": "text/plain"},
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(method_, url, headers, payload, post, _request_timeout=10)
            data = response.read()  # type: ignore[no-untyped-call]
            if not 200 <= response.status < 300:
                raise ApiException(status=response.status, reason=response.reason, body=data)
            return bytes(data).decode(errors="replace")

        try:
            return await self._in_pool(call)
        except (ApiException, urllib3.exceptions.HTTPError):
            # Best effort: the API server answers 4xx/5xx, or hangs dialling a kubelet that is not there.
            return None

    async def select(self, kind: KindRef, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Objects of a kind carrying all `labels`."""
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        result = await self._call("GET", _path(kind, namespace), query=[("labelSelector", selector)])
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    async def select_metadata(
        self, kind: KindRef, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Like `select`, but only each object's `metadata` (a PartialObjectMetadataList: no data
        travels, however large the objects)."""
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        result = await self._call(
            "GET", _path(kind, namespace), query=[("labelSelector", selector)], accept=_METADATA_LIST
        )
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    async def delete(self, kind: KindRef, namespace: str, name: str) -> None:
        """Delete in the background (dependents by the garbage collector); absent is fine."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            await self._call("DELETE", f"{_path(kind, namespace)}/{name}", body=body)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def patch_status(self, kind: KindRef, namespace: str, name: str, fields: Mapping[str, Any]) -> None:
        """Merge-patch these fields of an object's status subresource (a None removes the field)."""
        await self._call(
            "PATCH",
            f"{_path(kind, namespace)}/{name}/status",
            body={"status": dict(fields)},
            content_type="application/merge-patch+json",
        )

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        accept: str = "application/json",
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            method_, url, headers, payload, post = self._api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params={"Accept": accept, "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(method_, url, headers, payload, post, _request_timeout=30)
            data = response.read()  # type: ignore[no-untyped-call]
            if not 200 <= response.status < 300:
                raise ApiException(status=response.status, reason=response.reason, body=data)
            decoded = json.loads(data) if data else {}
            return decoded if isinstance(decoded, dict) else {}

        return await self._in_pool(call)


def refusal(exc: BaseException) -> tuple[int, str] | None:
    """(HTTP status, the API server's message) of an API error, or None for another exception."""
    if not isinstance(exc, ApiException):
        return None
    message = str(exc.reason or "")
    try:
        status = json.loads(exc.body or "{}")
        message = str(status.get("message") or message) if isinstance(status, dict) else message
    except (TypeError, ValueError):
        pass
    return int(exc.status or 0), message


def _kind(obj: Mapping[str, Any]) -> KindRef:
    return (str(obj["apiVersion"]), str(obj["kind"]))


def _path(kind: KindRef, namespace: str) -> str:
    try:
        return _COLLECTIONS[kind].format(namespace=namespace)
    except KeyError:
        raise ValueError(f"no API path known for {kind}") from None
