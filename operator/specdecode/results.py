"""Carrying the load Job's result files to the operator through ConfigMaps, and trusting only those.

The Job writes `requests.jsonl`, `windows.json` and `loadgen-summary.json`; they are packed into one
bundle (the format below) and split over ConfigMaps `<exp>-results-<i>` (binaryData, under the 1 MiB
object limit).

The bundle's format, version 2 (`VERSION`; binaryData key `results.v2.npz`): a NumPy `.npz` archive
(zip, each member deflated) of typed columns, one row per request record, and a small JSON member
`header` (`{"format": "specdecode.io/results", "version": 2, "records": n, "windows": ...,
"summary": ...}`). Numbers are int64/float64 columns (`INT_NONE`, NaN: null); strings are
dictionary-coded (int32 codes into a JSON table, -1: null), so a stage, an arm or a text hash is
stored once; the stream's events are kept as the two numbers the analysis reads (`token_events`,
`stream_tokens`), the server's per-request `speculative_decoding` as its counters and histogram,
and the generated text only for the pairs whose outputs differ and a sample (`SAMPLE_PAIRS` a
stage). What it leaves out (every event's time, `server_metrics`, the other texts) stays in the
load pod's `requests.jsonl` and its log summary. NumPy rather than Arrow/Parquet: it is already a
dependency of the operator and the load image, a typed column is all the analysis needs, and
`np.load(allow_pickle=False)` reads nothing but arrays; pyarrow would add ~100 MB to both images
for features (nested types, predicate push-down) nothing here uses. Read back, the rows become
slotted `records.PackedRequest`s (~0.7 KB each where a parsed JSON record took ~35 KB): 100,000
records are judged in well under 300 MiB (benchmarks/scale/results_100k.py).

Version 1 (key `bundle.json.gz`: the three files as one gzip'd JSON object) is what load images
before version 2 write; the operator still reads it (an operator upgraded while an experiment's
load Job runs the older image), bounded as before. A bundle of a version this module does not know
is refused naming its version (`ResultsUnsupported`). Every part carries its place (`specdecode.io/part: i/N`), the generation measured
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
    ├── ResultsCorrupt     the parts do not hash, inflate or parse to one bundle
    └── ResultsUnsupported a bundle format newer than this operator reads
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import io
import json
import math
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from specdecode.experiment import keys, manifests, records, spec

FILES = ("requests.jsonl", "windows.json", "loadgen-summary.json")
# ConfigMaps are limited to 1 MiB in total; base64 grows data by 4/3, so 700 KiB of bundle per part.
PART_BYTES = 700 * 1024
FORMAT, VERSION = "specdecode.io/results", 2
DATA_KEY = "results.v2.npz"
"""The binaryData key of a version-2 part."""
LEGACY_DATA_KEY = "bundle.json.gz"
"""The binaryData key of a version-1 part (load images before version 2)."""
DATA_KEYS = (DATA_KEY, LEGACY_DATA_KEY)
GZIP_MAGIC = b"\x1f\x8b"
"""How a version-1 bundle (gzip) begins."""


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


class ResultsUnsupported(ResultsError):
    """A bundle format this operator does not read (a load image newer than the operator)."""

    reason = "ResultsUnsupported"


@dataclass(frozen=True)
class Limits:
    """How much of the results the operator reads (its memory while judging grows with this)."""

    max_bytes: int = 48 * 1024 * 1024
    """The bundle, uncompressed (`SPECDECODE_RESULTS_MAX_BYTES`)."""

    @property
    def max_parts(self) -> int:
        """Gzip of incompressible data is barely larger than the data: one part more covers it."""
        return self.max_bytes // PART_BYTES + 2


# A packed record (version 2): 267 bytes of typed columns (int64/float64 numbers, int32 string
# codes) and ~33 of its text hash in the hash table (one hash per agreeing pair). A lower bound:
# request and prompt ids, the acceptance histogram and the texts of mismatched pairs add to it
# (tests/results: within 2x of a measured bundle).
RECORD_BYTES = 300
# The texts kept of `SAMPLE_PAIRS` pairs a stage: at least 3 bytes a token of JSON text.
TOKEN_BYTES = 3


def planned_bytes(experiment: spec.ExperimentSpec) -> int:
    """At least how large the load Job's results inflate to when no stage stops early."""
    workload = experiment.workload
    texts = 2 * SAMPLE_PAIRS * len(workload.stages) * workload.sampling.max_tokens * TOKEN_BYTES
    return 2 * _planned_requests(experiment) * RECORD_BYTES + texts


