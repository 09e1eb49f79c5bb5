"""`specdecode run --local` end to end on the simulator: real processes, real sockets, real verdicts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from specdecode import cli
from tests.factories import SHORT_STAGE_GUARDRAILS, experiment_document
from tests.local.conftest import running, wait_for_measured


def write_experiment(
    tmp_path: Path,
    *,
    simulator: dict[str, Any],
    stages: list[dict[str, Any]] | None = None,
    requests: int = 60,
    **analysis: Any,
) -> Path:
    document = experiment_document(
        model="sim/llama-8b",
        engine={"simulator": simulator},
        speculative={"method": "draft_model", "model": "sim/draft", "numSpeculativeTokens": 4},
        workload={
            "dataset": {"type": "synthetic", "inputTokens": 64, "outputTokens": 64},
            "sampling": {"maxTokens": 64},
            "stages": stages or [{"name": "c4", "concurrency": 4}],
            "requestsPerStage": requests,
            "warmupRequests": 2,
        },
        # TTFT is not what these tests are about (the simulator's TTFT is fitted separately), nor
        # (but where a test sets `guardrails`) the error and output-match limits: 60 pairs show these.
        analysis={
            "minSpeedup": 1.05,
            "guardrails": {"maxTtftRegression": None, **SHORT_STAGE_GUARDRAILS},
            **analysis,
        },
        deadlines={"deploy": "1m", "run": "5m"},
    )
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run(path: Path, out: Path, *extra: str) -> int:
    return cli.main(["run", str(path), "--local", "--out", str(out), "--quiet", *extra])


def result(out: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((out / "result.json").read_text())
    return loaded


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """type -> (status, reason) of result.json's conditions, the ones a pipeline gates on in-cluster."""
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_cheap_draft_at_low_load_is_promoted(tmp_path: Path) -> None:
    """At the default errorRate and outputMatch limits, shown by the default 300 requests (299 needed)."""
    path = write_experiment(
        tmp_path,
        simulator={"profile": "h200-8b-draft-tiny"},
        requests=300,
        guardrails={"maxTtftRegression": None},
    )
    out = tmp_path / "out"
    assert run(path, out, "--fail-on-reject") == 0
    status = result(out)
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", status["message"]
    # The same conditions as the resource's: a pipeline gates on Promoted locally too.
    assert conditions(status) == {
        "Ready": ("True", "Promote"),
        "Reconciling": ("False", "Finished"),
        "Stalled": ("False", "NotStalled"),
        "Completed": ("True", "Promote"),
        "Promoted": ("True", "Promote"),
    }
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])
    stage = status["stages"][0]
    assert stage["speedup"]["ciLow"] >= 1.05
    assert stage["outputMatch"] == 1.0
    assert stage["control"]["requests"] >= 299  # the guardrails hold it until they are shown
    guards = {g["name"]: g["outcome"] for g in stage["guardrails"]}
    assert (guards["errorRate"], guards["outputMatch"]) == ("Holds", "Holds")
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    lines = (out / "requests.jsonl").read_text().splitlines()
    arms = {json.loads(line)["arm"] for line in lines}
    assert arms == {"control", "treatment"}
    # The KV cache each arm reports in `vllm:cache_config_info`: the tiny draft takes 7% of it.
    env = status["environment"]["arms"]
    assert env["control"]["kvCacheTokens"] == 500_000
    assert env["treatment"]["kvCacheTokens"] == 464_992  # 465,000 tokens -> 29,062 blocks of 16
    # 64 + 64 tokens a request: 8 blocks each.
    assert (env["control"]["maxConcurrency"], env["treatment"]["maxConcurrency"]) == (3906, 3632)


def test_a_release_without_per_request_metrics_takes_acceptance_from_the_counters(tmp_path: Path) -> None:
    """vLLM 0.20 has no --per-request-spec-decode-metrics: not rendered, and the counters measure acceptance."""
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=40)
    document = yaml.safe_load(path.read_text())
    document["spec"]["engine"]["vllmVersion"] = "0.20.0"
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    assert run(path, out) == 0
    status = result(out)
    assert status["environment"]["vllmRules"] == "0.20.0 (spec.engine.vllmVersion)"
    acceptance = status["stages"][0]["acceptance"]
    assert acceptance["source"] == "prometheus" and "perRequest" not in acceptance["sources"]
    assert 0.4 < acceptance["rate"] < 0.8


