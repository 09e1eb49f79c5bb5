"""report.html, the terminal table, the results directory and `specdecode report DIR`."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pty
import re
import subprocess
import sys
from html import escape
from pathlib import Path
from typing import TypeAlias

import pytest
from rich.console import Console

from specdecode import cli, exit_status
from specdecode.experiment import breakeven, placement, releases, validation, verdict
from specdecode.experiment.records import ArmServerMetrics, PackedRequest, RequestRecord, StageWindow
from specdecode.experiment.spec import ExperimentSpec
from specdecode.experiment.status import (
    ArmDifference,
    ArmGpu,
    ArmHosts,
    ConfirmationStage,
    Degradation,
    Environment,
    ExperimentStatus,
    GuardrailResult,
    Host,
    LengthRecommendation,
    Speedup,
    StageGpu,
    StageVerdict,
)
from specdecode.experiment.validity import Validity
from specdecode.report import results, svg, terminal
from specdecode.report.page import render_html
from tests.factories import experiment_document
from tests.report import synthetic

Finished: TypeAlias = tuple[ExperimentStatus, list[RequestRecord], list[StageWindow]]


@pytest.fixture
def spec() -> ExperimentSpec:
    parsed, _ = validation.parse_experiment(experiment_document())
    return parsed


@pytest.fixture
def finished(spec: ExperimentSpec) -> Finished:
    records, windows = synthetic.run(spec, speedup={"low": 1.4, "c16": 0.9}, n=300)
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus(validity={"valid": True}))
    return status, records, windows


def terminal_text(status: ExperimentStatus) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(terminal.render_terminal(status))
    return out.getvalue()


def test_report_is_self_contained(spec: ExperimentSpec, finished: Finished) -> None:
    status, records, windows = finished
    html = render_html(status, records, windows, spec, name="exp")
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?https?:""", html)
    assert "@import" not in html and "url(" not in html
    # speed-up vs load, 3 CDFs and an acceptance chart per stage
    assert html.count("<svg") == 1 + 2 * 4
    for needle in (
        "Validity",
        "Provenance",
        "Recommendation",
        "num_speculative_tokens_per_batch_size",
        "TPOT p90",
    ):
        assert needle in html


def test_report_escapes_text(spec: ExperimentSpec, finished: Finished) -> None:
    status, records, windows = finished
    status = status.model_copy(update={"message": "<b>x</b>"})
    assert "&lt;b&gt;x&lt;/b&gt;" in render_html(status, records, windows, spec)


def test_report_without_data_still_renders(spec: ExperimentSpec) -> None:
    status = verdict.analyse(spec, [], []).apply(ExperimentStatus())
    html = render_html(status, [], [], spec)
    assert "Failed" in html and "no data" in html


def test_terminal_table_names_every_stage(finished: Finished) -> None:
    status = finished[0]
    text = terminal_text(status)
    assert (
        "Reject" in text
        and "low" in text
        and "c16" in text
        and "num_speculative_tokens_per_batch_size" in text
    )


def test_at_80_columns_no_header_is_cut_and_the_verdict_stands_on_its_own_line_with_why() -> None:
    spec, _ = validation.parse_experiment(experiment_document(analysis={"slo": {"ttft": {"p90": 60}}}))
    # 1000 pairs: enough to show goodput did not drop by 2 points (near the SLO many pairs are discordant)
    records, windows = synthetic.run(spec, n=1000, categories={"code": (1.6, 0.85), "chat": (1.4, 0.4)})
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus())
    assert status.stages[0].control.goodput is not None  # the widest table: with the goodput column
    out = io.StringIO()
    Console(file=out, width=80).print(terminal.render_terminal(status, require_stages="all"))
    lines = out.getvalue().splitlines()
    assert "…" not in out.getvalue()
    assert max(len(line) for line in lines) <= 80
    assert lines[0] == "verdict: Promote (SpeedupConfirmed)"
    assert lines[1] == "why: requireStages all needs Pass at low, c16: low Pass, c16 Pass"
    for header in ("speed-up [CI]", "acceptance", "goodput", "pairs", "verdict"):
        assert header in out.getvalue()
    # the verdict block and the first table are apart (no table border glued to the message)
    assert lines[3] == ""


