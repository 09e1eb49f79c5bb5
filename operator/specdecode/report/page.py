"""report.html: one self-contained page (inline CSS and SVG, no scripts, no network) per experiment.

Sections: the verdict and why; the noise-floor table of an A/A run; speed-up versus load with confidence bars; per-stage tables of TTFT,
TPOT and E2E quantiles per arm (goodput with SLOs) with tail speed-ups, per-category speed-up and
acceptance, guardrails, and where mismatched outputs first differ; latency CDFs per arm and stage;
acceptance per draft position (each source); the validity block; provenance.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape

from specdecode.experiment import breakeven, confirm, kvcache, placement, search, telemetry
from specdecode.experiment.records import Request, StageWindow
from specdecode.experiment.spec import ExperimentSpec
from specdecode.experiment.status import (
    ArmSummary,
    ExperimentStatus,
    GuardrailResult,
    NoiseFloor,
    StageResult,
    StageVerdict,
)
from specdecode.report import svg, terminal

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


def _num(v: float | None, digits: int = 3, *, sign: bool = False) -> str:
    """`digits` significant digits, never an exponent: 1260 ms reads `1,260`, not `1.26e+03`."""
    if v is None or not math.isfinite(v):
        return "–"
    plus = "+" if sign else ""
    if abs(v) >= 10 ** (digits - 1):
        return f"{v:{plus},.0f}"
    text = f"{v:{plus}.{digits}g}"
    if "e" in text:  # tiny: as many decimals as the digits need
        decimals = digits - 1 - math.floor(math.log10(abs(v)))
        text = f"{v:{plus}.{decimals}f}"
    return text


def _plain(value: object) -> str:
    """A provenance or validity value in words: no JSON (`key value; ...`, lists comma-separated)."""
    if isinstance(value, dict):
        return "; ".join(f"{k} {_plain(v)}" for k, v in value.items() if v not in (None, [], {}))
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return _num(value, 4)
    return str(value)


def _outcome(g: GuardrailResult) -> str:
    """The guardrail's outcome as shown: `Holds` only when the whole interval is on the safe side of
    the limit; an estimate within it whose interval crosses it is `Holds (not surely: ...)`."""
    text = str(g.outcome)
    if g.outcome != "Holds" or g.ci_low is None or g.ci_high is None:
        return text
    # goodput's limit is the largest drop of a change (treatment - control): the line is at -limit
    line = -g.limit if g.name == "goodput" else g.limit
    if g.ci_low < line < g.ci_high:
        return f"{text} (not surely: the interval crosses {_num(line, 4)})"
    return text


def _ci(est: float | None, low: float | None, high: float | None, suffix: str = "x") -> str:
    if est is None:
        return "–"
    if low is None or high is None:
        return f"{est:.2f}{suffix}"
    return f"{est:.2f}{suffix} [{low:.2f}, {high:.2f}]"


def _badge(text: str) -> str:
    return f'<span class="verdict {escape(text)}">{escape(text)}</span>'


def _goodput(arm: ArmSummary) -> str:
    g = arm.goodput
    if g is None or g.fraction is None:
        return "–"
    bound = f" [{g.ci_low:.0%}, {g.ci_high:.0%}]" if g.ci_low is not None and g.ci_high is not None else ""
    rate = f"; {_num(g.per_second)}/s" if g.per_second is not None else ""
    return f"{g.fraction:.1%}{bound}{rate}"


def _has_hits(*arms: ArmSummary) -> bool:
    return any(arm.prefix_cache_hit_rate is not None for arm in arms)


def _share(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def _arm_table(stage: StageResult) -> str:
    rows = []
    goodput = stage.control.goodput is not None or stage.treatment.goodput is not None
    hits = _has_hits(stage.control, stage.treatment)
    header = (
        "<tr><th class=l>arm</th><th>requests</th><th>errors</th>"
        + "".join(f"<th>{m} {q}</th>" for m in ("TTFT", "TPOT", "E2E") for q in ("p50", "p90", "p99"))
        + "<th>output tok/s</th>"
        + ("<th>goodput</th>" if goodput else "")
        + ("<th>prefix-cache hits</th>" if hits else "")
        + "</tr>"
    )
    for name, arm in (("control", stage.control), ("treatment", stage.treatment)):
        cells = [
            _num(getattr(arm, f"{m}_{q}")) for m in ("ttft", "tpot", "e2e") for q in ("p50", "p90", "p99")
        ]
        rows.append(
            f"<tr><td class=l>{name}</td><td>{arm.requests}</td><td>{arm.errors}</td>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + f"<td>{_num(arm.output_tokens_per_second, 4)}</td>"
            + (f"<td>{escape(_goodput(arm))}</td>" if goodput else "")
            + (f"<td>{_share(arm.prefix_cache_hit_rate)}</td>" if hits else "")
            + "</tr>"
        )
    note = "latencies in ms, successful requests only; output tok/s over each arm's own active time"
    if goodput:
        note += "; goodput: requests meeting every SLO [interval], and per second"
    if hits:
        note += "; prefix-cache hits: the arm's prompt tokens served from its prefix cache (server metrics)"
    return f"<table>{header}{''.join(rows)}</table><p class=muted>{note}</p>"


def _speedup_ratio_row(control: ArmSummary, treatment: ArmSummary) -> str:
    cells = []
    for m in ("ttft", "tpot", "e2e"):
        for q in ("p50", "p90", "p99"):
            c, t = getattr(control, f"{m}_{q}"), getattr(treatment, f"{m}_{q}")
            cells.append(_num(c / t if c and t else None))
    return (
        "<tr><td class=l>control / treatment</td><td></td><td></td>"
        + "".join(f"<td>{c}</td>" for c in cells)
        + "<td></td>"
        + ("<td></td>" if control.goodput is not None or treatment.goodput is not None else "")
        + ("<td></td>" if _has_hits(control, treatment) else "")
        + "</tr>"
    )


def _guardrail_note(g: GuardrailResult) -> str:
    parts = []
    if g.difference is not None and g.tolerance is not None:
        bound = (
            f" [{_num(g.difference_ci_low)}, {_num(g.difference_ci_high)}]"
            if g.difference_ci_low is not None and g.difference_ci_high is not None
            else ""
        )
        parts.append(f"p90 {_num(g.difference, sign=True)} ms{bound}, tolerance {_num(g.tolerance, 4)} ms")
    if g.name.startswith("slo"):
        parts.append("treatment percentile vs the SLO, ms")
    if g.name == "goodput":
        parts.append(
            "change in the fraction meeting every SLO (treatment - control); limit: the largest drop"
        )
    if g.note:
        parts.append(g.note)
    return "; ".join(parts)


def _facts_table(facts: dict[str, object]) -> str:
    """A dict (the validity block) as a two-column table, nested keys one row each, no JSON."""
    rows: list[tuple[str, object]] = []

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix} {k}".strip(), v)
        elif value not in (None, [], {}):
            rows.append((prefix, value))

    walk("", facts)
    return (
        "<table>"
        + "".join(
            f"<tr><th class=l>{escape(k)}</th><td class=l>{escape(_plain(v))}</td></tr>" for k, v in rows
        )
        + "</table>"
    )


#: mismatched pairs shown per stage, and characters of context around the divergence
MISMATCHES_SHOWN = 5
_BEFORE, _AFTER = 30, 50


def _around(text: str, at: int) -> str:
    start = max(0, at - _BEFORE)
    head = ("…" if start else "") + escape(text[start:at])
    tail = text[at : at + _AFTER]
    return f"{head}<b>{escape(tail)}</b>" + ("…" if at + _AFTER < len(text) else "")


def _mismatches(stage: StageResult, records: Sequence[Request]) -> str:
    """Where the treatment's greedy output first differs from the control's, for a few pairs."""
    arms: dict[str, dict[int, Request]] = {"control": {}, "treatment": {}}
    for r in records:
        if r.stage == stage.name and not r.warmup and r.ok and r.arm in arms:
            arms[r.arm][r.index] = r
    rows: list[str] = []
    count = 0
    for i in sorted(arms["control"].keys() & arms["treatment"].keys()):
        c, t = arms["control"][i], arms["treatment"][i]
        ck, tk = c.text_hash or c.text, t.text_hash or t.text
        if ck is None or tk is None or ck == tk:
            continue
        count += 1
        if len(rows) == MISMATCHES_SHOWN:
            continue
        at = t.diverges_at if t.diverges_at is not None else c.diverges_at
        if at is None and c.text is not None and t.text is not None:
            pairs = zip(c.text, t.text, strict=False)
            at = next((k for k, (x, y) in enumerate(pairs) if x != y), min(len(c.text), len(t.text)))
        if at is None or c.text is None or t.text is None:
            cells = "<td class='l muted' colspan=2>texts not kept (hashes differ)</td>"
        else:
            cells = f"<td class=l>{_around(c.text, at)}</td><td class=l>{_around(t.text, at)}</td>"
        rows.append(
            f"<tr><td>{i}</td><td class=l>{escape(t.prompt_id)}</td><td>{'–' if at is None else at}</td>{cells}</tr>"
        )
    if not rows:
        return ""
    return (
        f"<p>{count} paired output(s) differ under the same prompt; the first {len(rows)}, from the first"
        " differing character (bold):</p><table><tr><th>index</th><th class=l>prompt</th><th>differs at</th>"
        "<th class=l>control</th><th class=l>treatment</th></tr>" + "".join(rows) + "</table>"
    )


def _stage_section(stage: StageResult, records: Sequence[Request]) -> str:
    sp = stage.speedup
    out = [
        f"<h3>{escape(stage.name)} <span class=muted>({escape(stage.load or '')})</span> {_badge(stage.verdict)}</h3>"
    ]
    if sp is not None:
        out.append(
            f"<p>{escape(sp.metric)} speed-up <b>{escape(_ci(sp.estimate, sp.ci_low, sp.ci_high))}</b> "
            f"from {sp.n} pairs ({escape(sp.method or '')}"
            + (f", decided at the look after {sp.decided_at}" if sp.decided_at not in (None, sp.n) else "")
            + f"; p = {_num(sp.p_value, 2)})"
            + (" — stopped early by the sequential rule" if stage.stopped_early else "")
            + (
                f"; noise floor {sp.min_detectable:.2f}x (the smallest speed-up this stage shows 9 times in 10)"
                if sp.min_detectable is not None
                else ""
            )
            + (f"; ~{stage.batch_size:.1f} running requests" if stage.batch_size is not None else "")
            + "</p>"
        )
    if stage.reasons:
        out.append("<ul>" + "".join(f"<li>{escape(r)}</li>" for r in stage.reasons) + "</ul>")
    table = _arm_table(stage)
    out.append(table.replace("</table>", _speedup_ratio_row(stage.control, stage.treatment) + "</table>", 1))
    if stage.tails:
        out.append(
            "<table><tr><th class=l>quantile</th><th>speed-up [CI]</th></tr>"
            + "".join(
                f"<tr><td class=l>{escape(t.metric)} p{t.quantile * 100:g}</td><td>{escape(_ci(t.estimate, t.ci_low, t.ci_high))}</td></tr>"
                for t in stage.tails
            )
            + "</table>"
        )
    for column, groups, what in (
        ("category", stage.categories, "per prompt category"),
        ("turn", stage.turns, "per turn of the sessions (later turns repeat the earlier ones)"),
    ):
        if groups:
            out.append(
                f"<table><tr><th class=l>{column}</th><th>pairs</th><th>speed-up [CI]</th>"
                "<th>acceptance rate</th><th>mean acceptance length</th></tr>"
                + "".join(
                    f"<tr><td class=l>{escape(c.name)}</td><td>{c.pairs}</td>"
                    f"<td>{escape(_ci(c.speedup, c.ci_low, c.ci_high))}</td>"
                    f"<td>{_num(c.acceptance_rate)}</td><td>{_num(c.mean_length)}</td></tr>"
                    for c in groups
                )
                + f"</table><p class=muted>{what}: paired t intervals, informative (they do not decide)</p>"
            )
    if stage.guardrails:
        out.append(
            "<table><tr><th class=l>guardrail</th><th>estimate</th><th>interval</th><th>limit</th>"
            "<th class=l>outcome</th><th class=l>note</th></tr>"
            + "".join(
                f"<tr><td class=l>{escape(g.name)}</td><td>{_num(g.estimate)}</td>"
                f"<td>[{_num(g.ci_low)}, {_num(g.ci_high)}]</td><td>{_num(g.limit, 4)}</td><td class=l>{escape(_outcome(g))}</td>"
                f"<td class=l>{escape(_guardrail_note(g))}</td></tr>"
                for g in stage.guardrails
            )
            + "</table>"
        )
    out.append(_mismatches(stage, records))
    acc = stage.acceptance
    if acc is not None:
        out.append(
            f"<p>acceptance rate {_num(acc.rate)} (source {escape(acc.source or '–')}), mean length "
            f"{_num(acc.mean_length)}; estimates: {escape(_plain(acc.sources))}"
            + ("" if acc.agreement is None else (" — agree" if acc.agreement else " — <b>DISAGREE</b>"))
            + "</p>"
        )
    if stage.break_even is not None:
        out.append(f"<p><b>break-even</b>: {escape(breakeven.describe(stage.name, stage.break_even))}</p>")
    out.append(_gpu_table(stage))
    mine = [r for r in records if r.stage == stage.name and not r.warmup and r.ok]
    plots = []
    for metric, attr in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms")):
        series = {
            arm: [getattr(r, attr) for r in mine if r.arm == arm and getattr(r, attr) is not None]
            for arm in ("control", "treatment")
        }
        plots.append(svg.cdf(f"{metric} at {stage.name}", series, xlabel=f"{metric} ms"))
    if acc is not None and acc.per_position:
        plots.append(
            svg.bars(
                f"acceptance per draft position at {stage.name}",
                {acc.source or "": acc.per_position},
                xlabel="draft position",
                ylabel="accepted fraction",
            )
        )
    out.append('<div class="plots">' + "".join(plots) + "</div>")
    return "".join(out)


def _gpu_table(stage: StageResult) -> str:
    """The arms' GPUs in the stage (DCGM exporter, per GPU); nothing when none was reported."""
    gpu = stage.gpu
    if gpu is None or gpu.source != telemetry.SOURCE:
        return ""
    rows = "".join(
        f"<tr><th class=l>{arm}</th><td>{'–' if g is None else g.gpus}</td>"
        + "".join(
            f"<td>{_num(None if g is None else getattr(g, key))}</td>"
            for key in ("utilization_mean", "memory_used_mean_mib", "memory_used_max_mib", "power_mean_watts")
        )
        + "</tr>"
        for arm, g in (("control", gpu.control), ("treatment", gpu.treatment))
    )
    return (
        f"<table><caption>GPU per arm ({escape(gpu.source)}, per GPU)</caption><tr><th class=l>arm</th>"
        "<th>GPUs</th><th>util mean %</th><th>memory mean MiB</th><th>memory max MiB</th>"
        "<th>power mean W</th></tr>" + rows + "</table>"
    )


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
        + "".join(f"<td class=l>{escape(_fact(side.get(k)))}</td>" for side in (control, treatment))
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


