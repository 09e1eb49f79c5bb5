"""report.html: one self-contained page (inline CSS and SVG, no scripts, no network) per experiment.

Sections: the verdict and why; the noise-floor table of an A/A run; speed-up versus load with confidence bars; per-stage tables of TTFT,
TPOT and E2E quantiles per arm (goodput with SLOs) with tail speed-ups, per-category speed-up and
acceptance, guardrails, and where mismatched outputs first differ; latency CDFs per arm and stage;
acceptance per draft position (each source); the validity block; provenance.

One stage's section is `stage_html.py`; the small formatting both use (numbers, intervals, badges) is
`formatting.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape

from specdecode.experiment import confirm, kvcache, placement, search, telemetry
from specdecode.experiment.records import Request, StageWindow
from specdecode.experiment.spec import ExperimentSpec
from specdecode.experiment.status import (
    ExperimentStatus,
    NoiseFloor,
    StageVerdict,
)
from specdecode.report import svg, terminal
from specdecode.report.formatting import badge, fact, plain, ratio, yes_no
from specdecode.report.stage_html import facts_table, stage_section

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222;
padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:right}th{background:#f6f6f6}td.l,th.l{text-align:left}
.verdict{display:inline-block;padding:.2em .7em;border-radius:.3em;color:#fff;font-weight:bold}
.Promote,.Pass{background:#2b8a3e}.Reject,.Fail{background:#c92a2a}.Inconclusive{background:#e67700}
.Failed{background:#495057}.plots{display:flex;flex-wrap:wrap;gap:.5em}.muted{color:#777}
code,pre{background:#f6f6f6;padding:.1em .3em}pre{padding:.6em;overflow:auto}
"""


def _hosts_section(status: ExperimentStatus) -> str:
    """Where each arm ran, side by side; the facts in which the hosts differ are marked."""
    env = status.environment
    if env is None or env.arms is None:
        return "<p class=muted>where the arms ran was not recorded</p>"
    control = env.arms.control.wire() if env.arms.control else {}
    treatment = env.arms.treatment.wire() if env.arms.treatment else {}
    keys = [k for k in (*control, *treatment) if k in control or k in treatment]
    rows = "".join(
        f"<tr><th class=l>{escape(k)}</th>"
        + "".join(f"<td class=l>{escape(fact(side.get(k)))}</td>" for side in (control, treatment))
        + ("<td class=l><b>differs</b></td>" if k in env.host_differences else "<td></td>")
        + "</tr>"
        for k in dict.fromkeys(keys)
    )
    warning = placement.warning(env)
    note = f"<p><b>Placement:</b> {escape(warning)}</p>" if warning else ""
    # The draft's memory cost (issue #18): its share of the KV cache, and a loss it likely explains.
    note += "".join(f"<p>{escape(line)}</p>" for line in kvcache.summary(env.arms, status.stages))
    return (
        note
        + "<table><tr><th class=l>host</th><th class=l>control</th><th class=l>treatment</th><th></th></tr>"
        + rows
        + "</table>"
    )


def _crossover_section(status: ExperimentStatus) -> str:
    """The placement check: the two rounds and the placement effect per stage, or why it did not run."""
    block = status.crossover
    if block is None:
        return ""
    if not block.ran:
        return f"<p><b>Placement (crossover):</b> not run ({escape(block.reason or '')}): {escape(block.message or '')}</p>"
    rounds = "; ".join(
        f"round {i}: control on {escape(r.control or '?')}, treatment on {escape(r.treatment or '?')}"
        for i, r in enumerate(block.rounds, 1)
    )
    rows = ""
    for s in status.stages:
        p, sp = s.placement, s.speedup
        if p is None:
            continue
        sw = p.swapped
        cells = (
            ratio(sp.estimate, sp.ci_low, sp.ci_high) if sp is not None else "–",
            ratio(sw.estimate, sw.ci_low, sw.ci_high) if sw is not None else "–",
            ratio(p.effect, p.ci_low, p.ci_high),
            ratio(p.speedup, p.speedup_ci_low, p.speedup_ci_high),
            f"{s.verdict}" + (" (PlacementEffect)" if p.demoted else ""),
        )
        rows += (
            f"<tr><th class=l>{escape(s.name)}</th>"
            + "".join(f"<td>{escape(c)}</td>" for c in cells)
            + "</tr>"
        )
    return (
        f"<p><b>Placement (crossover):</b> {escape(block.message or '')}</p><p class=muted>{rounds}</p>"
        "<table><tr><th class=l>stage</th><th>round 1</th><th>round 2 (swapped)</th><th>placement effect</th>"
        "<th>speed-up without it</th><th>verdict</th></tr>" + rows + "</table>"
    )