@pytest.mark.parametrize(
    ("require", "verdicts", "expected"),
    [
        (["low"], {"low": 1.4, "c16": 0.9}, "Promote (SpeedupConfirmed)"),
        ("any", {"low": 1.4, "c16": 0.9}, "Promote (SpeedupConfirmed)"),
        ("any", {"low": 0.8, "c16": 0.8}, "Reject (SlowerThanRequired)"),
    ],
)
def test_the_why_line_names_what_require_stages_needed(
    require: str | list[str], verdicts: dict[str, float], expected: str
) -> None:
    spec, _ = validation.parse_experiment(experiment_document(analysis={"requireStages": require}))
    status = verdict.analyse(spec, *synthetic.run(spec, speedup=verdicts, n=300)).apply(ExperimentStatus())
    out = io.StringIO()
    Console(file=out, width=80).print(terminal.render_terminal(status, require_stages=require))
    head, why = out.getvalue().splitlines()[:2]
    assert head == f"verdict: {expected}"
    if require == ["low"]:
        assert why == "why: requireStages [low] needs Pass at low: low Pass"
    elif expected.startswith("Promote"):
        assert why == "why: requireStages any needs one stage to Pass: low passed (low Pass, c16 Fail)"
    else:
        assert why.startswith("why: requireStages any rejects when every stage fails")


def test_the_why_line_of_an_output_mismatch_names_the_stage(spec: ExperimentSpec) -> None:
    records, windows = synthetic.run(spec, n=60, speedup={"low": 1.4, "c16": 0.9}, mismatch_rate=0.2)
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus())
    assert status.reason == "OutputMismatch"
    out = io.StringIO()
    Console(file=out, width=80).print(terminal.render_terminal(status, require_stages="all"))
    assert out.getvalue().splitlines()[1] == (
        "why: outputs differ beyond the allowed rate at low, c16: any mismatch rejects"
    )


def test_specdecode_report_in_an_80_column_pseudo_terminal_cuts_no_header(
    tmp_path: Path, spec: ExperimentSpec, finished: Finished
) -> None:
    status, records, windows = finished
    results.write_results(tmp_path, status, records, windows, spec, name="exp")
    main, child = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "LINES": "40", "TERM": "xterm"}
    process = subprocess.Popen(
        [sys.executable, "-m", "specdecode", "report", str(tmp_path)],
        stdin=child,
        stdout=child,
        stderr=child,
        env=env,
    )
    os.close(child)
    chunks = []
    with contextlib.suppress(OSError):  # EIO once the child has exited
        while chunk := os.read(main, 65536):
            chunks.append(chunk)
    os.close(main)
    assert process.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r", "")
    lines = text.splitlines()
    assert "…" not in text
    assert max(len(line) for line in lines) <= 80
    assert lines[0] == "verdict: Reject (SlowerThanRequired)"
    assert lines[1] == "why: requireStages all needs Pass at low, c16: low Pass, c16 Fail"
    assert any(line.split() == ["stage", "load", "pairs", "speed-up", "[CI]", "verdict"] for line in lines)


def test_goodput_and_the_ttft_tolerance_show_in_the_terminal_and_the_report() -> None:
    spec, _ = validation.parse_experiment(experiment_document(analysis={"slo": {"ttft": {"p90": 60}}}))
    records, windows = synthetic.run(spec, speedup=1.4, n=60, ttft_ratio=1.3)
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus())
    low = next(s for s in status.stages if s.name == "low")
    assert low.control.goodput is not None and low.treatment.goodput is not None
    text = terminal_text(status)
    assert (
        "goodput" in text
        and f"{low.control.goodput.fraction:.0%} / {low.treatment.goodput.fraction:.0%}" in text
    )
    html = render_html(status, records, windows, spec)
    assert "<th>goodput</th>" in html and f"{low.treatment.goodput.fraction:.1%} [" in html
    assert "sloTtftP90" in html and "tolerance 50 ms" in html
    assert low.speedup is not None and f"noise floor {low.speedup.min_detectable:.2f}x" in html
    # Without SLOs there is no goodput to show.
    plain, _ = validation.parse_experiment(experiment_document())
    status = verdict.analyse(plain, records, windows).apply(ExperimentStatus())
    assert "goodput" not in render_html(status, records, windows, plain)