def _planned_requests(experiment: spec.ExperimentSpec) -> int:
    """Requests sent to each arm when no stage stops early (warm-up included)."""
    workload = experiment.workload
    return workload.warmup_requests + sum(experiment.stage_requests(s) for s in workload.stages)


def check_size(experiment: spec.ExperimentSpec, limits: Limits) -> str | None:
    """Why the experiment's results could outgrow what the operator reads (None: they cannot).

    Checked before anything is deployed: better than hours of GPUs ending in ResultsTooLarge.
    """
    planned = planned_bytes(experiment)
    if planned <= limits.max_bytes:
        return None
    workload = experiment.workload
    return (
        f"spec.workload: up to {_mib(planned)} of packed results ({_planned_requests(experiment)} "
        "requests to each arm: "
        f"{len(workload.stages)} stage(s) of up to {workload.requests_per_stage} requests, and "
        f"{workload.warmup_requests} warm-up), more than the {_mib(limits.max_bytes)} the operator reads "
        f"(SPECDECODE_RESULTS_MAX_BYTES) in up to {limits.max_parts} ConfigMaps; lower "
        "requestsPerStage or the number of stages, or raise that limit with the operator's memory"
    )


Results = tuple[list[records.Request], records.RunAnchor, list[records.StageWindow], dict[str, Any]]
"""The records, the run's clock anchor, the stage windows and the load generator's summary."""

SAMPLE_PAIRS = 3
"""Pairs a stage whose texts are kept even when they agree (to eyeball in the report)."""
INT_NONE = int(np.iinfo(np.int64).min)
"""A null in an int64 column."""
_FLOATS = (
    "intended", "sent", "first_byte", "first_token", "end", "headers", "connect_ms", "ttft_ms",
    "ttft_from_intended_ms", "tpot_ms", "e2e_ms", "schedule_lag_ms",
)  # fmt: skip
_INTS = (
    "index", "http_status", "prompt_tokens", "completion_tokens", "diverges_at", "slot", "session",
    "turn", "n_events", "token_events", "stream_tokens",
)  # fmt: skip
_BOOLS = ("warmup", "ok")
_STRINGS = (
    "stage", "arm", "prompt_id", "category", "error_class", "error", "request_id", "finish_reason",
    "token_source", "text_hash",
)  # fmt: skip
# The server's per-request `speculative_decoding` fields that acceptance.py reads, as columns.
_SPEC_DECODE = {
    "sd_accepted": "num_accepted_draft_tokens",
    "sd_drafted": "num_draft_tokens",
    "sd_steps": "num_spec_steps",
    "sd_k": "num_spec_tokens",
}
_HISTOGRAM = "acceptance_histogram"
_REQUIRED = ("stage", "index", "arm", "sent")
_DEFAULTS: dict[str, Any] = {"prompt_id": "", "request_id": "", "token_source": "usage", "n_events": 0}