def _noise_floor_section(nf: NoiseFloor) -> str:
    """The A/A table: per stage, what two identical servers measured."""
    rows = []
    for s in nf.stages:
        mismatch = "–"
        if s.mismatch_rate is not None:
            mismatch = f"{s.mismatch_rate:.1%}"
            if s.mismatch_ci_low is not None and s.mismatch_ci_high is not None:
                mismatch += f" [{s.mismatch_ci_low:.1%}, {s.mismatch_ci_high:.1%}]"
            mismatch += f" ({s.mismatches}/{s.compared})"
        detectable = "–" if s.min_detectable is None else f"{s.min_detectable:.3f}x"
        speedup = "–" if s.speedup is None else f"{s.speedup:.3f}x"
        if s.speedup is not None and s.ci_low is not None and s.ci_high is not None:
            speedup += f" [{s.ci_low:.3f}, {s.ci_high:.3f}]"
        rows.append(
            f"<tr><td class=l>{escape(s.name)}</td><td class=l>{escape(s.load or '')}</td><td>{s.pairs}</td>"
            f"<td>{speedup}</td><td>{yes_no(s.equivalent)}</td>"
            f"<td>{detectable}</td><td>{yes_no(s.measurable)}</td><td>{escape(mismatch)}</td></tr>"
        )
    suggested = (
        f"<p>Suggested <code>guardrails.baselineMismatchRate: {nf.suggested_baseline_mismatch_rate:.3f}</code>"
        " for the Compare run (the upper Wilson bound of the pooled mismatch rate).</p>"
        if nf.suggested_baseline_mismatch_rate is not None
        else ""
    )
    return (
        "<h2>Noise floor (A/A)</h2><p>Both arms served without speculation. <b>min detectable</b>: the"
        " smallest speed-up each stage's design tells from 1.0 nine times in ten at the noise measured;"
        f" <b>measurable</b>: at most minSpeedup {nf.min_speedup:g}. <b>mismatch</b>: pairs of greedy"
        " outputs of identical servers that differ [Wilson interval].</p>"
        "<table><tr><th class=l>stage</th><th class=l>load</th><th>pairs</th><th>A/A speed-up [CI]</th>"
        "<th>equivalent</th><th>min detectable</th><th>measurable</th><th>mismatch [CI]</th></tr>"
        + "".join(rows)
        + "</table>"
        + suggested
        + (f"<p class=muted>{escape(nf.note)}</p>" if nf.note else "")
    )


def render_html(
    status: ExperimentStatus,
    records: Sequence[Request],
    windows: Sequence[StageWindow],
    spec: ExperimentSpec,
    *,
    name: str = "",
) -> str:
    """The whole report as one HTML string: the verdict, what weakened the measurement, the speed-up
    versus load, the recommendation, the stages, validity, provenance and the method."""
    body = [
        *_warnings(status),
        *([_noise_floor_section(status.noise_floor)] if status.noise_floor is not None else []),
        *_speedup_chart(status, spec),
        *_recommendation(status),
        *_stages(status, records),
        *_validity(status, windows),
        *_provenance(status, spec),
        _METHOD,
    ]
    return "".join([*_head(status, spec, name), *body]) + "</body></html>\n"


