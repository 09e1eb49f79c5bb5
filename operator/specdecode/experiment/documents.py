"""Reading experiment files: YAML (multi-document) in, validated experiments or field-named problems out.

Used by `specdecode validate` and `specdecode run`; a garbled or unreadable file gets one line,
never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from specdecode.experiment import spec, validation


@dataclass(frozen=True)
class Experiment:
    """A validated experiment document."""

    name: str
    spec: spec.ExperimentSpec
    document: dict[str, Any]
    source: Path | None = None

    @property
    def namespace(self) -> str:
        """metadata.namespace, or `default`."""
        metadata = self.document.get("metadata") or {}
        return str(metadata.get("namespace") or "default")


@dataclass
class FileReport:
    """What one file held: valid experiments, and problems prefixed with where they are."""

    path: str
    experiments: list[Experiment] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class UnreadableFileError(Exception):
    """The file could not be read or is not YAML."""


def load_documents(path: Path) -> list[Any]:
    """All YAML documents of a file (empty documents dropped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableFileError(f"{path}: cannot read: {exc}") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UnreadableFileError(f"{path}: not valid YAML{where}: {problem}") from None


def read_file(path: Path) -> FileReport:
    """Validate every document of a file."""
    report = FileReport(str(path))
    try:
        documents = load_documents(path)
    except UnreadableFileError as exc:
        report.problems.append(str(exc))
        return report
    if not documents:
        report.problems.append(f"{path}: holds no document")
    for i, document in enumerate(documents):
        where = f"{path}" if len(documents) == 1 else f"{path}[{i}]"
        problems = validation.check_document(document)
        if problems:
            report.problems.extend(f"{where}: {problem}" for problem in problems)
            continue
        experiment, name = validation.parse_experiment(document)
        report.experiments.append(Experiment(name, experiment, dict(document), path))
    return report


def load_experiment(path: Path) -> Experiment:
    """The single experiment in `path`; raises InvalidSpecError/UnreadableFileError otherwise."""
    report = read_file(path)
    if report.problems:
        raise validation.InvalidSpecError([validation.Problem("", p) for p in report.problems])
    if len(report.experiments) != 1:
        raise validation.InvalidSpecError(
            [
                validation.Problem(
                    str(path), f"holds {len(report.experiments)} experiments; give a file with one"
                )
            ]
        )
    return report.experiments[0]


#: what `validate` adds for an A/A run: the speculative config was checked all the same
NOISE_FLOOR_NOTE = " (analysis.mode NoiseFloor: an A/A run; spec.speculative is validated, not used)"


def validate_files(paths: Sequence[str], *, out: TextIO, err: TextIO) -> int:
    """`specdecode validate`: 0 when every document is valid, 2 with one line per problem otherwise."""
    failed = False
    for name in paths:
        report = read_file(Path(name))
        for problem in report.problems:
            print(problem, file=err)
        failed = failed or bool(report.problems)
        for experiment in report.experiments:
            note = "" if experiment.spec.speculates else NOISE_FLOOR_NOTE
            print(f"{name}: {experiment.name}: valid{note}", file=out)
    return 2 if failed else 0