def test_per_category_rows_show_in_the_terminal_and_the_report(spec: ExperimentSpec) -> None:
    records, windows = synthetic.run(spec, n=60, categories={"code": (1.6, 0.85), "chat": (1.1, 0.4)})
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus())
    code = next(c for c in status.stages[0].categories if c.name == "code")
    text = terminal_text(status)
    assert (
        "per prompt category" in text
        and f"{code.speedup:.2f}x [{code.ci_low:.2f}, {code.ci_high:.2f}]" in text
    )
    html = render_html(status, records, windows, spec)
    assert "<th class=l>category</th>" in html and f"{code.speedup:.2f}x [" in html
    plain = verdict.analyse(spec, *synthetic.run(spec, n=60)).apply(ExperimentStatus())
    assert "category" not in render_html(plain, [], [], spec)


def test_an_a_a_run_shows_its_noise_floor_table_in_the_terminal_and_the_report() -> None:
    spec, _ = validation.parse_experiment(experiment_document(analysis={"mode": "NoiseFloor"}))
    records, windows = synthetic.run(spec, speedup=1.0, n=60, mismatch_rate=0.3)
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus())
    nf = status.noise_floor
    assert nf is not None and nf.suggested_baseline_mismatch_rate is not None
    low = nf.stages[0]
    assert low.speedup is not None and low.min_detectable is not None and low.mismatch_rate is not None
    text = terminal_text(status)
    assert "noise floor (A/A" in text and "mismatch [CI]" in text
    assert f"{low.speedup:.3f}x [{low.ci_low:.3f}, {low.ci_high:.3f}]" in text
    assert f"{low.min_detectable:.3f}x" in text and f"{100 * low.mismatch_rate:.1f}% [" in text
    assert f"baselineMismatchRate: {nf.suggested_baseline_mismatch_rate:.3f}" in text
    html = render_html(status, records, windows, spec)
    assert "<h2>Noise floor (A/A)</h2>" in html and "<th>min detectable</th>" in html
    assert "k=5 (not used: an A/A run" in html
    assert f"{low.mismatch_rate:.1%} [" in html and f"({low.mismatches}/{low.compared})" in html
    plain, _ = validation.parse_experiment(experiment_document())
    compared = verdict.analyse(plain, records, windows).apply(ExperimentStatus())
    assert "Noise floor" not in render_html(compared, records, windows, plain)
    assert "noise floor (A/A" not in terminal_text(compared)


def test_the_report_shows_where_mismatched_outputs_first_differ(spec: ExperimentSpec) -> None:
    records, windows = synthetic.run(spec, n=30)
    low = [r for r in records if r.stage == "low"]
    for r in low:
        r.text = "The answer is 42 <because> six times seven."
        r.text_hash = None
        if r.arm == "treatment" and r.index % 4 == 0:  # 8 mismatches, diverging at character 17
            r.text = "The answer is 42 [because] six times seven."
            r.diverges_at = 17 if r.index % 8 == 0 else None  # the report finds it when the record lacks it
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus())
    html = render_html(status, records, windows, spec)
    assert "8 paired output(s) differ under the same prompt; the first 5" in html
    assert html.count("<td>17</td>") == 5
    assert "The answer is 42 <b>&lt;because&gt; six times seven.</b>" in html  # escaped
    assert "The answer is 42 <b>[because] six times seven.</b>" in html
    for r in low:
        r.text = None
        r.text_hash = "x" if r.arm == "control" or r.index % 4 else "y"
    assert "texts not kept" in render_html(status, records, windows, spec)
    plain, windows = synthetic.run(spec, n=30)
    assert "differ under the same prompt" not in render_html(status, plain, windows, spec)