def test_confirm_reruns_the_stages_with_the_recommended_schedule_and_confirms_it(tmp_path: Path) -> None:
    # A draft that pays clearly at c1 (about 1.35x) and a compute-bound slope that makes its verification
    # lose clearly at c64 (about 0.87x [0.86, 0.88]): margins a loaded machine's timing noise does not
    # cross (the profile's own draft, 1.13x [1.06, 1.21] at c1 against minSpeedup 1.05, failed under load).
    path = write_experiment(
        tmp_path,
        simulator={"profile": "h200-8b-draft-tiny", "acceptanceRate": 0.9, "batchTokenMs": 0.1},
        # c64 in four waves: one wave (64 requests) is one sampling unit, which has no interval
        stages=[{"name": "c1", "concurrency": 1}, {"name": "c64", "concurrency": 64, "requests": 256}],
        requests=64,
        requireStages="any",
        confirm=True,
    )
    out = tmp_path / "out"
    assert run(path, out) == 0
    status = result(out)
    assert [s["verdict"] for s in status["stages"]] == ["Pass", "Fail"], status["message"]
    rec = status["recommendation"]
    assert rec["numSpeculativeTokensPerBatchSize"] == [[1, 1, 4], [2, 4096, 0]]
    assert rec["confirmed"] is True and rec["confirmationReason"] == "Confirmed", rec
    rounds = {c["name"]: c for c in rec["confirmation"]}
    assert (rounds["c1"]["k"], rounds["c1"]["verdict"]) == (4, "Pass")
    # the schedule turns speculation off at c64: the treatment is the control's equal there
    c64 = rounds["c64"]
    assert (c64["k"], c64["threshold"]) == (0, 0.98)
    assert 0.9 <= c64["speedup"]["estimate"] <= 1.1
    # the restarted treatment honoured the schedule (drafts at c1, almost none at c64), on the same prompts

    def plan(directory: Path) -> Any:
        return json.loads((directory / "loadgen-summary.json").read_text())["plan"]

    assert plan(out / "confirmation") == plan(out)  # same seed, salt and stages: the same prompts
    second = [json.loads(line) for line in (out / "confirmation" / "requests.jsonl").read_text().splitlines()]

    def drafted(stage: str) -> float:
        mine = [r for r in second if r["stage"] == stage and r["arm"] == "treatment" and r["ok"]]
        return sum(r["spec_decode"]["num_draft_tokens"] for r in mine) / sum(
            r["completion_tokens"] for r in mine
        )

    assert drafted("c1") > 0.5 and drafted("c64") < 0.05


def test_an_expensive_draft_is_rejected_and_fail_on_reject_exits_one(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-1b"})
    out = tmp_path / "out"
    assert run(path, out, "--fail-on-reject") == 1
    status = result(out)
    assert status["verdict"] == "Reject", status["message"]
    assert conditions(status)["Completed"] == ("True", "Reject")
    assert conditions(status)["Promoted"] == ("False", "Reject")
    assert status["stages"][0]["speedup"]["ciHigh"] < 1.05
    # Why it lost: the acceptance that would have paid at this load, above the one measured (#18).
    breakeven = status["stages"][0]["breakEven"]
    assert breakeven["acceptanceRate"] > breakeven["measuredRate"]
    assert "<b>break-even</b>: at c4 " in (out / "report.html").read_text()


def test_a_treatment_whose_vllm_weakens_speculation_says_so(tmp_path: Path) -> None:
    """The simulator logs vLLM's own line; the run finds it in the treatment's log (#18)."""
    path = write_experiment(
        tmp_path,
        simulator={"profile": "h200-8b-draft-tiny", "logDegradations": ["AsyncSchedulingDisabled"]},
        requests=40,
    )
    out = tmp_path / "out"
    assert run(path, out) == 0
    status = result(out)
    assert status["degradations"] == [
        {
            "kind": "AsyncSchedulingDisabled",
            "message": "Async scheduling not supported with ngram-based speculative decoding and will be disabled.",
        }
    ]
    assert "ngram-based" not in (out / "logs" / "control.log").read_text()
    assert "AsyncSchedulingDisabled: Async scheduling not supported" in (out / "report.html").read_text()


def test_a_lossy_treatment_is_rejected_for_output_mismatch(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny", "outputMismatchRate": 0.5})
    out = tmp_path / "out"
    assert run(path, out) == 0
    status = result(out)
    assert status["verdict"] == "Reject"
    assert status["reason"] == "OutputMismatch"
    assert status["stages"][0]["outputMatch"] < 0.9


def test_a_noise_floor_run_measures_two_identical_servers(tmp_path: Path) -> None:
    """An A/A pre-flight on the simulator: no speculation in either arm, every request of each stage
    measured, greedy outputs of identical servers disagree at about 1 - (1 - p)^2."""
    simulator = {"profile": "h200-8b-draft-tiny", "batchVarianceRate": 0.15}
    path = write_experiment(tmp_path, simulator=simulator, requests=80, mode="NoiseFloor", minSpeedup=1.1)
    out = tmp_path / "out"
    assert run(path, out) == 0
    status = result(out)
    assert status["phase"] == "Completed" and status["verdict"] == "Inconclusive"
    assert status["reason"] == "NoiseFloor" and status["message"].startswith("noise floor (A/A)")
    stage = status["noiseFloor"]["stages"][0]
    assert stage["pairs"] == 80  # no sequential stop in an A/A run
    # Equivalent, not "the interval holds 1.0": two identical servers differ systematically by a little
    # (two simulator processes on 2 shared cores: up to ~0.4% measured; two real vLLM 0.20 servers on
    # one H200: 0.997x [0.995, 0.999] at c4), which is what the noise floor exists to measure.
    assert stage["equivalent"] is True and abs(stage["speedup"] - 1.0) < 0.01, stage
    assert stage["measurable"] is True and stage["minDetectable"] < 1.1
    assert 0.1 < stage["mismatchRate"] < 0.5  # 1 - 0.85^2 = 28% expected
    assert stage["mismatchCiLow"] < 0.28 < stage["mismatchCiHigh"]
    assert status["noiseFloor"]["suggestedBaselineMismatchRate"] >= stage["mismatchRate"]
    assert "acceptance" not in status["stages"][0]  # neither arm drafted
    page = (out / "report.html").read_text()
    assert "<h2>Noise floor (A/A)</h2>" in page and "guardrails.baselineMismatchRate: " in page


def test_invalid_files_exit_two_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "nope"})
    out = tmp_path / "out"
    assert run(path, out) == 2
    assert "spec.engine.simulator.profile: unknown profile 'nope'" in capsys.readouterr().err
    assert not (out / "logs").exists()


