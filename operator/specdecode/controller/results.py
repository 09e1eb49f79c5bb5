"""Carrying the load Job's result files to the operator through ConfigMaps.

The Job writes `requests.jsonl`, `windows.json` and `loadgen-summary.json`; they are packed into one
gzip'd JSON bundle and split over ConfigMaps `<exp>-results-<i>` (binaryData, under the 1 MiB object
limit), each owned by the experiment so deleting it removes them. The operator joins the parts back;
a missing part is an error that names it, never a silent partial analysis.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specdecode.controller.kube import CONFIG_MAP, Kube
from specdecode.experiment import manifests

FILES = ("requests.jsonl", "windows.json", "loadgen-summary.json")
# ConfigMaps are limited to 1 MiB in total; base64 grows data by 4/3, so 700 KiB of gzip per part.
PART_BYTES = 700 * 1024
LABEL_RESULTS = "specdecode.io/results"
PART_ANNOTATION = "specdecode.io/part"


class ResultsError(Exception):
    """The results are missing or incomplete."""


def pack(files: Mapping[str, str]) -> list[bytes]:
    """Files -> gzip'd JSON bundle split into parts."""
    blob = gzip.compress(json.dumps(dict(files)).encode(), mtime=0)
    return [blob[i : i + PART_BYTES] for i in range(0, len(blob), PART_BYTES)] or [blob]


def unpack(parts: Sequence[bytes]) -> dict[str, str]:
    """Parts (in order) -> files."""
    try:
        data = json.loads(gzip.decompress(b"".join(parts)))
    except (OSError, EOFError, ValueError) as exc:
        raise ResultsError(f"the result bundle is corrupt: {exc}") from None
    if not isinstance(data, dict):
        raise ResultsError("the result bundle is not a mapping of files")
    return {str(k): str(v) for k, v in data.items()}


def build_config_maps(
    prefix: str,
    experiment: str,
    parts: Sequence[bytes],
    *,
    owner: Mapping[str, Any] | None = None,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """One ConfigMap per part, labelled for lookup and owned by the experiment."""
    maps = []
    for i, part in enumerate(parts):
        metadata: dict[str, Any] = {
            "name": f"{prefix}-{i}",
            "labels": {
                **manifests.labels(experiment, component="results"),
                LABEL_RESULTS: experiment,
            },
            "annotations": {PART_ANNOTATION: f"{i}/{len(parts)}"},
        }
        if generation is not None:
            metadata["annotations"]["specdecode.io/generation"] = str(generation)
        if owner:
            metadata["ownerReferences"] = [dict(owner)]
        maps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": metadata,
                "binaryData": {"bundle.json.gz": base64.b64encode(part).decode()},
            }
        )
    return maps


def parts_from_config_maps(maps: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """The parts in order; raises ResultsError naming what is missing."""
    found: dict[int, bytes] = {}
    total = None
    for cm in maps:
        annotation = ((cm.get("metadata") or {}).get("annotations") or {}).get(PART_ANNOTATION, "")
        try:
            index_text, total_text = annotation.split("/")
            index, total = int(index_text), int(total_text)
        except ValueError:
            continue
        data = (cm.get("binaryData") or {}).get("bundle.json.gz")
        if data is not None:
            found[index] = base64.b64decode(data)
    if total is None:
        raise ResultsError("the load Job stored no results")
    missing = [i for i in range(total) if i not in found]
    if missing:
        raise ResultsError(f"result parts {missing} of {total} are missing")
    return [found[i] for i in range(total)]


def read_dir(directory: Path) -> dict[str, str]:
    """The result files present in a directory."""
    return {name: (directory / name).read_text() for name in FILES if (directory / name).exists()}


async def upload(
    kube: Kube,
    directory: Path,
    *,
    namespace: str,
    prefix: str,
    experiment: str,
    owner: Mapping[str, Any] | None = None,
    generation: int | None = None,
) -> int:
    """Store the result files of `directory`; returns the number of ConfigMaps written."""
    maps = build_config_maps(
        prefix, experiment, pack(read_dir(directory)), owner=owner, generation=generation
    )
    for cm in maps:
        await kube.put(cm, namespace)
    return len(maps)


async def download(
    kube: Kube, *, namespace: str, experiment: str, generation: int | None = None
) -> dict[str, str]:
    """The result files the load Job stored for an experiment (for one generation when given)."""
    maps = await kube.select(CONFIG_MAP, namespace, {LABEL_RESULTS: experiment})
    if generation is not None:
        maps = [cm for cm in maps if _generation(cm) in (None, generation)]
    return unpack(parts_from_config_maps(maps))


def _generation(cm: Mapping[str, Any]) -> int | None:
    value = ((cm.get("metadata") or {}).get("annotations") or {}).get("specdecode.io/generation")
    return int(value) if value is not None and str(value).isdigit() else None
