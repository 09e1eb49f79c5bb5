"""The ConfigMaps store (the default): a bundle split over ConfigMaps `<exp>-results-<i>`.

See the package's docstring (`specdecode.results`) for what the operator trusts and reads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from specdecode.experiment import keys, manifests
from specdecode.results.format import (
    DATA_KEY,
    DATA_KEYS,
    GZIP_MAGIC,
    LEGACY_DATA_KEY,
    Bundle,
    digest,
    encode_dir,
    split,
)
from specdecode.results.limits import (
    PART_BYTES,
    Limits,
    ResultsCorrupt,
    ResultsMissing,
    ResultsTooLarge,
    ResultsUntrusted,
    mib,
)

DEFAULT_LIMITS = Limits()

CONFIG_MAP = ("v1", "ConfigMap")
"""The kind the parts are stored as, as `ConfigMaps.get` names a kind (apiVersion, kind)."""


class ConfigMaps(Protocol):
    """The two Kubernetes calls the results make (`controller.kube.Kube` has them; so do tests' fakes)."""

    async def get(self, kind: tuple[str, str], namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        ...

    async def put(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Create the object, or replace it."""
        ...


def pod_prefix(prefix: str, pod: tuple[int, int] | None) -> str:
    """The ConfigMaps' name prefix of load pod (k, N)'s bundle: `prefix` itself for a one-pod Job."""
    return prefix if pod is None or pod[1] == 1 else f"{prefix}-pod{pod[0]}"


def build_config_maps(
    prefix: str,
    experiment: str,
    parts: Sequence[bytes],
    *,
    owners: Sequence[Mapping[str, Any]] = (),
    generation: int | None = None,
    pod: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """One ConfigMap per part, labelled for lookup, owned by `owners` (the experiment, the load Job);
    `pod` (k, N): the bundle of load pod k of N (`pod_prefix`)."""
    maps = []
    bundle = digest(parts)
    prefix = pod_prefix(prefix, pod)
    key = LEGACY_DATA_KEY if parts and parts[0].startswith(GZIP_MAGIC) else DATA_KEY
    for i, part in enumerate(parts):
        metadata: dict[str, Any] = {
            "name": f"{prefix}-{i}",
            "labels": {
                **manifests.labels(experiment, component="results"),
                keys.LABEL_RESULTS: experiment,
            },
            "annotations": {keys.PART_ANNOTATION: f"{i}/{len(parts)}", keys.DIGEST_ANNOTATION: bundle},
        }
        if generation is not None:
            metadata["annotations"][keys.GENERATION_ANNOTATION] = str(generation)
        if pod is not None and pod[1] > 1:
            metadata["annotations"][keys.LOAD_POD_ANNOTATION] = f"{pod[0]}/{pod[1]}"
        if owners:
            metadata["ownerReferences"] = [dict(owner) for owner in owners]
        maps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": metadata,
                "binaryData": {key: base64.b64encode(part).decode()},
            }
        )
    return maps


async def upload(
    kube: ConfigMaps,
    directory: Path,
    *,
    namespace: str,
    prefix: str,
    experiment: str,
    owners: Sequence[Mapping[str, Any]] = (),
    generation: int | None = None,
    pod: tuple[int, int] | None = None,
) -> int:
    """Store the result files of `directory` (load pod `pod`'s: `pod_prefix`); returns the number of
    ConfigMaps written."""
    maps = build_config_maps(
        prefix, experiment, split(encode_dir(directory)), owners=owners, generation=generation, pod=pod
    )
    for cm in maps:
        await kube.put(cm, namespace)
    return len(maps)


async def download(
    kube: ConfigMaps,
    *,
    namespace: str,
    experiment: str,
    generation: int,
    job_uid: str,
    limits: Limits = DEFAULT_LIMITS,
    round_name: str | None = None,
    pod: tuple[int, int] | None = None,
) -> Bundle:
    """The result bundle that load Job `job_uid` stored for `generation` of an experiment (of the
    round `round_name`: `rounds.py`; None: the stages); `pod` (k, N): that of its load pod k of N;
    `parse` reads it. (`stores.download` refuses a Job that is gone, whatever the store.)"""
    names = manifests.Names(experiment)
    prefix, job_name = names.results_prefix_of(round_name), names.load_job_of(round_name)
    prefix = pod_prefix(prefix, pod)
    first = await kube.get(CONFIG_MAP, namespace, f"{prefix}-0")
    if first is None:
        if pod is not None and pod[1] > 1:
            raise ResultsMissing(f"load pod {pod[0]} of {pod[1]} stored no results ({prefix}-0)")
        raise ResultsMissing("the load Job stored no results")
    total = _total(first, prefix)
    if total > limits.max_parts:
        raise ResultsTooLarge(
            f"{prefix}-0 announces {total} parts, more than the {limits.max_parts} "
            f"the operator reads ({mib(limits.max_bytes)}, SPECDECODE_RESULTS_MAX_BYTES)"
        )
    bundle = _annotation(first, keys.DIGEST_ANNOTATION)
    hashed = hashlib.sha256()
    joined = bytearray()
    for i in range(total):
        cm = first if i == 0 else await kube.get(CONFIG_MAP, namespace, f"{prefix}-{i}")
        if cm is None:
            raise ResultsMissing(f"result part {i} of {total} ({prefix}-{i}) is missing")
        part = _trusted_part(cm, i, total, bundle, generation=generation, job=(job_name, job_uid), pod=pod)
        hashed.update(part)
        joined += part
    if f"sha256:{hashed.hexdigest()}" != bundle:
        raise ResultsCorrupt(
            "the result parts do not hash to their digest: parts of different uploads (a load Job "
            "killed while it stored them?) or rewritten by someone else"
        )
    return Bundle(bytes(joined), limits.max_bytes)


def _trusted_part(
    cm: Mapping[str, Any],
    index: int,
    total: int,
    bundle: str | None,
    *,
    generation: int,
    job: tuple[str, str],
    pod: tuple[int, int] | None = None,
) -> bytes:
    """The part's bytes, once the ConfigMap shows it was written by load Job `job` for `generation`."""
    metadata = cm.get("metadata") or {}
    name = str(metadata.get("name"))
    job_name, job_uid = job
    owned = any(
        isinstance(o, Mapping)
        and o.get("kind") == "Job"
        and o.get("name") == job_name
        and o.get("uid") == job_uid
        for o in metadata.get("ownerReferences") or []
    )
    if not owned:
        raise ResultsUntrusted(f"ConfigMap {name} is not owned by the load Job {job_name} (uid {job_uid})")
    written_for = _annotation(cm, keys.GENERATION_ANNOTATION)
    if written_for != str(generation):
        raise ResultsUntrusted(
            f"ConfigMap {name} holds results of generation {written_for}, not {generation}"
        )
    if pod is not None and pod[1] > 1 and _annotation(cm, keys.LOAD_POD_ANNOTATION) != f"{pod[0]}/{pod[1]}":
        raise ResultsUntrusted(
            f"ConfigMap {name} is not annotated as the results of load pod {pod[0]}/{pod[1]}"
        )
    if (
        _annotation(cm, keys.PART_ANNOTATION) != f"{index}/{total}"
        or _annotation(cm, keys.DIGEST_ANNOTATION) != bundle
    ):
        raise ResultsCorrupt(f"ConfigMap {name} is not part {index}/{total} of the same upload as part 0")
    data = part_data(cm)
    if data is None:
        raise ResultsCorrupt(f"ConfigMap {name} holds no binaryData.{DATA_KEY} (nor {LEGACY_DATA_KEY})")
    if len(data) > 4 * (PART_BYTES // 3 + 1):
        raise ResultsTooLarge(f"ConfigMap {name} is larger than a part ({PART_BYTES // 1024} KiB)")
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ResultsCorrupt(f"ConfigMap {name}: its binaryData is not base64: {exc}") from None


def part_data(cm: Mapping[str, Any]) -> str | None:
    """A part's base64 data, under the key of either version (None: neither)."""
    data = cm.get("binaryData") or {}
    found = next((data[key] for key in DATA_KEYS if key in data), None)
    return found if isinstance(found, str) else None


def _total(cm: Mapping[str, Any], prefix: str) -> int:
    place = _annotation(cm, keys.PART_ANNOTATION) or ""
    index, _, total = place.partition("/")
    if index != "0" or not total.isdigit() or int(total) < 1:
        raise ResultsCorrupt(f"{prefix}-0: annotation {keys.PART_ANNOTATION}={place!r} is not 0/<parts>")
    return int(total)


def _annotation(cm: Mapping[str, Any], key: str) -> str | None:
    value = ((cm.get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None
