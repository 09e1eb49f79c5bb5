"""deploy/gitops/argocd-health.lua, run by a real Lua 5.1 (Argo CD runs health checks in gopher-lua,
a Lua 5.1) with Argo CD's contract: a global `obj` (the resource), a returned `{status, message}`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import lua51

from specdecode.experiment import status as st

GITOPS = Path(__file__).resolve().parents[2] / "deploy" / "gitops"
SCRIPT = (GITOPS / "argocd-health.lua").read_text()
CM_KEY = "resource.customizations.health.specdecode.io_SpecDecodeExperiment"
ARGOCD_HEALTH = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


def to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({k: to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([to_lua(runtime, v) for v in value])
    return value


def health(obj: dict[str, Any]) -> tuple[str, str | None]:
    """Runs the script as Argo CD does, without the libraries Argo CD leaves out (io, os, loading)."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    assert runtime.lua_version == (5, 1)
    sandbox = runtime.globals()
    for unsafe in ("io", "os", "require", "dofile", "loadfile", "loadstring", "load"):
        sandbox[unsafe] = None
    sandbox.obj = to_lua(runtime, obj)
    hs = runtime.execute(SCRIPT)
    assert hs.status in ARGOCD_HEALTH
    return hs.status, hs.message


def experiment(*, generation: int = 2, **status: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "specdecode.io/v1alpha1",
        "kind": "SpecDecodeExperiment",
        "metadata": {"name": "qwen3-4b-draft", "namespace": "llm", "generation": generation},
        "spec": {"model": "Qwen/Qwen3-4B-Thinking-2507"},
    }
    if status:
        obj["status"] = status
    return obj


def completed(verdict: str, reason: str, message: str) -> dict[str, Any]:
    return experiment(
        observedGeneration=2, phase="Completed", verdict=verdict, reason=reason, message=message
    )


def test_promote_is_healthy_and_says_why() -> None:
    status, message = health(
        completed("Promote", "SpeedupConfirmed", "tpot speed-up 1.31x [1.24, 1.38] at low")
    )
    assert status == "Healthy"
    assert message == "Promote: SpeedupConfirmed: tpot speed-up 1.31x [1.24, 1.38] at low"


def test_reject_is_degraded() -> None:
    assert health(completed("Reject", "NoSpeedup", "tpot speed-up 0.93x at c16")) == (
        "Degraded",
        "Reject: NoSpeedup: tpot speed-up 0.93x at c16",
    )


def test_inconclusive_is_suspended_never_healthy() -> None:
    assert (
        health(completed("Inconclusive", "TooLittleEvidence", "CI [0.98, 1.21] straddles 1.10"))[0]
        == "Suspended"
    )


def test_failed_is_degraded_whatever_else_the_status_says() -> None:
    obj = experiment(
        observedGeneration=2, phase="Failed", reason="Unschedulable", message="no node has 2 GPUs"
    )
    assert health(obj) == ("Degraded", "Failed: Unschedulable: no node has 2 GPUs")


@pytest.mark.parametrize("phase", ["Pending", "Deploying", "Running", "Analyzing"])
def test_every_active_phase_is_progressing(phase: str) -> None:
    status, message = health(experiment(observedGeneration=2, phase=phase, message="both arms Ready"))
    assert status == "Progressing"
    assert message == f"{phase}: both arms Ready"


def test_no_status_yet_is_progressing() -> None:
    assert health(experiment())[0] == "Progressing"
    assert health(experiment(conditions=[]))[0] == "Progressing"


def test_a_verdict_for_an_older_generation_is_progressing() -> None:
    stale = completed("Promote", "SpeedupConfirmed", "1.31x")
    stale["metadata"]["generation"] = 3
    assert health(stale) == ("Progressing", "Waiting for the operator to observe generation 3")


def test_a_status_without_observed_generation_is_not_trusted() -> None:
    obj = experiment(phase="Completed", verdict="Promote", reason="SpeedupConfirmed")
    assert health(obj)[0] == "Progressing"


def test_completed_without_a_verdict_is_progressing() -> None:
    assert health(experiment(observedGeneration=2, phase="Completed"))[0] == "Progressing"


def test_missing_reason_or_message_is_left_out() -> None:
    assert health(experiment(observedGeneration=2, phase="Completed", verdict="Promote", message="1.3x")) == (
        "Healthy",
        "Promote: 1.3x",
    )
    assert health(experiment(observedGeneration=2, phase="Running")) == ("Progressing", "Running")


def test_the_status_models_wire_format_is_what_the_script_reads() -> None:
    # Every phase and verdict the operator can write, in the exact JSON the operator writes.
    expected = {
        (st.Phase.COMPLETED, st.Verdict.PROMOTE): "Healthy",
        (st.Phase.COMPLETED, st.Verdict.REJECT): "Degraded",
        (st.Phase.COMPLETED, st.Verdict.INCONCLUSIVE): "Suspended",
        (st.Phase.FAILED, None): "Degraded",
        **{(phase, None): "Progressing" for phase in st.Phase if phase.is_active},
    }
    for (phase, verdict), want in expected.items():
        wire = st.ExperimentStatus(observed_generation=5, phase=phase, verdict=verdict, reason="R").wire()
        assert health(experiment(generation=5, **wire))[0] == want, (phase, verdict)
    names = set(re.findall(r'"([A-Z][a-z]+)"', SCRIPT)) - ARGOCD_HEALTH
    assert names <= {p.value for p in st.Phase} | {v.value for v in st.Verdict}, (
        "a phase or verdict the models lack"
    )


def test_the_argocd_cm_snippet_embeds_exactly_this_script() -> None:
    cm = yaml.safe_load((GITOPS / "argocd-cm.yaml").read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"] == {
        "name": "argocd-cm",
        "namespace": "argocd",
        "labels": {"app.kubernetes.io/name": "argocd-cm", "app.kubernetes.io/part-of": "argocd"},
    }
    assert list(cm["data"]) == [CM_KEY]
    assert cm["data"][CM_KEY] == SCRIPT, "copy deploy/gitops/argocd-health.lua into argocd-cm.yaml, indented"
