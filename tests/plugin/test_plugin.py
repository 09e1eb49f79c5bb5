"""`kubectl specdecode`'s rendering, pure (the commands against a real cluster: tests/e2e/test_kubectl_plugin.py)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from specdecode import plugin

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def experiment(name: str, status: dict[str, Any], namespace: str = "llm") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-12-01T11:15:00Z"},
        "status": status,
    }


def stage(name: str, estimate: float | None, verdict: str, **extra: Any) -> dict[str, Any]:
    speedup = {"metric": "tpot", "estimate": estimate, "ciLow": 1.1, "ciHigh": 1.3} if estimate else None
    return {"name": name, "speedup": speedup, "verdict": verdict, **extra}


DONE = experiment(
    "qwen",
    {
        "phase": "Completed",
        "verdict": "Reject",
        "reason": "StagesFailed",
        "message": "speculation helps up to c4",
        "stages": [
            stage(
                "c4", 1.21, "Pass", load="concurrency 4", control={"requests": 80}, treatment={"requests": 80}
            ),
            stage("c64", 0.93, "Fail"),
        ],
        "resultsRef": {"configMap": "qwen-report"},
    },
)


def test_the_table_shows_phase_verdict_and_each_stage_s_speed_up() -> None:
    running = experiment("llama", {"phase": "Running", "reason": "LoadStarted"})
    lines = plugin.table([DONE, running], now=NOW).splitlines()
    assert lines[0].split() == [
        "NAME",
        "PHASE",
        "VERDICT",
        "REASON",
        "STAGES",
        "(SPEED-UP,",
        "VERDICT)",
        "AGE",
    ]
    assert lines[1].split() == [
        "qwen",
        "Completed",
        "Reject",
        "StagesFailed",
        "c4",
        "1.21x",
        "Pass,",
        "c64",
        "0.93x",
        "Fail",
        "45m",
    ]
    assert lines[2].split() == ["llama", "Running", "-", "LoadStarted", "-", "45m"]
    # Columns line up, as kubectl's own tables do.
    assert lines[1].index("Completed") == lines[0].index("PHASE") == lines[2].index("Running")


def test_all_namespaces_adds_a_namespace_column() -> None:
    lines = plugin.table([DONE], namespaces=True, now=NOW).splitlines()
    assert lines[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert lines[1].split()[:2] == ["llm", "qwen"]


def test_a_stage_without_an_estimate_shows_n_a() -> None:
    failed = experiment(
        "x", {"phase": "Failed", "reason": "Aborted", "stages": [stage("c1", None, "Inconclusive")]}
    )
    assert plugin.stage_speedups(plugin._status(failed)) == "c1 n/a Inconclusive"


def test_describe_names_how_the_arms_pods_differed() -> None:
    differed = experiment(
        "x",
        {"phase": "Running", "armDifferences": [{"field": "env.EXTRA", "treatment": "1"}]},
    )
    assert (
        "Arms differ: env.EXTRA: absent (control) vs 1 (treatment)" in plugin.describe(differed).splitlines()
    )
    assert "Arms differ" not in plugin.describe(DONE)


def test_describe_shows_the_stages_and_how_to_get_the_report() -> None:
    text = plugin.describe(DONE)
    lines = text.splitlines()
    assert "Phase:       Completed" in lines and "Verdict:     Reject" in lines
    assert lines[lines.index("Stages:") + 1].split() == [
        "STAGE",
        "LOAD",
        "SPEED-UP",
        "95%",
        "CI",
        "REQUESTS",
        "C/T",
        "VERDICT",
    ]
    assert lines[lines.index("Stages:") + 2].split() == [
        "c4",
        "concurrency",
        "4",
        "1.21x",
        "[1.10,",
        "1.30]",
        "80/80",
        "Pass",
    ]
    assert "Report:      ConfigMap qwen-report (kubectl specdecode report qwen -n llm)" in lines


def test_the_console_script_is_declared_for_kubectl_s_plugin_discovery() -> None:
    from importlib import metadata

    scripts = {e.name: e.value for e in metadata.entry_points(group="console_scripts")}
    assert scripts["kubectl-specdecode"] == "specdecode.plugin:main"


def test_kubectl_s_flags_are_taken_before_or_after_the_command() -> None:
    parser = plugin.build_parser()
    before = parser.parse_args(["-n", "llm", "--context", "prod", "get", "qwen"])
    after = parser.parse_args(["get", "qwen", "-n", "llm", "--context", "prod"])
    for args in (before, after):
        assert (args.namespace, args.context, args.kubeconfig, args.name) == ("llm", "prod", None, "qwen")


def test_abort_annotates_the_generation_it_read_through_kubectl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stand-in kubectl records its argv (the real one: tests/e2e/test_kubectl_plugin.py)."""
    calls = tmp_path / "calls.jsonl"
    running = experiment("exp", {"phase": "Running", "observedGeneration": 3})
    running["metadata"]["generation"] = 3
    fake = tmp_path / "kubectl"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"print({json.dumps(running)!r} if 'get' in sys.argv else 'annotated')\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("KUBECTL", str(fake))
    assert plugin.main(["abort", "exp", "-n", "llm", "--context", "prod"]) == 0
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    flags = ["--context=prod", "-n", "llm"]
    assert argvs == [
        [*flags, "get", plugin.RESOURCE, "exp", "-o", "json"],
        [*flags, "annotate", plugin.RESOURCE, "exp", "specdecode.io/abort=3", "--overwrite"],
    ]
    assert "abort requested (generation 3)" in capsys.readouterr().out