def _head(status: ExperimentStatus, spec: ExperimentSpec, name: str) -> list[str]:
    """The title, the verdict with its reason, why, the message and what was compared."""
    title = f"specdecode report{': ' + name if name else ''}"
    verdict = str(status.verdict) if status.verdict is not None else str(status.phase)
    return [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p>{badge(verdict)} <code>{escape(status.reason or '')}</code></p>",
        f"<p><b>why:</b> {escape(terminal.why(status, spec.analysis.require_stages))}</p>",
        f"<p>{escape(status.message or '')}</p>",
        f"<p class=muted>model {escape(spec.model)}; speculative {escape(spec.speculative.method)} "
        f"{escape(spec.speculative.model or '')} k={spec.speculative.num_speculative_tokens}"
        f"{'' if spec.speculates else ' (not used: an A/A run, analysis.mode NoiseFloor)'}; "
        f"primary metric {escape(spec.analysis.primary_metric)}; minSpeedup {spec.analysis.min_speedup:g}; "
        f"confidence {spec.analysis.confidence:g}; requireStages {escape(plain(spec.analysis.require_stages))}; "
        f"sequential {'on' if spec.analysis.sequential else 'off'}</p>",
    ]


def _warnings(status: ExperimentStatus) -> list[str]:
    """What weakened the measurement before the load: degraded speculation, arms' pods that differ."""
    body: list[str] = []
    if status.degradations:
        body.append(
            "<h2>Speculation degraded</h2><p>The treatment's vLLM logged at start-up that it weakened"
            " speculation: the speed-up below is of that weakened configuration.</p><ul>"
            + "".join(f"<li>{escape(d.kind)}: {escape(d.message)}</li>" for d in status.degradations)
            + "</ul>"
        )
    if status.arm_differences:
        body.append(
            "<h2>The arms' pods differ</h2><p>Before the load, the arms' live pods differed in more"
            " than speculation (analysis.fairness): the difference is measured as part of the speed-up."
            "</p><ul>"
            + "".join(
                f"<li>{escape(d.field)}: {escape(d.control or 'absent')} (control) vs "
                f"{escape(d.treatment or 'absent')} (treatment)</li>"
                for d in status.arm_differences
            )
            + "</ul>"
        )
    return body


def _speedup_chart(status: ExperimentStatus, spec: ExperimentSpec) -> list[str]:
    """The primary metric's speed-up per stage, with its interval, against minSpeedup."""
    metric = spec.analysis.primary_metric.value
    points = [
        svg.Interval(
            f"{s.name}",
            s.speedup.estimate,
            s.speedup.ci_low,
            s.speedup.ci_high,
            {StageVerdict.PASS: "#2b8a3e", StageVerdict.FAIL: "#c92a2a"}.get(s.verdict, "#e67700"),
        )
        for s in status.stages
        if s.speedup is not None and s.speedup.estimate is not None
    ]
    return [
        "<h2>Speed-up versus load</h2>",
        svg.intervals(
            f"{metric} speed-up (control / treatment)",
            points,
            ylabel="speed-up",
            reference=spec.analysis.min_speedup,
            reference_label=f"minSpeedup {spec.analysis.min_speedup:g}",
            width=720,
            height=360,
        ),
    ]