def test_without_local_it_says_how_to_run_on_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "x.yaml"]) == 2
    assert "kubectl apply -f x.yaml" in capsys.readouterr().err


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_arm_ends_the_run_with_exit_three_keeping_what_was_measured(tmp_path: Path) -> None:
    path = write_experiment(
        tmp_path,
        simulator={"profile": "h200-8b-draft-tiny", "decodeStepMs": 5.0},
        requests=400,
        sequential=False,
    )
    out = tmp_path / "out"
    with running(path, out) as process:
        assert wait_for_measured(out, 10) >= 10
        arms = children_of(process.pid)
        assert len(arms) == 2, arms
        treatment = next(
            pid
            for pid in arms
            if "treatment" in Path(f"/proc/{pid}/cmdline").read_text()
            or "--speculative-config" in Path(f"/proc/{pid}/cmdline").read_text()
        )
        os.kill(treatment, signal.SIGKILL)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 3, err
    status = result(out)
    assert status["phase"] == "Failed" and status["reason"] == "EngineCrashed"
    assert conditions(status)["Stalled"] == ("True", "EngineCrashed")
    assert conditions(status)["Completed"][0] == conditions(status)["Promoted"][0] == "False"
    assert "treatment arm exited" in status["message"]
    assert "verdict" not in status
    assert len((out / "requests.jsonl").read_text().splitlines()) >= 10
    for pid in arms:
        assert not alive(pid), f"process {pid} left behind"