class _Columns:
    """The packed columns, built a record at a time (the load Job's side)."""

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = {n: [] for n in (*_FLOATS, *_INTS, *_BOOLS, *_SPEC_DECODE)}
        self.codes: dict[str, list[int]] = {n: [] for n in _STRINGS}
        self.tables: dict[str, dict[str, int]] = {n: {} for n in _STRINGS}
        self.histogram: list[int] = []
        self.histogram_ends: list[int] = []
        self.spec_decode: list[bool] = []

    def add(self, rec: Mapping[str, Any]) -> None:
        events = rec.get("events") or []
        derived = {
            "token_events": len(events),
            "stream_tokens": events[-1][1] - events[0][1] if len(events) >= 2 else 0,
        }
        for n in _FLOATS:
            v = rec.get(n)
            self.values[n].append(math.nan if v is None else float(v))
        for n in _INTS:
            v = derived[n] if n in derived else rec.get(n)
            self.values[n].append(INT_NONE if v is None else int(v))
        for n in _BOOLS:
            self.values[n].append(bool(rec.get(n)))
        for n in _STRINGS:
            v = rec.get(n)
            table = self.tables[n]
            self.codes[n].append(-1 if v is None else table.setdefault(str(v), len(table)))
        sd = rec.get("spec_decode")
        sd = sd if isinstance(sd, Mapping) else None
        self.spec_decode.append(sd is not None)
        for column, key in _SPEC_DECODE.items():
            v = sd.get(key) if sd is not None else None
            self.values[column].append(INT_NONE if v is None else int(v))
        self.histogram.extend(int(c) for c in ((sd or {}).get(_HISTOGRAM) or []))
        self.histogram_ends.append(len(self.histogram))

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        out: dict[str, npt.NDArray[Any]] = {}
        for n in _FLOATS:
            out[n] = np.array(self.values[n], dtype=np.float64)
        for n in (*_INTS, *_SPEC_DECODE):
            out[n] = np.array(self.values[n], dtype=np.int64)
        for n in _BOOLS:
            out[n] = np.array(self.values[n], dtype=np.bool_)
        for n in _STRINGS:
            out[n] = np.array(self.codes[n], dtype=np.int32)
            out[f"{n}.table"] = _json_array(list(self.tables[n]))
        out["spec_decode"] = np.array(self.spec_decode, dtype=np.bool_)
        out["histogram"] = np.array(self.histogram, dtype=np.int64)
        out["histogram_ends"] = np.array(self.histogram_ends, dtype=np.int64)
        return out