def test_results_round_trip_and_the_report_command(
    tmp_path: Path,
    spec: ExperimentSpec,
    finished: Finished,
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, records, windows = finished
    written = results.write_results(tmp_path, status, records, windows, spec, name="exp")
    assert {p.name for p in written} == {
        "result.json",
        "report.html",
        "requests.jsonl",
        "windows.json",
        "experiment.yaml",
        "results.v2.npz",
    }
    wire = json.loads((tmp_path / "result.json").read_text())
    assert (
        wire["verdict"] == "Reject" and "speedupSummary" in wire and "ciLow" in wire["stages"][0]["speedup"]
    )
    loaded = results.load_results(tmp_path)
    assert loaded.status == status and len(loaded.records) == len(records) and loaded.spec == spec
    assert all(isinstance(r, PackedRequest) for r in loaded.records)  # read from the packed bundle
    assert [r.e2e_ms for r in loaded.records] == [r.e2e_ms for r in records]
    html = (tmp_path / "report.html").read_text()
    (tmp_path / "report.html").unlink()
    assert cli.main(["report", str(tmp_path)]) == exit_status.OK
    assert (tmp_path / "report.html").read_text() == html
    assert "Reject" in capsys.readouterr().out


def test_report_command_names_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path)]) == exit_status.INVALID
    assert "result.json: no such file" in capsys.readouterr().err


def test_plots_handle_degenerate_input() -> None:
    assert "no data" in svg.cdf("t", {"control": []}, xlabel="ms")
    assert "<polyline" in svg.cdf("t", {"control": [5.0, 5.0]}, xlabel="ms")
    assert "no data" in svg.intervals("t", [], ylabel="x")
    assert "<circle" in svg.intervals("t", [svg.Interval("a", 1.0, None, None)], ylabel="x", reference=1.1)
    assert "no data" in svg.bars("t", {}, xlabel="p", ylabel="r")


def placed(status: ExperimentStatus, treatment_node: str) -> ExperimentStatus:
    hosts = ArmHosts(
        control=Host(node="gpu-0", gpu_product="NVIDIA-H200", gpu_uuids=["GPU-aaa"]),
        treatment=Host(node=treatment_node, gpu_product="NVIDIA-H200", gpu_uuids=["GPU-bbb"]),
    )
    return status.model_copy(update={"environment": placement.with_hosts(Environment(), hosts)})


def test_report_shows_each_arms_host_and_marks_what_differs(spec: ExperimentSpec, finished: Finished) -> None:
    status, records, windows = finished
    html = render_html(placed(status, "gpu-1"), records, windows, spec)
    assert (
        "<tr><th class=l>node</th><td class=l>gpu-0</td><td class=l>gpu-1</td><td class=l><b>differs</b>"
        in html
    )
    assert "<td class=l>GPU-aaa</td><td class=l>GPU-bbb</td><td></td>" in html
    assert (
        "<b>Placement:</b> the arms ran on different hosts (node: gpu-0 (control) vs gpu-1 (treatment))"
        in html
    )
    same = render_html(placed(status, "gpu-0"), records, windows, spec)
    assert "differs" not in same and "Placement:" not in same


def test_terminal_says_where_each_arm_ran_and_warns_when_the_hosts_differ(finished: Finished) -> None:
    def shown(status: ExperimentStatus) -> str:
        out = io.StringIO()
        Console(file=out, width=400).print(terminal.render_terminal(status))
        return out.getvalue()

    text = shown(placed(finished[0], "gpu-1"))
    assert "hosts: control on gpu-0, treatment on gpu-1" in text
    assert "placement: the arms ran on different hosts (node: gpu-0 (control) vs gpu-1 (treatment))" in text
    assert "placement:" not in shown(placed(finished[0], "gpu-0"))


def test_a_failing_stage_shows_its_break_even_acceptance_in_the_terminal_and_the_report(
    spec: ExperimentSpec, finished: Finished
) -> None:
    status, records, windows = finished
    c16 = next(s for s in status.stages if s.name == "c16")
    assert c16.verdict == "Fail" and c16.break_even is not None
    assert all(s.break_even is None for s in status.stages if s.name != "c16")
    line = breakeven.describe("c16", c16.break_even)
    assert line.startswith("at c16 speculation pays only above acceptance ")
    assert "break-even: " + line in " ".join(terminal_text(status).split())
    assert f"<b>break-even</b>: {line}" in render_html(status, records, windows, spec)