def test_describe_shows_the_draft_s_memory_cost_and_each_stage_s_gpus() -> None:
    gpu = {"gpus": 1, "utilizationMean": 71.5, "memoryUsedMeanMib": 129393, "memoryUsedMaxMib": 129393}
    measured = experiment(
        "qwen",
        {
            "phase": "Completed",
            "stages": [stage("c1", 1.2, "Pass", gpu={"source": "dcgm-exporter", "control": gpu})],
            "environment": {
                "arms": {"control": {"kvCacheTokens": 500000}, "treatment": {"kvCacheTokens": 464992}}
            },
        },
    )
    lines = plugin.describe(measured).splitlines()
    assert "  memory: the draft takes 7% of the KV cache (464,992 of 500,000 tokens)" in lines
    assert "  gpu c1: control util 72%, memory 129,393 MiB (max 129,393), –; treatment no series" in lines
    absent = experiment(
        "qwen", {"phase": "Completed", "stages": [stage("c1", 1.2, "Pass", gpu={"source": "absent"})]}
    )
    assert (
        "  gpu: no DCGM metrics for the arms' pods (Prometheus holds no dcgm-exporter series for them)"
        in plugin.describe(absent).splitlines()
    )


def test_watch_reports_a_stage_once_every_load_pod_stored_its_shard_of_it(tmp_path: Path) -> None:
    """`workload.loadPods: 2`: each pod's bundle (`<name>-results-pod<k>-<i>`), merged; a stage is
    measured when both pods finished it."""
    from specdecode import results
    from specdecode.experiment import records

    def bundle(pod: int, stages: list[str]) -> list[dict[str, Any]]:
        recs = [
            records.RequestRecord(stage=stage, index=i, arm=arm, sent=1.0, end=2.0)
            for stage in stages
            for i in range(pod, 6, 2)
            for arm in ("control", "treatment")
        ]
        windows = [records.StageWindow(stage=stage, start=1.0, end=3.0) for stage in stages]
        files = {
            "requests.jsonl": "".join(r.model_dump_json() + "\n" for r in recs),
            "windows.json": json.dumps(
                {"anchor": {"monotonic": 0, "wall": 0}, "windows": [w.model_dump() for w in windows]}
            ),
        }
        return results.build_config_maps(
            "exp-results", "exp", results.pack(files), generation=1, pod=(pod, 2)
        )

    def watch(*maps: dict[str, Any]) -> list[str]:
        listing = tmp_path / "list.json"
        listing.write_text(json.dumps({"items": list(maps)}))
        kubectl = tmp_path / "kubectl"
        kubectl.write_text(f"#!/bin/sh\ncat {listing}\n")
        kubectl.chmod(0o755)
        obj = {
            "metadata": {"name": "exp", "generation": 1},
            "spec": {"workload": {"loadPods": 2, "stages": [{"name": "low"}, {"name": "c16"}]}},
        }
        return plugin._finished_stages(plugin.Kubectl(str(kubectl)), obj, set())

    assert watch(*bundle(0, ["low", "c16"])) == []  # pod 1 stored nothing yet
    (line,) = watch(*bundle(0, ["low", "c16"]), *bundle(1, ["low"]))
    assert line.startswith("stage low measured: 6 pairs in 2.0 s"), line
    assert len(watch(*bundle(0, ["low", "c16"]), *bundle(1, ["low", "c16"]))) == 2