def encode(
    lines: Callable[[], Iterable[str]], windows: Mapping[str, Any], summary: Mapping[str, Any]
) -> bytes:
    """`requests.jsonl` (a fresh iterator of its lines per call: read twice, never held whole),
    `windows.json` and `loadgen-summary.json` -> a version-2 bundle.

    The first pass builds the columns and finds the pairs whose texts differ; the second keeps the
    texts of those pairs and of the first `SAMPLE_PAIRS` pairs of each stage."""
    columns = _Columns()
    # (stage, index) -> arm -> (ok, text hash, row)
    pairs: dict[tuple[str, int], dict[str, tuple[bool, str | None, int]]] = {}
    for number, line in enumerate(lines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        missing = (
            next((key for key in _REQUIRED if rec.get(key) is None), None)
            if isinstance(rec, dict)
            else "stage"
        )
        if missing is not None:
            raise ValueError(f"requests.jsonl line {number}: no {missing!r} (not a request record)")
        row = len(columns.spec_decode)
        columns.add(rec)
        if not rec.get("warmup"):
            key = (str(rec["stage"]), int(rec["index"]))
            pairs.setdefault(key, {})[str(rec["arm"])] = (bool(rec.get("ok")), rec.get("text_hash"), row)
    keep: set[int] = set()
    sampled: dict[str, int] = {}
    for (stage, _), arms in pairs.items():
        control, treatment = arms.get("control"), arms.get("treatment")
        if control is None or treatment is None or not (control[0] and treatment[0]):
            continue
        if control[1] is None or treatment[1] is None or control[1] != treatment[1]:
            keep |= {control[2], treatment[2]}
        elif sampled.get(stage, 0) < SAMPLE_PAIRS:
            sampled[stage] = sampled.get(stage, 0) + 1
            keep |= {control[2], treatment[2]}
    del pairs
    rows = sorted(keep)
    texts: list[str | None] = []
    if rows:
        for row, line in enumerate(line for line in lines() if line.strip()):
            if row in keep:
                texts.append(json.loads(line).get("text"))
    header = {
        "format": FORMAT,
        "version": VERSION,
        "records": len(columns.spec_decode),
        "windows": dict(windows),
        "summary": dict(summary),
    }
    arrays = columns.arrays()
    arrays["header"] = _json_array(header)
    arrays["text.rows"] = np.array(rows, dtype=np.int64)
    arrays["text.values"] = _json_array(texts)
    out = io.BytesIO()
    np.savez_compressed(out, allow_pickle=False, **arrays)
    return out.getvalue()


def _json_array(value: Any) -> npt.NDArray[np.uint8]:
    return np.frombuffer(json.dumps(value, separators=(",", ":")).encode(), dtype=np.uint8)


def _json_of(array: npt.NDArray[Any]) -> Any:
    return json.loads(array.tobytes())


def encode_files(files: Mapping[str, str]) -> bytes:
    """The three files (as `read_dir` returns them) -> a version-2 bundle."""
    return encode(
        lambda: files.get("requests.jsonl", "").splitlines(),
        json.loads(files.get("windows.json") or "{}"),
        json.loads(files.get("loadgen-summary.json") or "{}"),
    )


def encode_dir(directory: Path) -> bytes:
    """The result files of `directory` -> a version-2 bundle, `requests.jsonl` streamed from disk."""
    requests = directory / "requests.jsonl"

    def lines() -> Iterable[str]:
        if requests.exists():
            with requests.open(encoding="utf-8") as f:
                yield from f

    def doc(name: str) -> Any:
        path = directory / name
        return json.loads(path.read_text() or "{}") if path.exists() else {}

    return encode(lines, doc("windows.json"), doc("loadgen-summary.json"))


def split(blob: bytes) -> list[bytes]:
    """A bundle -> parts of at most `PART_BYTES`."""
    return [blob[i : i + PART_BYTES] for i in range(0, len(blob), PART_BYTES)] or [blob]


def pack(files: Mapping[str, str]) -> list[bytes]:
    """Files -> a version-2 bundle split into parts."""
    return split(encode_files(files))


def pack_legacy(files: Mapping[str, str]) -> list[bytes]:
    """Files -> a version-1 bundle (gzip'd JSON) split into parts, as load images before version 2
    write it (tests and benchmarks/scale/results_100k.py's "before")."""
    return split(gzip.compress(json.dumps(dict(files)).encode(), mtime=0))


def digest(parts: Iterable[bytes]) -> str:
    """`sha256:<hex>` of the joined parts."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return f"sha256:{h.hexdigest()}"


@dataclass(frozen=True)
class Bundle:
    """The joined parts of one upload, not yet read (`parse` reads them, in the analysis lane)."""

    data: bytes
    max_bytes: int = 48 * 1024 * 1024
    """What `parse` inflates at most (`Limits.max_bytes`)."""

    @property
    def version(self) -> int:
        """1 (gzip'd JSON) or 2 (zip of columns), from the first bytes."""
        if self.data.startswith(GZIP_MAGIC):
            return 1
        if self.data[:4] == b"PK\x03\x04":
            return 2
        raise ResultsCorrupt("the result bundle is neither a version-2 archive nor a version-1 gzip")


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
            raise _too_large(self.max_bytes)

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


def _too_large(max_bytes: int) -> ResultsTooLarge:
    return ResultsTooLarge(
        f"the results inflate to more than {_mib(max_bytes)} (the operator's "
        "SPECDECODE_RESULTS_MAX_BYTES); lower spec.workload.requestsPerStage, the number "
        "of stages or sampling.maxTokens, or raise that limit with the operator's memory"
    )


def unpack(parts: Iterable[bytes], *, max_bytes: int = Limits().max_bytes) -> Bundle:
    """Parts (in order) -> the bundle they join to (read by `parse`, inflating at most `max_bytes`)."""
    return Bundle(b"".join(parts), max_bytes)


def unpack_files(bundle: Bundle) -> dict[str, str]:
    """A version-1 bundle -> its files, inflating at most its `max_bytes`."""
    inflater = _Inflater(bundle.max_bytes)
    inflater.feed(bundle.data)
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


def parse(bundle: Bundle) -> Results:
    """A bundle of either version -> records, the run's clock anchor, stage windows and summary."""
    if bundle.version == 1:
        return parse_files(unpack_files(bundle))
    try:
        with zipfile.ZipFile(io.BytesIO(bundle.data)) as archive:
            inflated = sum(member.file_size for member in archive.infolist())
    except (zipfile.BadZipFile, ValueError) as exc:
        raise ResultsCorrupt(f"the result bundle is corrupt: {exc}") from None
    if inflated > bundle.max_bytes:
        raise _too_large(bundle.max_bytes)
    try:
        with np.load(io.BytesIO(bundle.data), allow_pickle=False) as archive:
            header = _json_of(archive["header"])
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ResultsCorrupt(f"the result bundle is not a {FORMAT} archive")
            if header.get("version") != VERSION:
                raise ResultsUnsupported(
                    f"the results are in format version {header.get('version')!r}; this operator "
                    f"reads versions 1 and {VERSION}: upgrade the operator to the load image's release"
                )
            columns = {name: archive[name] for name in archive.files}
        recs = _rows(columns, int(header["records"]))
    except (ValueError, KeyError, TypeError, IndexError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ResultsCorrupt(f"the result bundle is corrupt: {type(exc).__name__}: {exc}") from None
    windows_doc = header.get("windows") or {}
    anchor = records.RunAnchor.model_validate(windows_doc.get("anchor") or {"monotonic": 0.0, "wall": 0.0})
    windows = [records.StageWindow.model_validate(w) for w in windows_doc.get("windows", [])]
    return recs, anchor, windows, dict(header.get("summary") or {})


def _rows(columns: Mapping[str, npt.NDArray[Any]], n: int) -> list[records.Request]:
    """Columns -> slotted rows, built column-wise (each column a list of Python values once)."""
    values: dict[str, list[Any]] = {}
    for name in _FLOATS:
        values[name] = [None if v != v else v for v in columns[name].tolist()]
    for name in (*_INTS, *_SPEC_DECODE):
        values[name] = [None if v == INT_NONE else v for v in columns[name].tolist()]
    for name in _BOOLS:
        values[name] = columns[name].tolist()
    for name in _STRINGS:
        table = [str(v) for v in _json_of(columns[f"{name}.table"])]
        values[name] = [None if c < 0 else table[c] for c in columns[name].tolist()]
    for name, default in _DEFAULTS.items():
        values[name] = [default if v is None else v for v in values[name]]
    values["arm"] = [_arm(a) for a in values["arm"]]
    if any(len(v) != n for v in values.values()):
        raise ValueError(f"the columns do not all hold {n} records")
    values["spec_decode"] = _spec_decode(columns, values, n)
    text: list[str | None] = [None] * n
    for row, t in zip(columns["text.rows"].tolist(), _json_of(columns["text.values"]), strict=True):
        text[row] = t
    values["text"] = text
    for name in _SPEC_DECODE:
        del values[name]
    names = list(values)
    return [
        records.PackedRequest(**dict(zip(names, row, strict=True)))
        for row in zip(*values.values(), strict=True)
    ]


_ARMS = {arm.value: arm for arm in spec.Arm}


def _arm(name: str | None) -> spec.Arm:
    """A row's arm as `spec.Arm` (an unknown name is a corrupt bundle: ValueError)."""
    found = _ARMS.get(name or "")
    if found is None:
        raise ValueError(f"a record names arm {name!r}, not control or treatment")
    return found


def _spec_decode(
    columns: Mapping[str, npt.NDArray[Any]], values: Mapping[str, list[Any]], n: int
) -> list[dict[str, Any] | None]:
    """The per-request `speculative_decoding` dicts, with the fields the analysis reads."""
    ends = columns["histogram_ends"].tolist()
    histogram = columns["histogram"].tolist()
    out: list[dict[str, Any] | None] = []
    start = 0
    for i, present in enumerate(columns["spec_decode"].tolist()):
        end = ends[i]
        if present:
            sd = {
                key: values[column][i]
                for column, key in _SPEC_DECODE.items()
                if values[column][i] is not None
            }
            if end > start:
                sd[_HISTOGRAM] = histogram[start:end]
            out.append(sd)
        else:
            out.append(None)
        start = end
    if len(out) != n:
        raise ValueError(f"the spec_decode column does not hold {n} records")
    return out


def parse_files(files: Mapping[str, str]) -> Results:
    """The load Job's files (a version-1 bundle, or a results directory) -> records, the run's
    clock anchor, stage windows and summary."""
    lines = files.get("requests.jsonl", "").splitlines()
    recs: list[records.Request] = [
        records.RequestRecord.model_validate_json(line) for line in lines if line.strip()
    ]
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
    job_uid: str | None,
    limits: Limits = Limits(),
    round_name: str | None = None,
    pod: tuple[int, int] | None = None,
) -> Bundle:
    """The result bundle that load Job `job_uid` stored for `generation` of an experiment (of the
    round `round_name`: `rounds.py`; None: the stages); `pod` (k, N): that of its load pod k of N;
    `parse` reads it."""
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


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.0f} MiB"