def test_degradations_show_in_the_terminal_and_the_report(spec: ExperimentSpec, finished: Finished) -> None:
    status, records, windows = finished
    found = [Degradation(kind="ChatTemplate", message="Chat template warmup failed")]
    status = status.model_copy(update={"degradations": found})
    assert "speculation degraded: ChatTemplate: Chat template warmup failed" in terminal_text(status)
    html = render_html(status, records, windows, spec)
    assert (
        "<h2>Speculation degraded</h2>" in html
        and "<li>ChatTemplate: Chat template warmup failed</li>" in html
    )
    assert "Speculation degraded" not in render_html(finished[0], records, windows, spec)


def test_arm_differences_show_in_the_terminal_and_the_report(
    spec: ExperimentSpec, finished: Finished
) -> None:
    status, records, windows = finished
    found = [ArmDifference(field="env.EXTRA", treatment="1")]
    status = status.model_copy(update={"arm_differences": found})
    assert "the arms' pods differ: env.EXTRA: absent (control) vs 1 (treatment)" in terminal_text(status)
    html = render_html(status, records, windows, spec)
    assert "<h2>The arms' pods differ</h2>" in html
    assert "<li>env.EXTRA: absent (control) vs 1 (treatment)</li>" in html
    assert "The arms' pods differ" not in render_html(finished[0], records, windows, spec)


def test_the_confirmation_round_shows_in_the_terminal_and_the_report(
    spec: ExperimentSpec, finished: Finished
) -> None:
    status, records, windows = finished
    assert status.recommendation is not None
    rec = status.recommendation.model_copy(
        update={
            "confirmed": False,
            "confirmation_reason": "Refuted",
            "confirmation": [
                ConfirmationStage(
                    name="c16",
                    k=0,
                    threshold=0.98,
                    speedup=Speedup(metric="tpot", estimate=0.9, n=60),
                    verdict=StageVerdict.FAIL,
                )
            ],
        }
    )
    status = status.model_copy(update={"recommendation": rec})
    line = "confirmation Refuted: c16 0.90x Fail (k=0, >= 0.98)"
    assert line in terminal_text(status)
    assert line.replace(">", "&gt;") in render_html(status, records, windows, spec)


def test_the_page_shows_no_raw_json(spec: ExperimentSpec, finished: Finished) -> None:
    status, records, windows = finished
    validity = Validity.model_validate(
        {"valid": True, "reasons": [], "schedule_lag_ms": {"p50": 0.4, "p99": 2.5}, "stages": {}}
    )
    environment = placement.environment(spec, releases.resolve(spec.engine))
    status = status.model_copy(update={"validity": validity, "environment": environment})
    assert status.stages[0].acceptance is not None and status.stages[0].acceptance.sources
    html = render_html(status, records, windows, spec)
    assert '{"' not in html and "{&quot;" not in html and "[&quot;" not in html
    assert "<th class=l>schedule_lag_ms p99</th><td class=l>2.5</td>" in html
    assert "<th class=l>speculative</th><td class=l>method draft_model; model Qwen/Qwen3-0.6B" in html
    assert "requireStages all;" in html and "estimates: " in html
    assert "<p><b>why:</b> requireStages all needs Pass at low, c16: low Pass, c16 Fail</p>" in html


def test_milliseconds_read_without_an_exponent_in_the_page_and_the_terminal() -> None:
    spec, _ = validation.parse_experiment(
        experiment_document(analysis={"guardrails": {"maxTtftRegression": 2.0}})
    )
    records, windows = synthetic.run(spec, n=60, ttft_base=1260.0, ttft_ratio=2.0)
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus())
    ttft = next(g for g in status.stages[0].guardrails if g.name.startswith("ttft"))
    assert ttft.difference is not None and ttft.difference > 1000
    html = render_html(status, records, windows, spec)
    text = terminal_text(status)
    exponent = re.compile(r"\d[eE][+-]?\d")
    assert not exponent.search(html) and not exponent.search(text)
    assert f"p90 +{ttft.difference:,.0f} ms" in html
    control = status.stages[0].control.ttft_p90
    assert control is not None and f"{control:,.0f} / " in text


