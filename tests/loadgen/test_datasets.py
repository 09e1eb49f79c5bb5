"""The built-in datasets (issue 17, real datasets shipped): each loads with its stated categories and
counts, its prompts are real and unique, LICENSES.md says what the files hold, and the wheel (the image's
install) carries them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import typing
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from specdecode.experiment import spec, validation
from specdecode.loadgen import plan, workload
from tests.chart.test_dockerfile import copy_build_context
from tests.factories import ROOT, experiment_document

DATA = ROOT / "operator" / "specdecode" / "loadgen" / "data"

#: What the spec's `name` docstring and LICENSES.md promise, per builtin: items per category.
STATED = {
    "mixed": {"chat": 12, "code": 12, "math": 12, "summarisation": 10},
    "real-mixed": {"chat": 40, "code": 40, "math": 40, "summarisation": 40},
    "humaneval": {"code": 164},
    "gsm8k": {"math": 200},
    "self-instruct": {"chat": 252},
    "peps": {"summarisation": 150},
}
REAL = ("humaneval", "gsm8k", "self-instruct", "peps")


#: the built-in conversations of multi-turn sessions (tests/loadgen/test_sessions.py reads them), items each
CONVERSATIONS = {"conversations": 16}


def test_every_builtin_name_the_spec_accepts_is_stated_here_and_shipped() -> None:
    names = typing.get_args(spec.BuiltinDataset.model_fields["name"].annotation)
    assert set(names) == set(STATED)
    [sessions] = [
        typing.get_args(t)
        for t in typing.get_args(spec.MultiTurnDataset.model_fields["builtin"].annotation)
        if typing.get_origin(t) is typing.Literal
    ]
    assert set(sessions) == set(CONVERSATIONS)
    assert {p.stem for p in DATA.glob("*.jsonl")} == set(STATED) | set(CONVERSATIONS)


@pytest.mark.parametrize("name", sorted(STATED))
def test_each_builtin_loads_with_its_stated_categories_and_counts(name: str) -> None:
    items = workload.builtin(name)
    assert Counter(i.category for i in items) == STATED[name]
    assert len({i.id for i in items}) == len(items)
    for item in items:
        # one user message of real text (sent to /v1/chat/completions), no empty or whitespace prompt
        assert item.prompt is None and item.messages is not None
        [message] = item.messages
        assert message["role"] == "user"
        assert len(message["content"].strip()) >= 20, item.id
    assert len({m["content"] for i in items for m in i.messages or ()}) == len(items)
    assert workload.builtin(name) == items


def test_real_mixed_holds_unchanged_lines_of_the_four_real_sets() -> None:
    lines = {
        json.loads(line)["id"]: line
        for name in REAL
        for line in (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    }
    mixed = (DATA / "real-mixed.jsonl").read_text(encoding="utf-8").splitlines()
    assert all(lines[json.loads(line)["id"]] == line for line in mixed)
    # its chat slice is conversation: no instruction motivated by a programming or maths app
    apps = {json.loads(line).get("app") for line in mixed if json.loads(line)["category"] == "chat"}
    assert not apps & {"Leetcode", "StackOverflow", "GeeksforGeeks", "Github", "Wolfram alpha"}


def test_the_sources_prompts_are_the_real_text() -> None:
    humaneval = {i.id: i for i in workload.builtin("humaneval")}
    first = (humaneval["HumanEval/0"].messages or ())[0]["content"]
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in first
    gsm8k = workload.builtin("gsm8k")
    assert all(i.id.startswith("gsm8k/test/") for i in gsm8k)
    peps = workload.builtin("peps")
    assert all(re.fullmatch(r"pep-\d{4}", i.id) for i in peps)
    assert all("Abstract" in (i.messages or ())[0]["content"] for i in peps)


def test_licenses_md_states_each_builtin_with_its_count_and_licence() -> None:
    text = (DATA / "LICENSES.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([\w-]+)` \| (\d+) \|", text, re.MULTILINE))
    assert {name: int(n) for name, n in rows.items()} == {
        **{name: sum(STATED[name].values()) for name in ("real-mixed", *REAL)},
        **CONVERSATIONS,
    }
    assert {
        name: len((DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()) for name in CONVERSATIONS
    } == CONVERSATIONS
    for licence in ("MIT License", "Apache License, Version 2.0", "public domain"):
        assert licence in text


@pytest.mark.parametrize("name", ["real-mixed", "gsm8k"])
def test_a_real_builtin_plans_the_same_bodies_for_the_same_salt_with_warm_up_prompts_set_apart(
    name: str,
) -> None:
    s = spec.ExperimentSpec.model_validate(
        {
            "model": "m",
            "speculative": {"method": "ngram", "numSpeculativeTokens": 3},
            "workload": {
                "dataset": {"type": "builtin", "name": name},
                "stages": [{"name": "a", "concurrency": 4}],
                "requestsPerStage": 40,
                "warmupRequests": 8,
            },
        }
    )
    p = plan.plan_from_spec(s, Path(), salt="x")
    warm = {r.prompt_id for sp in p.stages if sp.warmup for r in sp.requests}
    measured = {r.prompt_id for sp in p.stages if not sp.warmup for r in sp.requests}
    assert len(warm) == 8 and warm.isdisjoint(measured)
    again = plan.plan_from_spec(s, Path(), salt="x")
    assert [r.body for sp in again.stages for r in sp.requests] == [
        r.body for sp in p.stages for r in sp.requests
    ]


def test_an_unknown_builtin_name_is_refused_naming_the_field_and_the_choices() -> None:
    document = experiment_document(
        workload={
            "dataset": {"type": "builtin", "name": "gsm8"},
            "stages": [{"name": "c1", "concurrency": 1}],
        }
    )
    assert [str(p) for p in validation.check_document(document)] == [
        "spec.workload.dataset.name: must be 'mixed', 'real-mixed', 'humaneval', 'gsm8k', 'self-instruct'"
        " or 'peps' (got 'gsm8')"
    ]


def test_the_wheel_built_from_the_image_build_context_carries_the_datasets_and_their_licences(
    tmp_path: Path,
) -> None:
    src = copy_build_context(tmp_path / "src")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-cache-dir"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), "."], cwd=src, check=True)
    [wheel] = wheels.glob("specdecode_operator-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if n.startswith("specdecode/loadgen/data/")}
        assert shipped == {f"specdecode/loadgen/data/{name}.jsonl" for name in (*STATED, *CONVERSATIONS)} | {
            "specdecode/loadgen/data/LICENSES.md"
        }
        assert zf.read("specdecode/loadgen/data/peps.jsonl") == (DATA / "peps.jsonl").read_bytes()
