"""Carrying the load Job's result files to the operator through ConfigMaps, and trusting only those.

The Job writes `requests.jsonl`, `windows.json` and `loadgen-summary.json`; they are packed into one
gzip'd JSON bundle and split over ConfigMaps `<exp>-results-<i>` (binaryData, under the 1 MiB object
limit). Every part carries its place (`specdecode.io/part: i/N`), the generation measured
(`specdecode.io/generation`) and the sha256 of the whole bundle (`specdecode.io/bundle-digest`, the
same on every part of one upload), and is owned by the experiment (deleting it removes them) and by
the load Job that wrote it (the Job's uid comes to its pod through the downward API). A load Job
of N > 1 pods (`spec.workload.loadPods`) stores one bundle per pod, `<exp>-results-pod<k>-<i>`
(`pod_prefix`), each part also annotated with its pod (`specdecode.io/load-pod: k/N`); the operator
reads every pod's bundle this way and merges them (`experiment/loadpods.py`).

The load Job uploads (`upload`, from cli.py), the operator downloads and parses (`download`,
`parse`), `kubectl specdecode watch` unpacks what it lists: so this module reaches Kubernetes only
through `ConfigMaps`, the two calls of `controller.kube.Kube` it needs, and imports only the core.

The operator trusts labels for nothing. It reads exactly `<exp>-results-0` .. `-N-1`, one GET each,
so a ConfigMap of any other name is never read, and uses a part only when it is owned by this
generation's load Job (the uid the operator observed), annotated with this generation and its
place, and when the joined parts hash to their digest. What it reads is bounded: at most
`Limits.max_parts` parts of at most `PART_BYTES` each, one part in memory at a time, and a bundle
that inflates to more than `Limits.max_bytes` is refused while it is decompressed (a gzip bomb
costs no more than that).

Not stopped: someone who may update ConfigMaps in the namespace and read the Job's uid (the
built-in `edit` role, which may also exec into the load pod) can rewrite a part and its digest.
The verdict is as trustworthy as the namespace's editors (README, "Security").

Errors, each with the status reason it ends in (`reason`)::

    ResultsError
    ├── ResultsMissing     the load Job stored nothing, or not every part
    ├── ResultsUntrusted   a part not written by this generation's load Job
    ├── ResultsTooLarge    more parts, a bigger part or a bigger bundle than the operator reads
    └── ResultsCorrupt     the parts do not hash, inflate or parse to one bundle
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from specdecode.experiment import keys, manifests, records, spec

FILES = ("requests.jsonl", "windows.json", "loadgen-summary.json")
# ConfigMaps are limited to 1 MiB in total; base64 grows data by 4/3, so 700 KiB of gzip per part.
PART_BYTES = 700 * 1024
DATA_KEY = "bundle.json.gz"


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


class ResultsError(Exception):
    """The results cannot be used; `reason` is the experiment's status reason."""

    reason = "ResultsMissing"


class ResultsMissing(ResultsError):
    """The load Job stored nothing, or not every part."""

    reason = "ResultsMissing"


class ResultsUntrusted(ResultsError):
    """A part that this generation's load Job did not write."""

    reason = "ResultsUntrusted"


class ResultsTooLarge(ResultsError):
    """More than the operator reads."""

    reason = "ResultsTooLarge"


class ResultsCorrupt(ResultsError):
    """The parts do not hash, inflate or parse to one bundle."""

    reason = "ResultsCorrupt"


@dataclass(frozen=True)
class Limits:
    """How much of the results the operator reads (its memory while judging grows with this)."""

    max_bytes: int = 48 * 1024 * 1024
    """The bundle, uncompressed (`SPECDECODE_RESULTS_MAX_BYTES`)."""

    @property
    def max_parts(self) -> int:
        """Gzip of incompressible data is barely larger than the data: one part more covers it."""
        return self.max_bytes // PART_BYTES + 2


