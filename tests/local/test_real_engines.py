"""`run --local` on the real-engine path (`vllm serve` on local GPUs), with fake `vllm` and `nvidia-smi`.

The fakes (tests/local/fakebin) put vLLM's command line in front of the simulator and emulate GPUs
as lock files, so that the code that runs on a GPU machine runs here: engine detection, the
release from `vllm --version`, the GPU split, one GPU (arms one after the other), start-up
failures, crashes, and stopping every process of an arm.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import signal
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode import cli
from specdecode.experiment import promql, releases, spec
from specdecode.local import engines
from tests.factories import SHORT_STAGE_GUARDRAILS, experiment_document
from tests.local.conftest import FakeEngines, alive_after, running, wait_for_measured


def write_experiment(
    tmp_path: Path,
    *,
    stages: list[dict[str, Any]] | None = None,
    requests: int = 40,
    engine: dict[str, Any] | None = None,
    deploy: str = "1m",
) -> Path:
    document = experiment_document(
        model="meta-llama/Llama-3.1-8B-Instruct",
        engine=engine or {},
        speculative={
            "method": "draft_model",
            "model": "meta-llama/Llama-3.2-1B-Instruct",
            "numSpeculativeTokens": 4,
        },
        workload={
            "dataset": {"type": "synthetic", "inputTokens": 32, "outputTokens": 32},
            "sampling": {"maxTokens": 32},
            "stages": stages or [{"name": "c4", "concurrency": 4}],
            "requestsPerStage": requests,
            "warmupRequests": 2,
        },
        analysis={
            "minSpeedup": 1.05,
            "sequential": False,
            "guardrails": {"maxTtftRegression": None, **SHORT_STAGE_GUARDRAILS},
        },
        deadlines={"deploy": deploy, "run": "5m"},
    )
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run(path: Path, out: Path) -> int:
    return cli.main(["run", str(path), "--local", "--out", str(out), "--quiet"])


def result(out: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((out / "result.json").read_text())
    return loaded


def requests_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def test_one_gpu_runs_the_arms_one_after_the_other_and_judges_them(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    out = tmp_path / "out"
    assert run(write_experiment(tmp_path), out) == 0, result(out).get("message")
    status = result(out)
    assert status["phase"] == "Completed" and status["verdict"] in ("Promote", "Reject", "Inconclusive")
    assert "exited" not in status["message"]
    assert "one after the other (too few GPUs for both)" in status["message"]
    assert "pairs were not simultaneous" in status["message"]
    assert status["validity"]["simultaneous"] is False
    serves = fake_engines.serves()
    assert [(s["arm"], s["cuda_visible_devices"]) for s in serves] == [("control", "0"), ("treatment", "0")]
    hosts = status["environment"]["arms"]
    assert hosts["control"]["gpuUuids"] == hosts["treatment"]["gpuUuids"] == [gpu_uuid(0)]
    assert hosts["treatment"]["cudaVersion"] == "13.0" and hosts["treatment"]["gpuProduct"] == "NVIDIA H200"
    # Both arms measured the same requests, paired by (stage, index).
    measured = [r for r in requests_of(out) if not r["warmup"]]
    by_arm = {
        arm: {(r["stage"], r["index"]) for r in measured if r["arm"] == arm}
        for arm in ("control", "treatment")
    }
    assert by_arm["control"] == by_arm["treatment"] and len(by_arm["control"]) == 40
    stage = status["stages"][0]
    assert stage["speedup"]["n"] == 40
    assert stage["control"]["outputTokensPerSecond"] > 0 and stage["treatment"]["outputTokensPerSecond"] > 0
    # windows.json as when paired, with each arm's own server metrics from its /metrics
    windows = json.loads((out / "windows.json").read_text())
    assert [w["stage"] for w in windows["windows"]] == ["warmup", "warmup-c4", "c4"]
    assert set(windows["windows"][-1]["server"]) == {"control", "treatment"}
    assert set(windows["arms"]) == {"control", "treatment"}
    assert stage["acceptance"] is not None


def test_one_gpu_confirms_the_schedule_with_the_treatment_alone_against_the_first_rounds_control(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    # A steeper compute slope than the profile's puts c64 clearly below break-even: a stage of one wave
    # (64 requests at concurrency 64) has a run-to-run spread 2.3x its interval (benchmarks/verdict/waves.py)
    # and, one sampling unit, no interval at all; four waves are judged.
    fake_engines.set("FAKE_VLLM_SIM_ARGS", "--profile h200-8b-draft-tiny --batch-token-ms 0.03")
    stages = [{"name": "c1", "concurrency": 1}, {"name": "c64", "concurrency": 64, "requests": 256}]
    path = write_experiment(tmp_path, stages=stages, requests=64)
    document = yaml.safe_load(path.read_text())
    document["spec"]["workload"]["dataset"] = {"type": "synthetic", "inputTokens": 256, "outputTokens": 64}
    document["spec"]["workload"]["sampling"] = {"maxTokens": 64}
    document["spec"]["analysis"].update(sequential=True, requireStages="any", confirm=True)
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    assert run(path, out) == 0, result(out).get("message")
    status = result(out)
    assert [s["verdict"] for s in status["stages"]] == ["Pass", "Fail"], status["message"]
    rec = status["recommendation"]
    assert rec["numSpeculativeTokensPerBatchSize"] == [[1, 1, 4], [2, 4096, 0]]
    assert rec["confirmed"] is True and rec["confirmationReason"] == "Confirmed", rec
    assert [(c["name"], c["k"]) for c in rec["confirmation"]] == [("c1", 4), ("c64", 0)]
    serves = fake_engines.serves()
    assert [(s["arm"], s["cuda_visible_devices"]) for s in serves] == [
        ("control", "0"),
        ("treatment", "0"),
        ("treatment", "0"),
    ]
    config = json.loads(serves[2]["argv"][serves[2]["argv"].index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 4096, 0]]
    # only the treatment ran again; its pairs are the control's first-round requests
    again = [json.loads(line) for line in (out / "confirmation" / "requests.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in again} == {"treatment"}
    c64 = next(c for c in rec["confirmation"] if c["name"] == "c64")
    first_control = {r["index"] for r in requests_of(out) if r["stage"] == "c64" and r["arm"] == "control"}
    assert c64["speedup"]["n"] == len(first_control)


def test_two_gpus_run_the_arms_side_by_side_one_gpu_each(tmp_path: Path, fake_engines: FakeEngines) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "2")
    out = tmp_path / "out"
    assert run(write_experiment(tmp_path), out) == 0, result(out).get("message")
    status = result(out)
    assert status["phase"] == "Completed"
    assert "not simultaneous" not in status["message"]
    cuda = {s["arm"]: s["cuda_visible_devices"] for s in fake_engines.serves()}
    assert cuda == {"control": "0", "treatment": "1"}
    hosts = status["environment"]["arms"]
    assert hosts["control"]["gpuUuids"] == [gpu_uuid(0)] and hosts["treatment"]["gpuUuids"] == [gpu_uuid(1)]
    windows = json.loads((out / "windows.json").read_text())
    assert set(windows["windows"][-1]["server"]) == {"control", "treatment"}


def gpu_uuid(index: int) -> str:
    """The UUID the fake nvidia-smi gives GPU `index`, as `nvidia-smi -L` lists it."""
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return listing.splitlines()[index].split("UUID: ")[1].rstrip(")")


def test_tensor_parallel_arms_get_disjoint_gpus(tmp_path: Path, fake_engines: FakeEngines) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "4")
    out = tmp_path / "out"
    engine = {"args": ["--tensor-parallel-size", "2"], "resources": {"limits": {"nvidia.com/gpu": 2}}}
    path = write_experiment(tmp_path, engine=engine, requests=20)
    assert run(path, out) == 0, result(out).get("message")
    cuda = {s["arm"]: s["cuda_visible_devices"] for s in fake_engines.serves()}
    assert cuda == {"control": "0,1", "treatment": "2,3"}


@pytest.mark.parametrize(("gpus", "expected"), [("2", ["0,1", "0,1"]), ("3", ["0,1", "0,1"])])
def test_tensor_parallel_arms_without_gpus_for_both_run_one_after_the_other(
    tmp_path: Path, fake_engines: FakeEngines, gpus: str, expected: list[str]
) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", gpus)
    out = tmp_path / "out"
    engine = {"args": ["--tensor-parallel-size", "2"], "resources": {"limits": {"nvidia.com/gpu": 2}}}
    path = write_experiment(tmp_path, engine=engine, requests=20)
    assert run(path, out) == 0, result(out).get("message")
    serves = fake_engines.serves()
    assert [s["arm"] for s in serves] == ["control", "treatment"]
    assert [s["cuda_visible_devices"] for s in serves] == expected
    assert "pairs were not simultaneous" in result(out)["message"]


def test_too_few_gpus_for_one_arm_fail_the_run_saying_how_many_it_needs(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    out = tmp_path / "out"
    engine = {"args": ["--tensor-parallel-size", "2"], "resources": {"limits": {"nvidia.com/gpu": 2}}}
    assert run(write_experiment(tmp_path, engine=engine, requests=20), out) == 3
    status = result(out)
    assert status["reason"] == "EngineUnavailable"
    assert (
        "each arm needs 2 GPUs (--tensor-parallel-size 2 in spec.engine.args) but nvidia-smi lists 1"
        in status["message"]
    )
    assert fake_engines.serves() == []


@pytest.mark.parametrize(("gpus", "arm"), [("1", "control"), ("1", "treatment"), ("2", "treatment")])
def test_an_engine_that_exits_during_start_up_fails_the_run_naming_the_arm(
    tmp_path: Path, fake_engines: FakeEngines, gpus: str, arm: str
) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", gpus)
    fake_engines.set("FAKE_VLLM_FAIL_AT_START", arm)
    fake_engines.set("FAKE_VLLM_ENGINECORE", "session")
    out = tmp_path / "out"
    assert run(write_experiment(tmp_path, requests=20), out) == 3
    status = result(out)
    assert status["phase"] == "Failed" and status["reason"] == "EngineUnavailable"
    assert f"{arm} arm exited with status 1 before it became healthy" in status["message"]
    assert "CUDA error: out of memory" in status["message"]  # the log tail
    assert fake_engines.enginecores() == []


def test_an_engine_not_healthy_by_the_deploy_deadline_fails_the_run_and_is_stopped(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "2")
    fake_engines.set("FAKE_VLLM_ENGINECORE", "session")
    fake_engines.set("FAKE_VLLM_SIM_ARGS", "--profile h200-8b-draft-tiny --startup-delay 600")
    out = tmp_path / "out"
    assert run(write_experiment(tmp_path, requests=20, deploy="2s"), out) == 3
    status = result(out)
    assert status["reason"] == "EngineUnavailable"
    assert "control and treatment not healthy within spec.deadlines.deploy (2s)" in status["message"]
    assert fake_engines.enginecores() == []
    assert alive_after([s["pid"] for s in fake_engines.serves()], 0.0) == []


@pytest.mark.parametrize("gpus", ["1", "2"])
def test_an_engine_that_dies_mid_stage_fails_the_run_keeping_the_stages_finished(
    tmp_path: Path, fake_engines: FakeEngines, gpus: str
) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", gpus)
    # 2 warm-up + 20 of stage c1, then killed a few requests into stage c4
    fake_engines.set("FAKE_VLLM_DIE_AFTER", "treatment:28")
    fake_engines.set("FAKE_VLLM_ENGINECORE", "session")  # outlives the killed server, as on the H200
    stages = [{"name": "c1", "concurrency": 1}, {"name": "c4", "concurrency": 4}]
    out = tmp_path / "out"
    assert run(write_experiment(tmp_path, stages=stages, requests=20), out) == 3
    status = result(out)
    assert status["phase"] == "Failed" and status["reason"] == "EngineCrashed", status["message"]
    assert "treatment arm exited" in status["message"]
    assert "killing the server after" in status["message"]  # the log tail
    measured = [r for r in requests_of(out) if not r["warmup"]]
    for arm in ("control", "treatment"):
        finished = {r["index"] for r in measured if r["arm"] == arm and r["stage"] == "c1" and r["ok"]}
        assert finished == set(range(20)), arm
    assert any(r["stage"] == "c4" and r["arm"] == "treatment" for r in measured)
    windows = json.loads((out / "windows.json").read_text())["windows"]
    assert "c1" in [w["stage"] for w in windows]
    assert fake_engines.enginecores() == []


@pytest.mark.parametrize("mode", ["group", "session", "hidden"])
def test_an_enginecore_that_ignores_sigterm_and_outlives_its_server_is_stopped(
    tmp_path: Path, fake_engines: FakeEngines, mode: str
) -> None:
    """group: stays in the arm's group; session: setsid; hidden: setsid and without the arm's token.

    One GPU: the control's EngineCore holds GPU 0 until killed, so the treatment can start only if
    the control was stopped completely (as the H200's 122 GiB were not).
    """
    fake_engines.set("FAKE_VLLM_ENGINECORE", mode)
    out = tmp_path / "out"
    assert run(write_experiment(tmp_path, requests=20), out) == 0, result(out).get("message")
    assert [s["arm"] for s in fake_engines.serves()] == ["control", "treatment"]
    assert fake_engines.enginecores() == []


def test_one_gpu_ctrl_c_during_the_treatment_keeps_the_stages_both_arms_finished(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    out = tmp_path / "out"
    stages = [{"name": "c1", "concurrency": 1, "requests": 20}, {"name": "c4", "concurrency": 4}]
    path = write_experiment(tmp_path, stages=stages, requests=400)  # c4: seconds, the control's in full
    treatment_windows = out / "load-treatment" / "windows.json"
    with running(path, out) as process:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if any(w["stage"] == "c1" for w in json.loads(treatment_windows.read_text())["windows"]):
                    break
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    status = result(out)
    assert status["phase"] == "Failed" and status["reason"] == "Interrupted" and "verdict" not in status
    # c1: both arms finished it (the control alone, then the treatment); c4: only the control had.
    assert [s["name"] for s in status["stages"]] == ["c1"], status["message"]
    assert status["stages"][0]["speedup"]["n"] == 20
    assert "1 of 2 stage(s) finished before that (c1)" in status["message"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_sigterm_or_sighup_to_the_runner_stops_every_process_of_both_arms(
    tmp_path: Path, fake_engines: FakeEngines, sig: signal.Signals
) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "2")
    fake_engines.set("FAKE_VLLM_ENGINECORE", "session")
    out = tmp_path / "out"
    path = write_experiment(tmp_path, requests=2000)
    with running(path, out) as process:
        assert wait_for_measured(out, 1) >= 1
        assert len(fake_engines.enginecores()) == 2
        process.send_signal(sig)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    status = result(out)
    assert status["phase"] == "Failed" and status["reason"] == "Interrupted"
    assert (sig.name if sig != signal.SIGINT else "Ctrl-C") in status["message"]
    assert fake_engines.enginecores() == []
    assert alive_after([s["pid"] for s in fake_engines.serves()], 0.0) == []


def test_ctrl_c_during_the_confirmation_round_keeps_the_verdict_already_reached(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "2")
    fake_engines.set("FAKE_VLLM_SIM_ARGS", "--profile h200-8b-draft-tiny")
    path = write_experiment(tmp_path, stages=[{"name": "c1", "concurrency": 1}], requests=400)
    document = yaml.safe_load(path.read_text())
    document["spec"]["analysis"].update(sequential=True, confirm=True)
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    with running(path, out) as process:
        assert wait_for_measured(out / "confirmation", 1, seconds=120) >= 1, result(out)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    status = result(out)
    assert status["phase"] == "Completed" and status["verdict"] == "Promote", status
    assert status["recommendation"]["confirmationReason"] == "RoundFailed"
    assert status["message"].endswith("; the confirmation round was interrupted by the user (Ctrl-C)")
    assert alive_after([s["pid"] for s in fake_engines.serves()], 0.0) == []


# ------------------------------------------------------------------------------------ the release


def test_the_release_comes_from_vllm_version_when_the_spec_has_none(fake_engines: FakeEngines) -> None:
    fake_engines.set("FAKE_VLLM_VERSION", "0.20.0")
    assert engines.local_vllm_version() == "0.20.0"
    engine = spec.ExperimentSpec.model_validate(experiment_document()["spec"]).engine
    assert releases.resolve(engine, local=engines.local_vllm_version()).known
    pinned = engine.model_copy(update={"vllm_version": "0.33.0"})
    assert releases.fmt(releases.resolve(pinned, local=engines.local_vllm_version()).version) == "0.33.0"


def test_an_unreadable_vllm_version_leaves_the_newest_rules_and_says_so(fake_engines: FakeEngines) -> None:
    (fake_engines.bin / "vllm").write_text("#!/bin/sh\necho 'INFO no version here'\n")
    document = experiment_document()  # the default image's tag names 0.33.0, but no image runs here
    engine = spec.ExperimentSpec.model_validate(document["spec"]).engine
    release = releases.resolve(engine, local=engines.local_vllm_version(), here=True)
    assert not release.known
    assert "newest supported" in release.describe()


def test_the_fake_vllm_0_20_refuses_what_0_20_refuses(fake_engines: FakeEngines) -> None:
    fake_engines.set("FAKE_VLLM_VERSION", "0.20.0")
    argv = ["vllm", "serve", "m", "--disable-prefix-caching", "--per-request-spec-decode-metrics", "summary"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert (
        "vllm: error: unrecognized arguments: --disable-prefix-caching --per-request-spec-decode-metrics summary"
        in done.stderr
    )


def test_run_local_on_vllm_0_20_renders_a_command_line_0_20_accepts(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    """Needs the rendering by release (`manifests.serve_args` reading `engine.vllm_version`)."""
    fake_engines.set("FAKE_VLLM_VERSION", "0.20.0")
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "2")
    out = tmp_path / "out"
    assert run(write_experiment(tmp_path, requests=20), out) == 0, result(out).get("message")
    status = result(out)
    assert status["phase"] == "Completed"
    assert status["environment"]["vllmRules"].startswith("0.20.0")
    # No image ran: the environment names the command that did, not the spec's default image.
    assert "image" not in status["environment"]
    assert status["environment"]["engineCommand"].startswith("vllm serve ")
    treatment = next(s["argv"] for s in fake_engines.serves() if s["arm"] == "treatment")
    assert "--disable-prefix-caching" not in treatment
    assert "--per-request-spec-decode-metrics" not in treatment


def test_the_fake_nvidia_smi_answers_the_provenance_query(fake_engines: FakeEngines) -> None:
    fake_engines.set("FAKE_NVIDIA_SMI_GPUS", "2")
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,uuid,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split(", ") for line in done.stdout.splitlines()]
    assert len(rows) == 2 and all(r[0] == "NVIDIA H200" and r[1].startswith("GPU-") for r in rows)
    assert engines.gpu_count() == 2


class FakePrometheus(http.server.ThreadingHTTPServer):
    """Answers every instant query with 1 and records (arm label, evaluation time) of each."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _PrometheusHandler)
        self.queries: list[tuple[str, float]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _PrometheusHandler(http.server.BaseHTTPRequestHandler):
    server: FakePrometheus

    def do_GET(self) -> None:
        self._answer(urllib.parse.urlsplit(self.path).query)

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("content-length", 0))).decode())

    def _answer(self, form: str) -> None:
        params = urllib.parse.parse_qs(form)
        expr, at = params["query"][0], float(params["time"][0])
        arm = re.search(r'specdecode_io_arm="(\w+)"', expr)
        self.server.queries.append((arm.group(1) if arm else "", at))
        # a query of several (`promql.tagged`): one series per query, tagged with its key, as Prometheus answers
        keys = re.findall(rf'"{promql.TAG}", "([^"]+)"', expr) or [None]
        result = [{"metric": {} if key is None else {promql.TAG: key}, "value": [at, "1"]} for key in keys]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


