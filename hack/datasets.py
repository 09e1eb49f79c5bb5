"""Build the real-text builtin datasets (operator/specdecode/loadgen/data/*.jsonl) from their sources.

Issue 17 ("real datasets, shipped"): small samples of public datasets under licences that allow
shipping them inside this Apache-2.0 package, so per-category results mean something without a hub
download at run time. The sources are git checkouts (bare git directories are enough: the files are
read with `git show <commit>:<path>`); the output is deterministic in the commits and `SEED`.

    python hack/datasets.py \\
        --human-eval   <git dir of github.com/openai/human-eval> \\
        --gsm8k        <git dir of github.com/openai/grade-school-math> \\
        --self-instruct <git dir of github.com/yizhongw/self-instruct> \\
        --peps         <git dir of github.com/python/peps>

Each source's commit is printed; operator/specdecode/loadgen/data/LICENSES.md records them, the
licences and how each sample is drawn (keep it in step when re-running on other commits).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import subprocess
from pathlib import Path
from typing import Any

SEED = 17
OUT = Path(__file__).resolve().parent.parent / "operator" / "specdecode" / "loadgen" / "data"

GSM8K_SAMPLE = 200
PEPS_SAMPLE = 150
REAL_MIXED_PER_CATEGORY = 40
PEP_MIN_CHARS, PEP_MAX_CHARS = 1200, 2600

#: self-instruct user-oriented tasks motivated by programming or maths apps: left out of real-mixed's
#: chat slice so that its chat category is conversation, not code or maths in disguise.
NOT_CHAT_APPS = {
    "Leetcode",
    "StackOverflow",
    "GeeksforGeeks",
    "Github",
    "w3schools",
    "Wolfram alpha",
    "(Wolfram alpha)?",
    "Socratic by Google",
    "MS Excel",
    "Google Sheet",
    "Google Sheets",
    "Overleaf",
    "Markdown",
    "https://abcnotation.com/",
    "Sudoku",
}


def git_show(git_dir: Path, commit: str, path: str) -> bytes:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], check=True, capture_output=True
    ).stdout


def git_head(git_dir: Path) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def git_ls(git_dir: Path, commit: str, under: str) -> list[str]:
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "ls-tree", "-r", "--name-only", commit, under],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.splitlines()


def chat(item_id: str, category: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"id": item_id, "category": category, "messages": [{"role": "user", "content": content}], **extra}


def humaneval(git_dir: Path, commit: str) -> list[dict[str, Any]]:
    """All 164 problems: the function signature and docstring, to be completed."""
    lines = gzip.decompress(git_show(git_dir, commit, "data/HumanEval.jsonl.gz")).decode().splitlines()
    items = []
    for line in lines:
        obj = json.loads(line)
        content = f"Complete the following Python function.\n\n```python\n{obj['prompt']}```"
        items.append(chat(obj["task_id"], "code", content))
    return items


def gsm8k(git_dir: Path, commit: str) -> list[dict[str, Any]]:
    """GSM8K_SAMPLE questions of the test split, drawn without replacement by SEED, in file order."""
    lines = git_show(git_dir, commit, "grade_school_math/data/test.jsonl").decode().splitlines()
    picked = sorted(random.Random(f"{SEED}:gsm8k").sample(range(len(lines)), GSM8K_SAMPLE))
    return [chat(f"gsm8k/test/{n}", "math", json.loads(lines[n])["question"]) for n in picked]


def self_instruct(git_dir: Path, commit: str) -> list[dict[str, Any]]:
    """All 252 user-oriented instructions (written by the authors), with their one instance's input."""
    text = git_show(git_dir, commit, "human_eval/user_oriented_instructions.jsonl").decode()
    items = []
    for line in text.splitlines():
        obj = json.loads(line)
        given = obj["instances"][0]["input"].strip()
        content = obj["instruction"].strip() + (f"\n\n{given}" if given else "")
        items.append(chat(obj["id"], "chat", content, app=obj["motivation_app"]))
    return items


_ROLE = re.compile(r":(\w+):`([^`<]*?)\s*(?:<[^>]*>)?`")
_SKIP_SECTIONS = {"references", "copyright", "footnotes", "acknowledgements", "acknowledgments"}


def _pep_role(m: re.Match[str]) -> str:
    role, text = m.group(1), m.group(2).strip()
    if role == "pep" and text.isdigit():
        return f"PEP {text}"
    if role == "rfc" and text.isdigit():
        return f"RFC {text}"
    return text