def wait_for_window(out: Path, stage: str, *, seconds: float = 90.0) -> bool:
    """Until the load's DIR/windows.json (rewritten after each stage) names `stage`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            doc = json.loads((out / "windows.json").read_text())
            if any(w["stage"] == stage for w in doc["windows"]):
                return True
        time.sleep(0.1)
    return False


def a_short_stage_then_a_long_one(tmp_path: Path, short: int) -> Path:
    """c1 of `short` requests, then c8 of 20000 (minutes): a run to cut short after c1."""
    return write_experiment(
        tmp_path,
        simulator={"profile": "h200-8b-draft-tiny", "decodeStepMs": 3.0},
        stages=[
            {"name": "c1", "concurrency": 1, "requests": short},
            {"name": "c8", "concurrency": 8, "requests": 20000},
        ],
        sequential=False,
    )


def test_ctrl_c_after_a_stage_keeps_that_stage_in_result_json_and_the_report(tmp_path: Path) -> None:
    path = a_short_stage_then_a_long_one(tmp_path, 30)
    out = tmp_path / "out"
    with running(path, out) as process:
        assert wait_for_window(out, "c1")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    status = result(out)
    assert status["phase"] == "Failed" and status["reason"] == "Interrupted"
    assert "verdict" not in status
    assert "Ctrl-C" in status["message"] and "1 of 2 stage(s) finished before that (c1)" in status["message"]
    [stage] = status["stages"]
    assert stage["name"] == "c1"
    assert stage["speedup"]["estimate"] > 1.0 and stage["speedup"]["n"] == 30
    report = (out / "report.html").read_text()
    assert "c1" in report and "Interrupted" in report
    assert "why: no verdict: the run ended Failed (Interrupted); stage verdicts so far: c1 " in " ".join(
        err.split()
    )


def test_an_arm_killed_after_a_stage_keeps_that_stage_in_result_json(tmp_path: Path) -> None:
    """#36: the stages both arms finished before an arm crashed are kept, as on Ctrl-C."""
    path = a_short_stage_then_a_long_one(tmp_path, 30)
    out = tmp_path / "out"
    with running(path, out) as process:
        assert wait_for_window(out, "c1")
        treatment = next(
            pid
            for pid in children_of(process.pid)
            if "--speculative-config" in Path(f"/proc/{pid}/cmdline").read_text()
        )
        os.kill(treatment, signal.SIGKILL)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 3, err
    status = result(out)
    assert (status["phase"], status["reason"]) == ("Failed", "EngineCrashed"), status["message"]
    assert "verdict" not in status
    assert "the 1 of 2 stage(s) measured before that (c1) are kept" in status["message"]
    [stage] = status["stages"]
    assert stage["name"] == "c1" and stage["speedup"]["n"] == 30


def test_a_load_past_deadlines_run_fails_as_the_operator_s_keeping_the_stages_measured(
    tmp_path: Path,
) -> None:
    """`spec.deadlines.run` holds locally too: the load that overruns it is stopped, and the run ends
    Failed (exit 3) with the operator's reason and message, the stages finished before it kept."""
    path = a_short_stage_then_a_long_one(tmp_path, 20)
    document = yaml.safe_load(path.read_text())
    document["spec"]["deadlines"]["run"] = "25s"
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    started = time.monotonic()
    assert run(path, out) == 3
    assert time.monotonic() - started < 120  # not the ~20000 requests of c8
    status = result(out)
    assert status["phase"] == "Failed" and status["reason"] == "RunDeadlineExceeded", status["message"]
    assert "verdict" not in status
    assert status["message"].startswith(
        "the load did not finish within spec.deadlines.run (25s); lower requestsPerStage or raise the deadline; "
        "the 1 of 2 stage(s) measured before that (c1) are kept"
    ), status["message"]
    assert conditions(status)["Stalled"] == ("True", "RunDeadlineExceeded")
    [stage] = status["stages"]
    assert stage["name"] == "c1" and stage["speedup"]["n"] == 20


def test_the_mixed_dataset_gives_per_category_rows_and_slos_give_goodput(tmp_path: Path) -> None:
    path = write_experiment(
        tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=40, slo={"ttft": {"p90": 1000}}
    )
    document = yaml.safe_load(path.read_text())
    document["spec"]["workload"]["dataset"] = {"type": "builtin", "name": "mixed"}
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    run(path, out)
    stage = result(out)["stages"][0]
    names = {c["name"] for c in stage["categories"]}
    assert names == {"chat", "code", "math", "summarisation"}
    assert sum(c["pairs"] for c in stage["categories"]) == stage["speedup"]["n"]
    for arm in ("control", "treatment"):
        assert stage[arm]["goodput"]["requests"] == stage[arm]["requests"]
    assert "<th class=l>category</th>" in (out / "report.html").read_text()


