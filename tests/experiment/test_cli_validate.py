from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from specdecode import cli
from specdecode.experiment import documents
from tests.factories import EXAMPLES, experiment_document


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["validate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_valid_files_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *map(str, EXAMPLES))
    assert code == 0 and err == ""
    assert out.count(": valid") == len(EXAMPLES)
    noise_floor = next(
        line for line in out.splitlines() if line.startswith(str(EXAMPLES[0].parent / "noise-floor"))
    )
    assert noise_floor.endswith(
        "valid (analysis.mode NoiseFloor: an A/A run; spec.speculative is validated, not used)"
    )


def test_invalid_file_exits_two_with_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = experiment_document(
        speculative={
            "method": "ngram",
            "numSpeculativeTokens": 3,
            "promptLookupMin": 4,
            "promptLookupMax": 2,
        },
        analysis={"confidence": 2},
    )
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    code, _, err = run(capsys, str(path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{path}: spec.analysis.confidence:")
    assert lines[1].startswith(f"{path}: spec.speculative.promptLookupMin:")


def test_multi_document_files_name_the_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = experiment_document(), experiment_document(cleanup="Sometimes")
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([good, bad]))
    code, out, err = run(capsys, str(path))
    assert code == 2
    assert f"{path}[1]: spec.cleanup:" in err
    assert "exp: valid" in out


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("a: [\n", "not valid YAML (line 2, column 1)"),
        ("", "holds no document"),
        ("- just\n- a list\n", "expected a mapping"),
        (b"\xff\xfe\x00garbage", "cannot read"),
    ],
)
def test_garbled_files_get_one_line_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes, fragment: str
) -> None:
    path = tmp_path / "garbled.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    code, _, err = run(capsys, str(path))
    assert code == 2
    assert fragment in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def _alias_bomb(levels: int = 9) -> str:
    """The billion laughs: each anchor lists the previous one 9 times (9**levels values)."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (_alias_bomb(), "expands to more than 100000 values (line 6), aliases followed"),
        ("spec: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels deep (line 1)"),
        ("spec:\n  seed: " + "7" * 5000 + "\n", "a value cannot be read: Exceeds the limit (4300 digits)"),
        ("spec: &s {engine: *s}\n", "an alias refers to its own anchor"),
    ],
    ids=["alias-bomb", "deep-nesting", "5000-digit-integer", "recursive-alias"],
)
def test_hostile_yaml_is_refused_in_one_line_without_building_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, fragment: str
) -> None:
    """On main: the bomb took 2.9 GB in 30 s (as its values were walked), the nesting and the
    integer were tracebacks."""
    path = tmp_path / "hostile.yaml"
    path.write_text(content)
    code, _, err = run(capsys, str(path))
    assert (code, err.strip()) == (2, err.strip().splitlines()[0])
    assert err.startswith(f"{path}: ") and fragment in err and "Traceback" not in err


def test_a_file_larger_than_the_api_server_takes_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("# " + "x" * (3 * 1024 * 1024) + "\n")
    code, _, err = run(capsys, str(path))
    assert code == 2
    assert "bytes, more than an experiment file may hold (3145728 bytes" in err


def test_anchors_and_aliases_of_a_legitimate_file_still_work() -> None:
    parsed = documents.parse_documents("a: &x {b: 1}\nc: *x\nd: [*x, *x]\n", "f")
    assert parsed == [{"a": {"b": 1}, "c": {"b": 1}, "d": [{"b": 1}, {"b": 1}]}]


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "/nonexistent/exp.yaml")
    assert code == 2 and err.strip() == "/nonexistent/exp.yaml: no such file"


def test_validate_reads_standard_input_given_a_dash(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(experiment_document())))
    code, out, err = run(capsys, "-")
    assert (code, err) == (0, "")
    assert out == f"<stdin>: {experiment_document()['metadata']['name']}: valid\n"


def test_invalid_standard_input_names_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("kind: [unclosed\n"))
    code, _, err = run(capsys, "-")
    assert code == 2
    assert err.startswith("<stdin>: not valid YAML")


def test_a_kustomize_output_with_a_config_map_skips_it_and_validates_the_experiment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prompts"}, "data": {}}
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all([config_map, experiment_document()]))
    code, out, err = run(capsys, str(path))
    assert (code, err) == (0, "")
    name = experiment_document()["metadata"]["name"]
    assert out.splitlines() == [
        f"{path}: {name}: valid",
        f"{path}[0]: ConfigMap prompts: skipped (not a SpecDecodeExperiment)",
    ]


def test_an_experiment_with_a_mistyped_kind_is_still_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = experiment_document()
    document["kind"] = "SpecDecodeExperment"
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(document))
    code, _, err = run(capsys, str(path))
    assert code == 2
    assert "kind: must be 'SpecDecodeExperiment'" in err