def test_a_guardrail_whose_interval_crosses_its_limit_is_not_shown_as_a_plain_holds(
    spec: ExperimentSpec, finished: Finished
) -> None:
    status, records, windows = finished
    crossing = GuardrailResult(
        name="errorRate", limit=0.01, estimate=0.005, ci_low=0.001, ci_high=0.02, outcome="Holds"
    )
    clear = GuardrailResult(
        name="errorRate", limit=0.01, estimate=0.001, ci_low=0.0, ci_high=0.004, outcome="Holds"
    )

    def page(guardrail: GuardrailResult) -> str:
        stage = status.stages[0].model_copy(update={"guardrails": [guardrail]})
        return render_html(status.model_copy(update={"stages": [stage]}), records, windows, spec)

    assert "<td class=l>Holds (not surely: the interval crosses 0.01)</td>" in page(crossing)
    assert "<td class=l>Holds</td>" not in page(crossing)
    assert "<td class=l>Holds</td>" in page(clear)


def test_a_simulator_run_names_no_image_in_its_provenance() -> None:
    spec, _ = validation.parse_experiment(
        experiment_document(engine={"simulator": {"profile": "h200-8b-draft-tiny"}})
    )
    records, windows = synthetic.run(spec, n=30)
    environment = placement.environment(spec, releases.resolve(spec.engine))
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus(environment=environment))
    html = render_html(status, records, windows, spec)
    assert "<th class=l>simulator</th>" in html
    assert "<th class=l>image</th>" not in html and "vllm/vllm-openai" not in html


def test_plots_have_round_ticks_legends_clear_of_the_curves_and_a_large_speed_up_plot(
    spec: ExperimentSpec,
) -> None:
    records, windows = synthetic.run(spec, n=60, ttft_base=1260.0)
    status = verdict.analyse(spec, records, windows).apply(ExperimentStatus())
    plots = re.findall(r"<svg.*?</svg>", render_html(status, records, windows, spec), re.S)
    speedup, ttft = plots[0], plots[1]
    assert 'width="720" height="360"' in speedup and "minSpeedup 1.1</text>" in speedup
    legends = {
        name: float(y)
        for plot in plots
        for y, name in re.findall(r'<text x="[\d.]+" y="([\d.]+)" fill="[^"]+">([^<]+)</text>', plot)
    }
    assert {"control (n=60)", "treatment (n=60)", "– – minSpeedup 1.1"} <= legends.keys()
    assert all(y < svg.MARGIN_TOP for y in legends.values()), legends  # above the plot area
    bottom = svg.HEIGHT - svg.MARGIN_BOTTOM + 15
    ticks = [
        float(t.replace(",", ""))
        for t in re.findall(rf'<text x="[\d.]+" y="{bottom}" text-anchor="middle">([^<]+)</text>', ttft)
    ]
    assert len(ticks) >= 3 and min(ticks) >= 1000, ticks
    for tick in ticks:  # 1, 1.5, 2, 3, 5 or 7 times a power of ten
        assert round(tick / 10 ** math.floor(math.log10(tick)), 6) in {1, 1.5, 2, 3, 5, 7}, ticks


def test_terminal_and_report_say_what_the_draft_takes_of_the_kv_cache_and_blame_it_for_a_loss_beyond_it(
    spec: ExperimentSpec, finished: Finished
) -> None:
    status, records, windows = finished
    failing = next(s for s in status.stages if s.verdict == StageVerdict.FAIL)
    stages = [s.model_copy(update={"batch_size": 700.0}) if s is failing else s for s in status.stages]
    arms = ArmHosts(
        control=Host(kv_cache_tokens=100_000, max_concurrency=781),
        treatment=Host(kv_cache_tokens=77_000, max_concurrency=601),
    )
    measured = status.model_copy(update={"environment": Environment(arms=arms), "stages": stages})
    text = terminal_text(measured)
    assert "memory: the draft takes 23% of the KV cache (77,000 of 100,000 tokens)" in text
    assert f"stage {failing.name}: about 700 running requests exceed the 601" in text
    assert "memory:" not in terminal_text(status)
    html = render_html(measured, records, windows, spec)
    assert "<p>memory: the draft takes 23% of the KV cache (77,000 of 100,000 tokens)" in html
    assert f"<p>stage {escape(failing.name)}: about 700 running requests exceed the 601" in html