# A request record's JSON: ~600 bytes, plus ~18 per generated token (its stream event and its
# text). A lower bound: benchmarks/results/memory.py measures 6.3 KB at 256 tokens, this says 5.2.
RECORD_BYTES, TOKEN_BYTES = 600, 18


def planned_bytes(experiment: spec.ExperimentSpec) -> int:
    """At least how large the load Job's results grow when no stage stops early."""
    workload = experiment.workload
    requests = workload.warmup_requests + sum(experiment.stage_requests(s) for s in workload.stages)
    return 2 * requests * (RECORD_BYTES + TOKEN_BYTES * workload.sampling.max_tokens)


def check_size(experiment: spec.ExperimentSpec, limits: Limits) -> str | None:
    """Why the experiment's results could outgrow what the operator reads (None: they cannot).

    Checked before anything is deployed: better than hours of GPUs ending in ResultsTooLarge.
    """
    planned = planned_bytes(experiment)
    if planned <= limits.max_bytes:
        return None
    return (
        f"spec.workload: up to {_mib(planned)} of results ({len(experiment.workload.stages)} stage(s) of up "
        f"to {experiment.workload.requests_per_stage} requests of {experiment.workload.sampling.max_tokens} "
        f"tokens, both arms), more than the {_mib(limits.max_bytes)} the operator reads "
        "(SPECDECODE_RESULTS_MAX_BYTES); lower requestsPerStage, the stages or sampling.maxTokens"
    )


def pack(files: Mapping[str, str]) -> list[bytes]:
    """Files -> gzip'd JSON bundle split into parts."""
    blob = gzip.compress(json.dumps(dict(files)).encode(), mtime=0)
    return [blob[i : i + PART_BYTES] for i in range(0, len(blob), PART_BYTES)] or [blob]


def digest(parts: Iterable[bytes]) -> str:
    """`sha256:<hex>` of the joined parts."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return f"sha256:{h.hexdigest()}"


class _Inflater:
    """Gzip'd parts in, at most `max_bytes` out, then the files: one part at a time."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._inflater = zlib.decompressobj(wbits=31)  # gzip framing
        self._out = bytearray()

    def feed(self, part: bytes) -> None:
        try:
            self._out += self._inflater.decompress(part, self.max_bytes + 1 - len(self._out))
        except zlib.error as exc:
            raise ResultsCorrupt(f"the result bundle is corrupt: {exc}") from None
        if len(self._out) > self.max_bytes or self._inflater.unconsumed_tail:
            raise ResultsTooLarge(
                f"the results inflate to more than {_mib(self.max_bytes)} (the operator's "
                "SPECDECODE_RESULTS_MAX_BYTES); lower spec.workload.requestsPerStage, the number "
                "of stages or sampling.maxTokens, or raise that limit with the operator's memory"
            )

    def files(self) -> dict[str, str]:
        if not self._inflater.eof or self._inflater.unused_data:
            raise ResultsCorrupt("the result bundle is corrupt: truncated, or followed by other data")
        try:
            data = json.loads(self._out)
        except ValueError as exc:
            raise ResultsCorrupt(f"the result bundle is corrupt: {exc}") from None
        finally:
            self._out = bytearray()
        if not isinstance(data, dict):
            raise ResultsCorrupt("the result bundle is not a mapping of files")
        return {str(k): str(v) for k, v in data.items()}


def unpack(parts: Iterable[bytes], *, max_bytes: int = Limits().max_bytes) -> dict[str, str]:
    """Parts (in order) -> files, inflating at most `max_bytes`."""
    inflater = _Inflater(max_bytes)
    for part in parts:
        inflater.feed(part)
    return inflater.files()


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
                "binaryData": {DATA_KEY: base64.b64encode(part).decode()},
            }
        )
    return maps