def start_simulator_node(
    tmp_path: Path, name: str, speed_factor: float
) -> tuple[subprocess.Popen[bytes], str]:
    """One simulator on its own "node": the node's speed comes from the environment, as a node agent sets it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "specdecode.simulator",
        "sim/llama-8b",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {**os.environ, "SPECDECODE_SIM_SPEED_FACTOR": str(speed_factor)}
    with (tmp_path / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:  # servers given by URL are already up
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the {name} simulator did not come up: {(tmp_path / f'{name}.log').read_text()}")


def test_a_treatment_identical_to_the_control_on_a_faster_host_is_not_promoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35 item 3: servers given by URL on hosts that differ (the treatment's 10% faster), nothing
    to swap: the host is measured as a 1.1x speed-up, which must not be credited to speculation."""
    path = write_experiment(
        tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=60, sequential=False
    )
    # Both "nodes" serve the same engine without speculation: the only difference is the host's speed.
    control, control_url = start_simulator_node(tmp_path, "control", 1.0)
    treatment, treatment_url = start_simulator_node(tmp_path, "treatment", 0.9)
    try:
        out = tmp_path / "out"
        code = run(path, out, "--control-url", control_url, "--treatment-url", treatment_url)
    finally:
        for process in (control, treatment):
            process.terminate()
            process.wait(15)
    assert code == 0
    status = result(out)
    env = status["environment"]
    assert env["arms"]["control"]["speedFactor"] == 1.0
    assert env["arms"]["treatment"]["speedFactor"] == 0.9
    assert env["arms"]["control"]["vllmVersion"] == env["arms"]["treatment"]["vllmVersion"]
    assert env["hostDifferences"] == ["speedFactor"]
    err = capsys.readouterr().err
    assert "warning: the arms ran on different hosts (speedFactor: 1.0 (control) vs 0.9 (treatment))" in err
    assert "placement: the arms ran on different hosts" in err
    # The placement alone is measured as a 1/0.9 speed-up, which the paired interval cannot tell apart.
    stage = status["stages"][0]
    assert stage["speedup"]["estimate"] == pytest.approx(1 / 0.9, abs=0.03)
    assert stage["speedup"]["ciLow"] > 1.05, "the placement alone would have passed the stage"
    assert (status["verdict"], status["reason"]) == ("Inconclusive", "PlacementUnseparated"), status[
        "message"
    ]
    assert (stage["verdict"], stage["code"]) == ("Inconclusive", "PlacementUnseparated")
    assert status["message"].startswith(
        "not promoted: the arms ran on different hosts (speedFactor: 1.0 (control) vs 0.9 (treatment)) and no "
        "crossover separated the placement from the speed-up"
    )
    assert "to decide, give both servers on one host, or let run --local start the arms" in status["message"]
    assert "crossover" not in status  # Off, the default: nothing was swapped


def test_confirm_with_arms_given_by_url_says_the_round_was_not_run(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20, confirm=True)
    control, control_url = start_simulator_node(tmp_path, "control", 1.0)
    treatment, treatment_url = start_simulator_node(tmp_path, "treatment", 1.0)
    try:
        out = tmp_path / "out"
        code = run(path, out, "--control-url", control_url, "--treatment-url", treatment_url)
    finally:
        for process in (control, treatment):
            process.terminate()
            process.wait(15)
    assert code == 0
    rec = result(out)["recommendation"]
    assert rec["confirmationReason"] == "ArmsNotStartedHere" and "confirmed" not in rec
    assert not (out / "confirmation").exists()


def test_an_arm_given_by_url_that_stops_answering_fails_arm_lost_keeping_the_stages_before(
    tmp_path: Path,
) -> None:
    """A server given by URL that goes away mid-stage (issue 35 item 4): Failed `ArmLost`, naming the
    arm and what was seen, c1 kept; not a Reject on the error rate of a server that is gone."""
    path = write_experiment(
        tmp_path,
        simulator={"profile": "h200-8b-draft-tiny"},
        stages=[
            {"name": "c1", "concurrency": 1, "requests": 20},
            {"name": "c4", "concurrency": 4, "requests": 20000},
        ],
        sequential=False,
    )
    control, control_url = start_simulator_node(tmp_path, "control", 1.0)
    treatment, treatment_url = start_simulator_node(tmp_path, "treatment", 1.0)
    out = tmp_path / "out"

    def kill_the_treatment_in_c4() -> None:
        if wait_for_window(out, "c1"):
            time.sleep(1.0)
        treatment.kill()

    killer = threading.Thread(target=kill_the_treatment_in_c4, daemon=True)
    killer.start()
    try:
        code = run(path, out, "--control-url", control_url, "--treatment-url", treatment_url)
    finally:
        for process in (control, treatment):
            process.kill()
            process.wait(15)
        killer.join(5)
    assert code == 3
    status = result(out)
    assert (status["phase"], status["reason"]) == ("Failed", "ArmLost"), status["message"]
    assert conditions(status)["Stalled"] == ("True", "ArmLost")
    assert "verdict" not in status
    message = status["message"]
    assert (
        f"the treatment arm at {treatment_url} (--treatment-url) stopped answering during stage c4" in message
    )
    # What was seen: refused connections once the server is gone, or dropped answers (requests in
    # flight, or accepted into the listen queue just before the kill): both name how the arm went.
    seen = "(refused connections|dropped answers)"
    assert re.search(
        rf"after \d+ answered requests its last \d+ got {seen}( and {seen})?; the load stopped there", message
    ), message
    assert "the 1 of 2 stage(s) measured before that (c1) are kept" in message
    [stage] = status["stages"]
    assert stage["name"] == "c1" and stage["speedup"]["n"] == 20