def _sections(rst: str) -> list[tuple[str, str]]:
    """The top-level sections (title underlined with '=') of a PEP, after its header."""
    lines = rst.splitlines()
    heads = [
        i
        for i in range(1, len(lines))
        if lines[i] and set(lines[i]) == {"="} and lines[i - 1].strip() and len(lines[i]) >= len(lines[i - 1])
    ]
    out = []
    for n, i in enumerate(heads):
        end = heads[n + 1] - 1 if n + 1 < len(heads) else len(lines)
        out.append((lines[i - 1].strip(), "\n".join(lines[i + 1 : end]).strip()))
    return out


def pep_passage(rst: str) -> str | None:
    """Abstract and the sections after it, whole paragraphs, PEP_MIN_CHARS to PEP_MAX_CHARS long."""
    sections = _sections(rst)
    titles = [t.lower() for t, _ in sections]
    if "abstract" not in titles:
        return None
    # The whole PEP in the public domain: "This document has been placed in the public domain." or
    # "... or under the CC0-1.0-Universal license, whichever is more permissive." (not, say, a PEP that
    # quotes text under another licence and places only "the rest" in the public domain).
    copyright_ = next((body for t, body in sections if t.lower() == "copyright"), "")
    if not re.match(
        r"This document (has been|is) placed in(to)? the public domain", copyright_, re.IGNORECASE
    ):
        return None
    passage = ""
    for title, body in sections[titles.index("abstract") :]:
        if title.lower() in _SKIP_SECTIONS:
            break
        for para in [title, *re.split(r"\n\s*\n", body)]:
            para = _ROLE.sub(_pep_role, para.strip())
            if not para or para.startswith(".. "):
                continue
            if len(passage) + len(para) + 2 > PEP_MAX_CHARS:
                return passage if len(passage) >= PEP_MIN_CHARS else None
            passage = f"{passage}\n\n{para}" if passage else para
    return passage if len(passage) >= PEP_MIN_CHARS else None


def peps(git_dir: Path, commit: str) -> list[dict[str, Any]]:
    """PEPS_SAMPLE public-domain PEPs with an Abstract, drawn by SEED; the passage to summarise."""
    eligible = []
    for path in sorted(p for p in git_ls(git_dir, commit, "peps") if re.fullmatch(r"peps/pep-\d{4}\.rst", p)):
        rst = git_show(git_dir, commit, path).decode()
        passage = pep_passage(rst)
        title = re.search(r"^Title: (.+)$", rst, re.MULTILINE)
        if passage is not None and title is not None:
            eligible.append((int(path[9:13]), title.group(1).strip(), passage))
    picked = sorted(random.Random(f"{SEED}:peps").sample(eligible, PEPS_SAMPLE))
    print(f"peps: {len(eligible)} eligible, {len(picked)} picked")
    return [
        chat(
            f"pep-{number:04d}",
            "summarisation",
            f"Summarise the following excerpt of PEP {number} ({title}) in a short paragraph.\n\n{passage}",
        )
        for number, title, passage in picked
    ]


def real_mixed(sets: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """REAL_MIXED_PER_CATEGORY items from each of the four sets (chat: no programming or maths app)."""
    rng = random.Random(f"{SEED}:real-mixed")
    out = []
    for name in ("self-instruct", "humaneval", "gsm8k", "peps"):
        pool = sets[name]
        if name == "self-instruct":
            pool = [i for i in pool if i["app"] not in NOT_CHAT_APPS]
        out += sorted(rng.sample(pool, REAL_MIXED_PER_CATEGORY), key=lambda i: pool.index(i))
    return out


def write(name: str, items: list[dict[str, Any]]) -> None:
    path = OUT / f"{name}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(
        f"{path.relative_to(OUT.parent.parent.parent.parent)}: {len(items)} items, {path.stat().st_size} bytes"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--human-eval", "--gsm8k", "--self-instruct", "--peps"):
        p.add_argument(flag, type=Path, required=True, help="git directory of the source repository")
    args = p.parse_args()
    builders = {
        "humaneval": (args.human_eval, humaneval),
        "gsm8k": (args.gsm8k, gsm8k),
        "self-instruct": (args.self_instruct, self_instruct),
        "peps": (args.peps, peps),
    }
    sets = {}
    for name, (git_dir, build) in builders.items():
        commit = git_head(git_dir)
        print(f"{name}: {git_dir} at {commit}")
        sets[name] = build(git_dir, commit)
    for name, items in sets.items():
        write(name, items)
    write("real-mixed", real_mixed(sets))


if __name__ == "__main__":
    main()
