"""`run --local` against engines that answer garbage (#36): NaN or infinite counters in `/metrics`,
text that is not Prometheus exposition, no `/version`. The run still ends with a `result.json`,
the unusable counters read as unknown; a server given by URL need not answer vLLM's side routes.

The engines are `tests/loadgen/fakevllm.py` servers given by URL (`--control-url`/`--treatment-url`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.loadgen.conftest import FakeServer
from tests.local.test_run_local import result, run, write_experiment

Start = Callable[..., FakeServer]


@pytest.mark.parametrize("fault", ["nan", "inf", "garbage"])
def test_an_arm_whose_metrics_are_garbage_still_ends_with_a_result_and_reads_them_as_unknown(
    fault: str, fake_server: Start, tmp_path: Path
) -> None:
    """NaN or +Inf counters crashed the run (a traceback in the acceptance counts, no result.json)."""
    control = fake_server("--step-ms", "1")
    treatment = fake_server("--step-ms", "1", "--tokens-per-step", "1-4", "--metrics-fault", fault)
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=30)
    out = tmp_path / "out"
    code = run(path, out, "--control-url", control.url, "--treatment-url", treatment.url)
    status = result(out)
    assert code in (0, 1), status.get("message")
    assert status["phase"] == "Completed", status["message"]
    [stage] = status["stages"]
    # The treatment's counters were unusable: acceptance is the server's per-request figure instead.
    assert (
        stage["acceptance"]["source"] == "perRequest" and "prometheus" not in stage["acceptance"]["sources"]
    )
    [window] = [w for w in json.loads((out / "windows.json").read_text())["windows"] if w["stage"] == "c4"]
    server = window["server"]["treatment"]
    assert server["num_drafts"] is None and server["requests_success"] is None
    assert window["server"]["control"]["requests_success"] == 30.0  # the healthy arm is still read
    # The fake answers /version with a 404: no version, no traceback.
    assert status["environment"]["arms"]["control"].get("vllmVersion") is None


def _a_bug(*_args: object, **_kwargs: object) -> None:
    raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


@pytest.mark.parametrize("ending_fails_too", [False, True])
def test_an_unexpected_error_still_writes_result_json_with_the_reason_and_keeps_the_requests(
    ending_fails_too: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in judging (put there by hand: none is known) ends the run Failed (InternalError, exit 3)
    with the traceback in DIR/error.log, never a traceback and no result.json; if writing the run's own
    ending fails too, result.json holds the reason alone."""
    from specdecode.experiment import verdict
    from specdecode.local import runner

    monkeypatch.setattr(verdict, "acceptance_counts", _a_bug)
    if ending_fails_too:
        monkeypatch.setattr(runner._Run, "failed", _a_bug)
    path = write_experiment(tmp_path, simulator={"profile": "h200-8b-draft-tiny"}, requests=20)
    out = tmp_path / "out"
    assert run(path, out) == 3
    status = result(out)
    assert (status["phase"], status["reason"]) == ("Failed", "InternalError")
    assert (
        "TypeError: unsupported operand" in status["message"] and str(out / "error.log") in status["message"]
    )
    assert "Traceback" in (out / "error.log").read_text()
    assert len((out / "requests.jsonl").read_text().splitlines()) >= 40