def test_one_gpu_with_prometheus_asks_for_each_arm_over_its_own_windows(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    server = FakePrometheus()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        path = write_experiment(tmp_path, requests=20)
        document = yaml.safe_load(path.read_text())
        document["spec"]["prometheus"] = {"url": server.url}
        path.write_text(yaml.safe_dump(document))
        out = tmp_path / "out"
        assert run(path, out) == 0, result(out).get("message")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    windows = json.loads((out / "windows.json").read_text())
    for arm in ("control", "treatment"):
        own = windows["arms"][arm]
        ends = {round(own["anchor"]["wall"] + w["end"], 3) for w in own["windows"]}
        asked = {round(at, 3) for a, at in server.queries if a == arm}
        assert asked == ends, arm  # each arm only over its own windows, on its own clock
    # the verdict read the treatment's counters from Prometheus (the fake's 1 accepted of 1 drafted)
    assert result(out)["stages"][0]["acceptance"]["sources"]["prometheus"] == 1.0


def test_one_gpu_stops_the_treatment_early_by_pairing_it_with_the_control_measured_before(
    tmp_path: Path, fake_engines: FakeEngines
) -> None:
    """The control runs every request (nothing to pair with yet); the treatment's looks see the control's."""
    fake_engines.set("FAKE_VLLM_SIM_ARGS", "--profile h200-8b-draft-tiny")
    path = write_experiment(tmp_path, stages=[{"name": "c1", "concurrency": 1}], requests=100)
    document = yaml.safe_load(path.read_text())
    document["spec"]["analysis"]["sequential"] = True
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    assert run(path, out) == 0, result(out).get("message")
    status = result(out)
    assert status["verdict"] == "Promote" and status["stages"][0]["stoppedEarly"], status["message"]
    measured = [r for r in requests_of(out) if not r["warmup"]]
    assert len([r for r in measured if r["arm"] == "control"]) == 100
    assert 20 <= len([r for r in measured if r["arm"] == "treatment"]) < 100