def _recommendation(status: ExperimentStatus) -> list[str]:
    """The break-even search's result and the recommendation, with its schedule and confirmation."""
    body: list[str] = []
    if status.search is not None:
        body.append("<h2>Break-even search</h2><p>" + escape(search.describe(status.search)) + "</p>")
    rec = status.recommendation
    if rec is not None:
        body.append("<h2>Recommendation</h2><p>" + escape(rec.note or "") + "</p>")
        if rec.num_speculative_tokens_per_batch_size is not None:
            schedule = json.dumps(rec.num_speculative_tokens_per_batch_size)
            body.append(
                "<p>Add to the speculative config:</p>"
                f"<pre>num_speculative_tokens_per_batch_size: {escape(schedule)}</pre>"
            )
        if rec.by_input_length:
            rows = "".join(
                f"<tr><td>{r.input_tokens}</td><td class=l>{escape(r.beneficial_up_to or '–')}</td>"
                f"<td class=l>{escape(json.dumps(r.num_speculative_tokens_per_batch_size) if r.num_speculative_tokens_per_batch_size is not None else '–')}</td>"
                f"<td class=l>{escape(r.note or '')}</td></tr>"
                for r in rec.by_input_length
            )
            body.append(
                "<table><tr><th>inputTokens</th><th class=l>passes up to</th><th class=l>schedule</th>"
                f"<th class=l>note</th></tr>{rows}</table>"
            )
        if rec.confirmation_reason is not None:
            body.append(f"<p>{escape(confirm.summary(rec))}</p>")
    return body


def _stages(status: ExperimentStatus, records: Sequence[Request]) -> list[str]:
    """One section per stage, after the notes that apply to all of them."""
    body = ["<h2>Stages</h2>"]
    if status.environment is not None and status.environment.prefix_caching:
        body.append(f"<p>{escape(terminal.PREFIX_CACHING_NOTE)}</p>")
    missing = telemetry.absent(status.stages)
    if missing is not None:  # GPU telemetry (issue #18): say that there is none, and why
        body.append(f"<p class=muted>{escape(missing)}</p>")
    for stage in status.stages:
        body.append(stage_section(stage, records))
    return body


def _validity(status: ExperimentStatus, windows: Sequence[StageWindow]) -> list[str]:
    """The load generator's validity block and each stage's window."""
    body = ["<h2>Validity</h2>"]
    validity = status.validity.wire() if status.validity is not None else {}
    body.append(facts_table(validity) if validity else "<p class=muted>no validity block was recorded</p>")
    if windows:
        body.append(
            "<table><tr><th class=l>stage</th><th>window s</th><th class=l>stopped early</th></tr>"
            + "".join(
                f"<tr><td class=l>{escape(w.stage)}</td><td>{w.end - w.start:.1f}</td><td class=l>{w.stopped_early}</td></tr>"
                for w in windows
            )
            + "</table>"
        )
    return body


def _provenance(status: ExperimentStatus, spec: ExperimentSpec) -> list[str]:
    """Where the arms ran, the crossover, and what was measured."""
    body = ["<h2>Provenance</h2>"]
    body.append(_hosts_section(status))
    body.append(_crossover_section(status))
    env = status.environment.wire() if status.environment is not None else {}
    env.pop("arms", None)
    env.pop("hostDifferences", None)
    prov = {
        "model": spec.model,
        "modelRevision": spec.model_revision or None,
        "speculative": spec.speculative.model_dump(mode="json", by_alias=True, exclude_none=True),
        "simulator": spec.engine.simulator.model_dump(mode="json", by_alias=True, exclude_none=True)
        if spec.engine.simulator
        else None,
        **env,
    }
    body.append(
        "<table>"
        + "".join(
            f"<tr><th class=l>{escape(k)}</th><td class=l>{escape(plain(v))}</td></tr>"
            for k, v in prov.items()
            if v not in (None, [], {})
        )
        + "</table>"
    )
    return body


#: How the figures were computed, the report's last line.
_METHOD = (
    "<p class=muted>Method: speed-up = geometric mean of per-request control/treatment ratios, "
    "with the repeated confidence interval of a group-sequential design (error spent over "
    "looks planned from the stage's request bound) when sequential analysis is on (else a paired t "
    "interval), both over blocks of the stage's sampling unit (waves, requests in flight); tails by a "
    "paired block bootstrap; error rate and output match by Clopper–Pearson.</p>"
)
