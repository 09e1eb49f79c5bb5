"""Reading experiment files: YAML (multi-document) in, validated experiments or field-named problems out.

Used by `specdecode validate` and `specdecode run`; a garbled or unreadable file gets one line,
never a traceback. Documents of other kinds (the ConfigMap beside an experiment in a kustomize
file) are skipped and named, never failed; `validate -` reads standard input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


MAX_FILE_BYTES = 3 * 1024 * 1024
"""The largest experiment file read: the API server's own request limit (3 MiB); an experiment
that large could not be applied, and its spec ConfigMap could not be stored (1 MiB)."""
MAX_DEPTH = 64
"""The deepest nesting of mappings and lists, aliases followed (an experiment nests about 8)."""
MAX_NODES = 100_000
"""The most values a file may expand to, aliases followed (an alias bomb expands exponentially)."""


def load_documents(path: Path) -> list[Any]:
    """All YAML documents of a file (empty documents dropped)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UnreadableFileError(
                f"{path}: {size} bytes, more than an experiment file may hold ({MAX_FILE_BYTES} bytes, "
                "the API server's request limit): keep prompts and traces in their own files"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableFileError(f"{path}: cannot read: {exc}") from None
    return parse_documents(text, str(path))


def parse_documents(text: str, name: str) -> list[Any]:
    """All YAML documents of `text` (empty documents dropped); `name` says where in errors. Bounded:
    its size, its nesting and how far its aliases expand (`_BoundedLoader`), so a hostile file is
    refused at once instead of exhausting memory or the stack."""
    if len(text) > MAX_FILE_BYTES:
        raise UnreadableFileError(
            f"{name}: {len(text)} characters, more than an experiment file may hold ({MAX_FILE_BYTES})"
        )
    try:
        return [doc for doc in yaml.load_all(text, Loader=_BoundedLoader) if doc is not None]
    except _TooLarge as exc:
        raise UnreadableFileError(f"{name}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UnreadableFileError(f"{name}: not valid YAML{where}: {problem}") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UnreadableFileError(f"{name}: a value cannot be read: {str(exc).split(';')[0]}") from None


class _TooLarge(Exception):
    """A document nests or expands beyond the bounds; says where."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a document nested deeper than MAX_DEPTH or expanding, aliases
    followed, to more than MAX_NODES values, before it is constructed."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # The composer recurses once per level: bounded here, before Python's stack is.
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise _TooLarge(f"nested more than {MAX_DEPTH} levels deep (line {line})")
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node | None:
        node: yaml.Node | None = super().compose_document()
        if node is not None:
            _check_bounds(node)
        return node


def _check_bounds(root: yaml.Node) -> None:
    """Raise `_TooLarge` when `root` expands (aliases followed) deeper than MAX_DEPTH, to more than
    MAX_NODES values, or into itself. Each node is sized once (an alias shares its anchor's node)."""
    sizes: dict[int, tuple[int, int]] = {}  # id -> (values, depth) once sized
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if not children_done:  # first visit: its children are sized first (a cycle shows as an open child)
            open_.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in open_:
                    raise _TooLarge(f"an alias refers to its own anchor (line {child.start_mark.line + 1})")
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        open_.discard(key)
        values = 1 + sum(sizes[id(c)][0] for c in children)
        depth = 1 + max((sizes[id(c)][1] for c in children), default=0)
        line = node.start_mark.line + 1
        if depth > MAX_DEPTH:
            raise _TooLarge(f"nested more than {MAX_DEPTH} levels deep (line {line}), aliases followed")
        if values > MAX_NODES:
            raise _TooLarge(
                f"expands to more than {MAX_NODES} values (line {line}), aliases followed: an alias bomb?"
            )
        sizes[key] = (values, depth)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


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


def validate_files(
    paths: Sequence[str],
    *,
    out: TextIO,
    err: TextIO,
    stdin: TextIO | None = None,
    operator_limits: Callable[[spec.ExperimentSpec], tuple[str | None, str | None]] | None = None,
) -> int:
    """`specdecode validate`: 0 when every experiment is valid, 2 with one line per problem otherwise;
    documents of other kinds are named as skipped. `operator_limits`: what the operator at its
    defaults would refuse of an experiment (its results' size), and what it would need configured."""
    failed = False
    for name in paths:
        if name == STDIN:
            if stdin is None:
                raise ValueError("validate_files: '-' needs stdin")
            report = read_file(Path("<stdin>"), text=stdin.read())
            name = "<stdin>"
        else:
            report = read_file(Path(name))
        # per experiment, in order (two experiments of one file may share a name)
        limits = [operator_limits(e.spec) if operator_limits else (None, None) for e in report.experiments]
        report.problems += [
            f"{name}: {e.name}: {refused}"
            for e, (refused, _) in zip(report.experiments, limits, strict=True)
            if refused
        ]
        for problem in report.problems:
            print(problem, file=err)
        failed = failed or bool(report.problems)
        for experiment, (refused, needs) in zip(report.experiments, limits, strict=True):
            if refused is not None:
                continue
            note = "" if experiment.spec.speculates else NOISE_FLOOR_NOTE
            print(f"{name}: {experiment.name}: valid{note}", file=out)
            expansion = sweep_expansion(experiment.spec.workload)
            if expansion:
                print(f"{name}: {experiment.name}: {expansion}", file=out)
            for local_only in validation.check_operator_support(experiment.spec):
                print(f"{name}: {experiment.name}: note: {local_only}", file=out)
            for weak in advice.advice(experiment.spec):
                print(f"{name}: {experiment.name}: warning: {weak}", file=out)
            if needs is not None:
                print(f"{name}: {experiment.name}: warning: {needs}", file=out)
        for skipped in report.skipped:
            print(f"{skipped}: skipped (not a {keys.KIND})", file=out)
    return 2 if failed else 0
