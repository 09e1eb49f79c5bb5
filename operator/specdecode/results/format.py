"""The results bundle's format: the load Job's files packed into typed columns, and read back.

See the package's docstring (`specdecode.results`) for the format (version 2, and version 1 still read).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from specdecode.experiment import records, spec
from specdecode.results.limits import (
    PART_BYTES,
    SAMPLE_PAIRS,
    Limits,
    ResultsCorrupt,
    ResultsUnsupported,
    too_large,
)

FILES = ("requests.jsonl", "windows.json", "loadgen-summary.json")
FORMAT, VERSION = "specdecode.io/results", 2
DATA_KEY = "results.v2.npz"
"""The binaryData key of a version-2 part."""
LEGACY_DATA_KEY = "bundle.json.gz"
"""The binaryData key of a version-1 part (load images before version 2)."""
DATA_KEYS = (DATA_KEY, LEGACY_DATA_KEY)
GZIP_MAGIC = b"\x1f\x8b"
"""How a version-1 bundle (gzip) begins."""


Results = tuple[list[records.Request], records.RunAnchor, list[records.StageWindow], dict[str, Any]]
"""The records, the run's clock anchor, the stage windows and the load generator's summary."""

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
            raise too_large(self.max_bytes)

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


def unpack(parts: Iterable[bytes], *, max_bytes: int = Limits().max_bytes) -> Bundle:
    """Parts (in order) -> the bundle they join to (read by `parse`, inflating at most `max_bytes`)."""
    return Bundle(b"".join(parts), max_bytes)


def unpack_files(bundle: Bundle) -> dict[str, str]:
    """A version-1 bundle -> its files, inflating at most its `max_bytes`."""
    inflater = _Inflater(bundle.max_bytes)
    inflater.feed(bundle.data)
    return inflater.files()


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
        raise too_large(bundle.max_bytes)
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
