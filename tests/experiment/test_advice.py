"""Advice on valid specs that weaken their own measurement (experiment/advice.py), and the first
sequential look of a closed-loop stage (sequential.first_look)."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml

from specdecode.experiment import advice, documents, reconcile, sequential, validation, verdict
from specdecode.experiment.status import ExperimentStatus
from tests.factories import experiment_document
from tests.report import synthetic

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def parsed(**workload: object) -> validation.spec.ExperimentSpec:
    doc = experiment_document()
    doc["spec"]["workload"] = {**doc["spec"]["workload"], **workload}
    return validation.parse_experiment(doc)[0]


def test_a_closed_loop_stage_of_fewer_than_four_waves_is_advised_against_naming_the_fix() -> None:
    s = parsed(
        stages=[{"name": "c1", "concurrency": 1}, {"name": "c64", "concurrency": 64}], requestsPerStage=64
    )
    waves = [f for f in advice.advice(s) if "wave(s)" in f.message]  # (the guardrails' advice: below)
    (found,) = waves
    assert found.path == "spec.workload.stages[1]"
    assert "stage c64: 64 requests at concurrency 64 run as about 1.0 wave(s)" in found.message
    assert "at least 4 x 64 = 256 requests (requestsPerStage)" in found.message
    enough = parsed(stages=[{"name": "c64", "concurrency": 64, "requests": 300}])
    assert advice.advice(enough) == []
    open_loop = parsed(stages=[{"name": "r1", "rate": 1.0}], requestsPerStage=300)
    assert advice.advice(open_loop) == []


def test_a_stage_too_short_to_show_its_guardrails_is_advised_against_naming_the_limits_and_the_fix() -> None:
    """Issue 35: at the defaults (1% errors, 99% output match, 95%) 299 clean requests show the
    guardrails; a stage of fewer ends GuardrailUndecided however fast the treatment."""
    s = parsed(
        stages=[{"name": "r1", "rate": 1.0}, {"name": "r2", "rate": 2.0, "requests": 300}],
        requestsPerStage=200,
    )
    (found,) = advice.advice(s)
    assert found.path == "spec.workload.stages[0]"
    assert found.message == (
        "stage r1: 200 requests cannot show errorRate <= 0.01 and outputMatch >= 0.99 at confidence 0.95 "
        "(299 clean requests do), so it ends Inconclusive (GuardrailUndecided) however fast the treatment "
        "is: give it at least 299 requests (requestsPerStage) or loosen spec.analysis.guardrails.maxErrorRate "
        "and spec.analysis.guardrails.minOutputMatch"
    )
    doc = experiment_document(analysis={"guardrails": {"maxErrorRate": 0.05}})
    doc["spec"]["workload"] = {"stages": [{"name": "r1", "rate": 1.0, "requests": 100}]}
    (looser,) = advice.advice(validation.parse_experiment(doc)[0])  # 59 show 5%: outputMatch is left
    assert "cannot show outputMatch >= 0.99 at confidence 0.95 (299 clean requests do)" in looser.message
    assert looser.message.endswith("(its requests) or loosen spec.analysis.guardrails.minOutputMatch")
    doc["spec"]["workload"]["sampling"] = {"temperature": 0.7}  # no output match judged when sampling
    assert advice.advice(validation.parse_experiment(doc)[0]) == []
    doc["spec"]["workload"]["sampling"] = {}
    doc["spec"]["analysis"] = {"mode": "NoiseFloor"}  # an A/A run judges no guardrail
    assert advice.advice(validation.parse_experiment(doc)[0]) == []


def test_a_sweep_s_generated_stages_are_advised_against_by_the_sweep() -> None:
    s = parsed(stages=None, sweep={"concurrency": {"values": [1, 64]}}, requestsPerStage=60)
    waves, shown = advice.advice(s)  # c64's waves; then both stages too short for the guardrails, in one line
    assert (waves.path, shown.path) == ("spec.workload.sweep", "spec.workload.sweep")
    assert "stage c64: 60 requests at concurrency 64" in waves.message
    assert shown.message.startswith("stages c1, c64: 60 requests cannot show errorRate <= 0.01")
    assert "so each ends Inconclusive (GuardrailUndecided)" in shown.message


def test_validate_prints_the_advice_as_a_warning_and_still_succeeds(tmp_path: Path) -> None:
    doc = experiment_document()
    doc["spec"]["workload"] = {
        **doc["spec"]["workload"],
        "stages": [{"name": "c16", "concurrency": 16}],
        "requestsPerStage": 40,
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    out, err = io.StringIO(), io.StringIO()
    assert documents.validate_files([str(path)], out=out, err=err) == 0
    assert (
        f"{path}: exp: warning: spec.workload.stages[0]: stage c16: 40 requests at concurrency 16"
        in out.getvalue()
    )


def test_the_operator_posts_the_advice_when_it_accepts_a_generation() -> None:
    s = parsed(stages=[{"name": "c16", "concurrency": 16}], requestsPerStage=40)
    decision = reconcile.decide(reconcile.Subject("exp", 1, s), ExperimentStatus(), reconcile.Observed(), T0)
    weak = [e for e in decision.events if e.reason == "WeakDesign"]
    assert [e.type for e in weak] == ["Warning", "Warning"]  # too few waves, too few to show the guardrails
    assert "stage c16: 40 requests at concurrency 16" in weak[0].message
    assert "stage c16: 40 requests cannot show" in weak[1].message


def test_a_closed_loop_stage_is_not_looked_at_before_four_waves() -> None:
    assert sequential.first_look(None) == sequential.first_look(1) == sequential.FIRST_LOOK == 20
    assert sequential.first_look(64) == 256
    assert sequential.planned_looks(300, sequential.first_look(64))[0] >= 256
    assert sequential.planned_looks(64, sequential.first_look(64)) == (64,)  # one look: a fixed horizon
    assert sequential.planned_looks(300, sequential.first_look(4)) == sequential.planned_looks(300)


def test_a_large_speed_up_at_concurrency_64_is_not_decided_within_its_first_waves() -> None:
    """A wave's pairs are correlated: at C = 64 the first 60 pairs are one wave, however clear they look."""
    s = parsed(stages=[{"name": "c64", "concurrency": 64}], requestsPerStage=300)
    recs, _ = synthetic.run(s, speedup=2.0, n=300, noise=0.05)
    control = [r for r in recs if r.arm == "control" and not r.warmup]
    treatment = [r for r in recs if r.arm == "treatment" and not r.warmup]
    # the speed-up's own look (the guardrails' part of stopping: test_verdict)
    assert verdict.stage_look(s.analysis, control[:60], treatment[:60], max_pairs=300).decided  # open loop
    assert not verdict.stage_look(
        s.analysis, control[:60], treatment[:60], max_pairs=300, concurrency=64
    ).decided
    assert not verdict.stage_look(
        s.analysis, control[:255], treatment[:255], max_pairs=300, concurrency=64
    ).decided
    look = verdict.stage_look(s.analysis, control, treatment, max_pairs=300, concurrency=64)
    assert look.decided and look.n >= 256


def test_the_analysis_takes_a_closed_loop_stage_s_interval_at_its_own_looks() -> None:
    """The stage's interval and estimate come from a look after its fourth wave, never from the first."""
    rng = np.random.default_rng(3)
    d = rng.normal(0.4, 0.05, size=300)
    early = sequential.look(d, threshold=np.log(1.05), confidence=0.95, horizon=300, final=True)
    waves = sequential.look(d, threshold=np.log(1.05), confidence=0.95, horizon=300, final=True, first=256)
    assert early.n < 64 and waves.n >= 256
