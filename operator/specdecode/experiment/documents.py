"""Reading experiment files: YAML (multi-document) in, validated experiments or field-named problems out.

Used by `specdecode validate` and `specdecode run`; a garbled or unreadable file gets one line,
never a traceback. Documents of other kinds (the ConfigMap beside an experiment in a kustomize
file) are skipped and named, never failed; `validate -` reads standard input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from specdecode.experiment import advice, keys, spec, validation


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
    skipped: list[str] = field(default_factory=list)
    """Documents of other kinds, e.g. `FILE[1]: ConfigMap prompts`."""


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
    return parse_documents(text, str(path))


def parse_documents(text: str, name: str) -> list[Any]:
    """All YAML documents of `text` (empty documents dropped); `name` says where in errors."""
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UnreadableFileError(f"{name}: not valid YAML{where}: {problem}") from None


def other_kind(document: Any) -> str | None:
    """`KIND NAME` of a resource that is not an experiment at all (another kind, outside our API
    group), or None: a typo in an experiment's kind or apiVersion is still reported."""
    if not isinstance(document, dict):
        return None
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if not isinstance(kind, str) or kind == keys.KIND:
        return None
    if isinstance(api_version, str) and api_version.startswith(f"{keys.API_GROUP}/"):
        return None
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return f"{kind} {name}" if name else kind


def read_file(path: Path, *, text: str | None = None) -> FileReport:
    """Validate every experiment of a file (`text`: its content, already read, e.g. stdin)."""
    report = FileReport(str(path))
    try:
        documents = load_documents(path) if text is None else parse_documents(text, str(path))
    except UnreadableFileError as exc:
        report.problems.append(str(exc))
        return report
    if not documents:
        report.problems.append(f"{path}: holds no document")
    for i, document in enumerate(documents):
        where = f"{path}" if len(documents) == 1 else f"{path}[{i}]"
        skipped = other_kind(document)
        if skipped is not None:
            report.skipped.append(f"{where}: {skipped}")
            continue
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


def sweep_expansion(workload: spec.WorkloadSpec) -> str:
    """`workload.sweep (concurrency) -> stages c1, c4, c16` (issue 17), or "" without a sweep."""
    if workload.sweep is None:
        return ""
    names = ", ".join(stage.name for stage in workload.stages)
    return f"workload.sweep ({workload.sweep.axis}) -> {len(workload.stages)} stages: {names}"


STDIN = "-"
"""The file name that means standard input (`specdecode validate -`, `kustomize build | ...`)."""


def validate_files(paths: Sequence[str], *, out: TextIO, err: TextIO, stdin: TextIO | None = None) -> int:
    """`specdecode validate`: 0 when every experiment is valid, 2 with one line per problem otherwise;
    documents of other kinds are named as skipped."""
    failed = False
    for name in paths:
        if name == STDIN:
            if stdin is None:
                raise ValueError("validate_files: '-' needs stdin")
            report = read_file(Path("<stdin>"), text=stdin.read())
            name = "<stdin>"
        else:
            report = read_file(Path(name))
        for problem in report.problems:
            print(problem, file=err)
        failed = failed or bool(report.problems)
        for experiment in report.experiments:
            note = "" if experiment.spec.speculates else NOISE_FLOOR_NOTE
            print(f"{name}: {experiment.name}: valid{note}", file=out)
            expansion = sweep_expansion(experiment.spec.workload)
            if expansion:
                print(f"{name}: {experiment.name}: {expansion}", file=out)
            for local_only in validation.check_operator_support(experiment.spec):
                print(f"{name}: {experiment.name}: note: {local_only}", file=out)
            for weak in advice.advice(experiment.spec):
                print(f"{name}: {experiment.name}: warning: {weak}", file=out)
        for skipped in report.skipped:
            print(f"{skipped}: skipped (not a {keys.KIND})", file=out)
    return 2 if failed else 0