def test_the_recommendation_by_input_length_shows_in_the_terminal_and_the_report(
    spec: ExperimentSpec, finished: Finished
) -> None:
    status, records, windows = finished
    assert status.recommendation is not None
    by_length = [
        LengthRecommendation(
            input_tokens=256,
            beneficial_up_to="short-c8",
            num_speculative_tokens_per_batch_size=[[1, 8, 5], [9, 4096, 0]],
            note="passes up to short-c8",
        ),
        LengthRecommendation(
            input_tokens=2048, note="speculation did not pass at the lowest load (long-c1); leave it off"
        ),
    ]
    status = status.model_copy(
        update={"recommendation": status.recommendation.model_copy(update={"by_input_length": by_length})}
    )
    text = terminal_text(status)
    assert (
        "inputTokens 256: passes up to short-c8; num_speculative_tokens_per_batch_size=[[1, 8, 5], [9, 4096, 0]]"
        in text
    )
    assert "inputTokens 2048: speculation did not pass at the lowest load (long-c1); leave it off" in text
    html = render_html(status, records, windows, spec)
    assert "<tr><td>256</td><td class=l>short-c8</td><td class=l>[[1, 8, 5], [9, 4096, 0]]</td>" in html
    assert "<tr><td>2048</td><td class=l>–</td><td class=l>–</td>" in html


def test_each_arm_s_prefix_cache_hit_rate_is_read_from_its_counters_and_shown_with_prefix_caching_on(
    spec: ExperimentSpec, finished: Finished
) -> None:
    _, records, windows = finished
    counters = {
        "control": ArmServerMetrics(prefix_cache_queries=1000, prefix_cache_hits=600),
        "treatment": ArmServerMetrics(prefix_cache_queries=1000, prefix_cache_hits=550),
    }
    windows = [w.model_copy(update={"server": {**w.server, **counters}}) for w in windows]
    status = verdict.analyse(spec, records, windows).apply(
        ExperimentStatus(validity={"valid": True}, environment=Environment(prefix_caching=True))
    )
    for stage in status.stages:
        assert (stage.control.prefix_cache_hit_rate, stage.treatment.prefix_cache_hit_rate) == (0.6, 0.55)
    text = terminal_text(status)
    assert "prefix-cache hits" in text and "60.0% / 55.0%" in text
    assert terminal.PREFIX_CACHING_NOTE[:40] in text
    html = render_html(status, records, windows, spec)
    assert "<th>prefix-cache hits</th>" in html and "<td>60.0%</td>" in html and "<td>55.0%</td>" in html
    assert escape(terminal.PREFIX_CACHING_NOTE) in html


def test_without_prefix_cache_lookups_no_hit_rate_is_shown(spec: ExperimentSpec, finished: Finished) -> None:
    status, records, windows = finished
    assert all(s.control.prefix_cache_hit_rate is None for s in status.stages)
    assert "prefix-cache hits" not in terminal_text(status)
    assert "prefix-cache hits" not in render_html(status, records, windows, spec)


def test_the_arms_gpus_show_per_stage_in_the_report_and_the_terminal_or_their_absence_is_said(
    spec: ExperimentSpec, finished: Finished
) -> None:
    status, records, windows = finished
    arm = ArmGpu(gpus=1, utilization_mean=71.5, memory_used_mean_mib=129_393, power_mean_watts=534.7)
    measured = status.model_copy(
        update={
            "stages": [
                s.model_copy(update={"gpu": StageGpu(source="dcgm-exporter", control=arm, treatment=arm)})
                for s in status.stages
            ]
        }
    )
    html = render_html(measured, records, windows, spec)
    assert "GPU per arm (dcgm-exporter, per GPU)" in html and "<td>535</td>" in html
    assert "no DCGM metrics" not in html
    first = measured.stages[0].name
    assert f"gpu {first}: control util 72%, memory 129,393 MiB (max –), 535 W" in terminal_text(measured)
    absent = status.model_copy(
        update={"stages": [s.model_copy(update={"gpu": StageGpu(source="absent")}) for s in status.stages]}
    )
    assert escape("no DCGM metrics for the arms' pods") in render_html(absent, records, windows, spec)
    assert "GPU per arm" not in render_html(absent, records, windows, spec)
    assert "gpu: no DCGM metrics for the arms' pods" in terminal_text(absent)
