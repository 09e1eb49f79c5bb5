"""A results directory: writing it after a run, reading it back for `specdecode report DIR`.

Layout (design.md §4): `result.json` (the status object, camelCase, `ExperimentStatus.wire()`),
`requests.jsonl` (one `RequestRecord` per line and arm), `windows.json` (a JSON list of
`StageWindow`), `experiment.yaml` (the experiment document or its spec) and `report.html`.
`requests.jsonl` and `windows.json` are written by the load generator's side (`write_results`
writes them too when given records, so a directory is always complete). `results.v2.npz` is the
packed bundle of those files (specdecode/results.py, what the load Job stores in ConfigMaps),
written next to them; `load_results` reads the records from it when it is there (a fraction of
the memory and time of parsing `requests.jsonl`; texts kept for differing pairs and a sample).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specdecode import results as bundles
from specdecode.experiment.records import Request, RequestRecord, StageWindow
from specdecode.experiment.spec import ExperimentSpec
from specdecode.experiment.status import ExperimentStatus
from specdecode.report.page import render_html

RESULT = "result.json"
REQUESTS = "requests.jsonl"
WINDOWS = "windows.json"
EXPERIMENT = "experiment.yaml"
REPORT = "report.html"
PACKED = "results.v2.npz"


class ResultsError(Exception):
    """A results directory is missing a file or holds one that does not parse."""


@dataclass(frozen=True)
class Results:
    """Everything a report is rendered from."""

    status: ExperimentStatus
    records: Sequence[Request]
    windows: list[StageWindow]
    spec: ExperimentSpec
    name: str = ""


def write_result(out_dir: Path, status: ExperimentStatus) -> Path:
    """result.json alone: the status as the cluster's `.status` (camelCase)."""
    (out_dir / RESULT).write_text(json.dumps(status.wire(), indent=2) + "\n", encoding="utf-8")
    return out_dir / RESULT


def write_results(
    out_dir: Path,
    status: ExperimentStatus,
    records: Sequence[RequestRecord],
    windows: Sequence[StageWindow],
    spec: ExperimentSpec,
    *,
    name: str = "",
    write_inputs: bool = True,
) -> list[Path]:
    """Write result.json and report.html (and, with `write_inputs`, requests/windows/experiment files)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / RESULT, out_dir / REPORT]
    write_result(out_dir, status)
    if write_inputs:
        with (out_dir / REQUESTS).open("w", encoding="utf-8") as f:
            for r in records:
                f.write(r.model_dump_json() + "\n")
        (out_dir / WINDOWS).write_text(
            json.dumps({"windows": [w.model_dump(mode="json") for w in windows]}, indent=1) + "\n",
            encoding="utf-8",
        )
        doc = {
            "metadata": {"name": name},
            "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        (out_dir / EXPERIMENT).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        written += [out_dir / REQUESTS, out_dir / WINDOWS, out_dir / EXPERIMENT]
    if (out_dir / REQUESTS).exists():
        (out_dir / PACKED).write_bytes(bundles.encode_dir(out_dir))
        written.append(out_dir / PACKED)
    (out_dir / REPORT).write_text(render_html(status, records, windows, spec, name=name), encoding="utf-8")
    return written


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: cannot read: {exc}") from None


def load_results(directory: Path) -> Results:
    """Read a results directory; raises ResultsError naming the file on any problem."""
    try:
        status = ExperimentStatus.model_validate_json(_read(directory / RESULT))
    except ValueError as exc:
        raise ResultsError(f"{directory / RESULT}: not a status object: {str(exc).splitlines()[0]}") from None
    records: Sequence[Request] = []
    req_path, packed = directory / REQUESTS, directory / PACKED
    if packed.exists():
        try:
            records = bundles.parse(bundles.Bundle(packed.read_bytes(), max_bytes=2**40))[0]
        except (OSError, bundles.ResultsError) as exc:
            raise ResultsError(f"{packed}: {exc}") from None
    elif req_path.exists():
        parsed: list[RequestRecord] = []
        records = parsed
        for i, line in enumerate(_read(req_path).splitlines(), 1):
            if line.strip():
                try:
                    parsed.append(RequestRecord.model_validate_json(line))
                except ValueError as exc:
                    raise ResultsError(f"{req_path}:{i}: {str(exc).splitlines()[0]}") from None
    windows: list[StageWindow] = []
    win_path = directory / WINDOWS
    if win_path.exists():
        try:
            raw: Any = json.loads(_read(win_path))
            # The load generator writes {"anchor": ..., "windows": [...]}; a bare list is accepted too.
            listed = raw.get("windows", []) if isinstance(raw, dict) else raw
            windows = [StageWindow.model_validate(w) for w in listed]
        except (ValueError, TypeError) as exc:
            raise ResultsError(f"{win_path}: {str(exc).splitlines()[0]}") from None
    try:
        doc = yaml.safe_load(_read(directory / EXPERIMENT))
        spec_doc = doc.get("spec", doc) if isinstance(doc, dict) else None
        spec = ExperimentSpec.model_validate(spec_doc)
        name = str(((doc or {}).get("metadata") or {}).get("name") or "")
    except (ValueError, yaml.YAMLError) as exc:
        raise ResultsError(f"{directory / EXPERIMENT}: {str(exc).splitlines()[0]}") from None
    return Results(status, records, windows, spec, name)


def render_directory(directory: Path) -> Results:
    """`specdecode report DIR`: re-render DIR/report.html from the files there; returns what it read."""
    results = load_results(directory)
    html = render_html(results.status, results.records, results.windows, results.spec, name=results.name)
    (directory / REPORT).write_text(html, encoding="utf-8")
    return results