def _ratio(estimate: float | None, low: float | None, high: float | None) -> str:
    if estimate is None:
        return "–"
    return f"{estimate:.3f}x" + (f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else "")


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
            _ratio(sp.estimate, sp.ci_low, sp.ci_high) if sp is not None else "–",
            _ratio(sw.estimate, sw.ci_low, sw.ci_high) if sw is not None else "–",
            _ratio(p.effect, p.ci_low, p.ci_high),
            _ratio(p.speedup, p.speedup_ci_low, p.speedup_ci_high),
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


def _yes_no(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


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
            f"<td>{speedup}</td><td>{_yes_no(s.equivalent)}</td>"
            f"<td>{detectable}</td><td>{_yes_no(s.measurable)}</td><td>{escape(mismatch)}</td></tr>"
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


def _fact(value: object) -> str:
    if value is None:
        return "–"
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def render_html(
    status: ExperimentStatus,
    records: Sequence[Request],
    windows: Sequence[StageWindow],
    spec: ExperimentSpec,
    *,
    name: str = "",
) -> str:
    """The whole report as one HTML string."""
    title = f"specdecode report{': ' + name if name else ''}"
    verdict = str(status.verdict) if status.verdict is not None else str(status.phase)
    head = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p>{_badge(verdict)} <code>{escape(status.reason or '')}</code></p>",
        f"<p><b>why:</b> {escape(terminal.why(status, spec.analysis.require_stages))}</p>",
        f"<p>{escape(status.message or '')}</p>",
        f"<p class=muted>model {escape(spec.model)}; speculative {escape(spec.speculative.method)} "
        f"{escape(spec.speculative.model or '')} k={spec.speculative.num_speculative_tokens}"
        f"{'' if spec.speculates else ' (not used: an A/A run, analysis.mode NoiseFloor)'}; "
        f"primary metric {escape(spec.analysis.primary_metric)}; minSpeedup {spec.analysis.min_speedup:g}; "
        f"confidence {spec.analysis.confidence:g}; requireStages {escape(_plain(spec.analysis.require_stages))}; "
        f"sequential {'on' if spec.analysis.sequential else 'off'}</p>",
    ]
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
    if status.noise_floor is not None:
        body.append(_noise_floor_section(status.noise_floor))
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
    body.append("<h2>Speed-up versus load</h2>")
    body.append(
        svg.intervals(
            f"{metric} speed-up (control / treatment)",
            points,
            ylabel="speed-up",
            reference=spec.analysis.min_speedup,
            reference_label=f"minSpeedup {spec.analysis.min_speedup:g}",
            width=720,
            height=360,
        )
    )
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
    body.append("<h2>Stages</h2>")
    if status.environment is not None and status.environment.prefix_caching:
        body.append(f"<p>{escape(terminal.PREFIX_CACHING_NOTE)}</p>")
    missing = telemetry.absent(status.stages)
    if missing is not None:  # GPU telemetry (issue #18): say that there is none, and why
        body.append(f"<p class=muted>{escape(missing)}</p>")
    for stage in status.stages:
        body.append(_stage_section(stage, records))
    body.append("<h2>Validity</h2>")
    body.append(
        _facts_table(status.validity)
        if status.validity
        else "<p class=muted>no validity block was recorded</p>"
    )
    if windows:
        body.append(
            "<table><tr><th class=l>stage</th><th>window s</th><th class=l>stopped early</th></tr>"
            + "".join(
                f"<tr><td class=l>{escape(w.stage)}</td><td>{w.end - w.start:.1f}</td><td class=l>{w.stopped_early}</td></tr>"
                for w in windows
            )
            + "</table>"
        )
    body.append("<h2>Provenance</h2>")
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
            f"<tr><th class=l>{escape(k)}</th><td class=l>{escape(_plain(v))}</td></tr>"
            for k, v in prov.items()
            if v not in (None, [], {})
        )
        + "</table>"
    )
    body.append(
        "<p class=muted>Method: speed-up = geometric mean of per-request control/treatment ratios, "
        "with the repeated confidence interval of a group-sequential design (error spent over "
        "looks planned from the stage's request bound) when sequential analysis is on (else a paired t "
        "interval); tails by paired bootstrap; error rate and output match by Clopper–Pearson.</p>"
    )
    return "".join(head + body) + "</body></html>\n"