def parse(
    files: Mapping[str, str],
) -> tuple[list[records.RequestRecord], records.RunAnchor, list[records.StageWindow], dict[str, Any]]:
    """The load Job's files -> records, the run's clock anchor, stage windows and summary."""
    lines = files.get("requests.jsonl", "").splitlines()
    recs = [records.RequestRecord.model_validate_json(line) for line in lines if line.strip()]
    windows_doc = json.loads(files.get("windows.json") or "{}")
    anchor = records.RunAnchor.model_validate(windows_doc.get("anchor") or {"monotonic": 0.0, "wall": 0.0})
    windows = [records.StageWindow.model_validate(w) for w in windows_doc.get("windows", [])]
    summary = json.loads(files.get("loadgen-summary.json") or "{}")
    return recs, anchor, windows, summary


def read_dir(directory: Path) -> dict[str, str]:
    """The result files present in a directory."""
    return {name: (directory / name).read_text() for name in FILES if (directory / name).exists()}


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
        prefix, experiment, pack(read_dir(directory)), owners=owners, generation=generation, pod=pod
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
    job_uid: str | None,
    limits: Limits = Limits(),
    round_name: str | None = None,
    pod: tuple[int, int] | None = None,
) -> dict[str, str]:
    """The result files that load Job `job_uid` stored for `generation` of an experiment (of the
    round `round_name`: `rounds.py`; None: the stages); `pod` (k, N): those of its load pod k of N."""
    names = manifests.Names(experiment)
    prefix, job_name = names.results_prefix_of(round_name), names.load_job_of(round_name)
    prefix = pod_prefix(prefix, pod)
    if not job_uid:
        raise ResultsUntrusted(f"the load Job {job_name} is gone, so nothing shows who wrote the results")
    first = await kube.get(CONFIG_MAP, namespace, f"{prefix}-0")
    if first is None:
        if pod is not None and pod[1] > 1:
            raise ResultsMissing(f"load pod {pod[0]} of {pod[1]} stored no results ({prefix}-0)")
        raise ResultsMissing("the load Job stored no results")
    total = _total(first, prefix)
    if total > limits.max_parts:
        raise ResultsTooLarge(
            f"{prefix}-0 announces {total} parts, more than the {limits.max_parts} "
            f"the operator reads ({_mib(limits.max_bytes)}, SPECDECODE_RESULTS_MAX_BYTES)"
        )
    bundle = _annotation(first, keys.DIGEST_ANNOTATION)
    hashed = hashlib.sha256()
    inflater = _Inflater(limits.max_bytes)
    for i in range(total):
        cm = first if i == 0 else await kube.get(CONFIG_MAP, namespace, f"{prefix}-{i}")
        if cm is None:
            raise ResultsMissing(f"result part {i} of {total} ({prefix}-{i}) is missing")
        part = _trusted_part(cm, i, total, bundle, generation=generation, job=(job_name, job_uid), pod=pod)
        hashed.update(part)
        inflater.feed(part)
    if f"sha256:{hashed.hexdigest()}" != bundle:
        raise ResultsCorrupt(
            "the result parts do not hash to their digest: parts of different uploads (a load Job "
            "killed while it stored them?) or rewritten by someone else"
        )
    return inflater.files()


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
    data = (cm.get("binaryData") or {}).get(DATA_KEY)
    if not isinstance(data, str):
        raise ResultsCorrupt(f"ConfigMap {name} holds no binaryData.{DATA_KEY}")
    if len(data) > 4 * (PART_BYTES // 3 + 1):
        raise ResultsTooLarge(f"ConfigMap {name} is larger than a part ({PART_BYTES // 1024} KiB)")
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ResultsCorrupt(f"ConfigMap {name}: binaryData.{DATA_KEY} is not base64: {exc}") from None


def _total(cm: Mapping[str, Any], prefix: str) -> int:
    place = _annotation(cm, keys.PART_ANNOTATION) or ""
    index, _, total = place.partition("/")
    if index != "0" or not total.isdigit() or int(total) < 1:
        raise ResultsCorrupt(f"{prefix}-0: annotation {keys.PART_ANNOTATION}={place!r} is not 0/<parts>")
    return int(total)


def _annotation(cm: Mapping[str, Any], key: str) -> str | None:
    value = ((cm.get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.0f} MiB"
