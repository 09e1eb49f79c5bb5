"""Scores of a mutation sample (benchmarks/mutation/sample.py), with the mutants equivalent by construction
set apart.

Input: sample.py's JSON, or a session.sqlite of a run still going (the mutants done so far). Equivalent by
construction: a mutant that changes only a function's parameter or return annotation, in a module
with `from __future__ import annotations` (every module of the three packages): such annotations are
never evaluated (no module calls `typing.get_type_hints` on these functions; pydantic and dataclass
fields are class-level annotations, which are not set apart). cosmic-ray mutates every `X | None` of a
signature ~12 ways, so these are a large share of its mutants.

    python benchmarks/mutation/report.py controller.json loadgen.json experiment.json
"""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _annotation_spans(tree: ast.AST) -> list[tuple[int, int, int, int]]:
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            notes = [a.annotation for a in every if a is not None and a.annotation is not None]
            if node.returns is not None:
                notes.append(node.returns)
            for n in notes:
                assert n.end_lineno is not None and n.end_col_offset is not None
                spans.append((n.lineno, n.col_offset, n.end_lineno, n.end_col_offset))
    return spans


def changed_column(diff: str) -> int | None:
    """Column of the first character the mutant changes (single-line mutants), from the diff."""
    minus = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    plus = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if len(minus) != 1 or len(plus) != 1:
        return None
    for i, (a, b) in enumerate(zip(minus[0], plus[0], strict=False)):
        if a != b:
            return i
    return min(len(minus[0]), len(plus[0]))


def in_signature_annotation(source: str, line: int, diff: str) -> bool:
    if "from __future__ import annotations" not in source:
        return False
    col = changed_column(diff)
    if col is None:
        return False
    return any((l0, c0) <= (line, col) < (l1, c1) for l0, c0, l1, c1 in _annotation_spans(ast.parse(source)))


def from_session(path: Path) -> dict[str, Any]:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    mutants = []
    with use_db(str(path), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome is WorkerOutcome.SKIPPED:
                continue
            m = item.mutations[0]
            if result.worker_outcome is not WorkerOutcome.NORMAL:
                outcome = f"error:{result.worker_outcome}"
            elif result.test_outcome is TestOutcome.SURVIVED:
                outcome = "survived"
            else:
                outcome = "timeout" if result.output == "timeout" else "killed"
            mutants.append(
                {
                    "module": _in_package(m.module_path)[1],
                    "path": str(m.module_path),
                    "line": m.start_pos[0],
                    "outcome": outcome,
                    "diff": result.diff,
                }
            )
    package = _in_package(mutants[0]["path"])[0] if mutants else "?"
    return {"package": package, "partial": True, "mutants": mutants}


def _in_package(path: str | Path) -> tuple[str, str]:
    """`operator/specdecode/experiment/spec/engine.py` -> ("experiment", "spec/engine.py")."""
    parts = Path(path).parts
    at = parts.index("specdecode")
    return parts[at + 1], "/".join(parts[at + 2 :])


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    package = run["package"]
    sources: dict[str, str] = {}
    for m in run["mutants"]:
        module = REPO / "operator" / "specdecode" / package / m["module"]
        source = sources.setdefault(m["module"], module.read_text())
        if m["outcome"] == "survived" and in_signature_annotation(source, m["line"], m["diff"] or ""):
            m["outcome"] = "equivalent:annotation"
    counts: dict[str, int] = {}
    for m in run["mutants"]:
        counts[m["outcome"]] = counts.get(m["outcome"], 0) + 1
    caught = counts.get("killed", 0) + counts.get("timeout", 0)
    judged = caught + counts.get("survived", 0)
    low, high = wilson(caught, judged)
    return {
        "package": package,
        "done": len(run["mutants"]),
        "counts": counts,
        "score_non_equivalent": caught / judged if judged else None,
        "wilson95": [round(low, 3), round(high, 3)],
        "survivors": [
            f"{m['module']}:{m['line']} "
            + " / ".join(
                line[1:].strip()
                for line in (m["diff"] or "").splitlines()
                if line[:1] in "+-" and line[:3] not in ("+++", "---")
            )
            for m in run["mutants"]
            if m["outcome"] == "survived"
        ],
    }


def main(paths: list[str]) -> int:
    for arg in paths:
        path = Path(arg)
        run = from_session(path) if path.suffix == ".sqlite" else json.loads(path.read_text())
        print(json.dumps(summarise(run), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
