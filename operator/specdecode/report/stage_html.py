"""report.html's section for one stage: the per-arm quantile table with tail speed-ups (goodput with
SLOs), guardrails, the stage's facts, where mismatched outputs first differ, its plots and the arms' GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from specdecode.experiment import breakeven, telemetry
from specdecode.experiment.records import Request
from specdecode.experiment.spec import Arm
from specdecode.experiment.status import (
    ArmSummary,
    GuardrailResult,
    StageResult,
)
from specdecode.report import svg
from specdecode.report.formatting import badge, ci, num, plain, share


def _outcome(g: GuardrailResult) -> str:
    """The guardrail's outcome as shown: `Holds` only when the whole interval is on the safe side of
    the limit; an estimate within it whose interval crosses it is `Holds (not surely: ...)`."""
    text = str(g.outcome)
    if g.outcome != "Holds" or g.ci_low is None or g.ci_high is None:
        return text
    # goodput's limit is the largest drop of a change (treatment - control): the line is at -limit
    line = -g.limit if g.name == "goodput" else g.limit
    if g.ci_low < line < g.ci_high:
        return f"{text} (not surely: the interval crosses {num(line, 4)})"
    return text


def _goodput(arm: ArmSummary) -> str:
    g = arm.goodput
    if g is None or g.fraction is None:
        return "–"
    bound = f" [{g.ci_low:.0%}, {g.ci_high:.0%}]" if g.ci_low is not None and g.ci_high is not None else ""
    rate = f"; {num(g.per_second)}/s" if g.per_second is not None else ""
    return f"{g.fraction:.1%}{bound}{rate}"


def _has_hits(*arms: ArmSummary) -> bool:
    return any(arm.prefix_cache_hit_rate is not None for arm in arms)


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
    for name, arm in ((Arm.CONTROL, stage.control), (Arm.TREATMENT, stage.treatment)):
        cells = [
            num(getattr(arm, f"{m}_{q}")) for m in ("ttft", "tpot", "e2e") for q in ("p50", "p90", "p99")
        ]
        rows.append(
            f"<tr><td class=l>{name}</td><td>{arm.requests}</td><td>{arm.errors}</td>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + f"<td>{num(arm.output_tokens_per_second, 4)}</td>"
            + (f"<td>{escape(_goodput(arm))}</td>" if goodput else "")
            + (f"<td>{share(arm.prefix_cache_hit_rate)}</td>" if hits else "")
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
            cells.append(num(c / t if c and t else None))
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
            f" [{num(g.difference_ci_low)}, {num(g.difference_ci_high)}]"
            if g.difference_ci_low is not None and g.difference_ci_high is not None
            else ""
        )
        parts.append(f"p90 {num(g.difference, sign=True)} ms{bound}, tolerance {num(g.tolerance, 4)} ms")
    if g.name.startswith("slo"):
        parts.append("treatment percentile vs the SLO, ms")
    if g.name == "goodput":
        parts.append(
            "change in the fraction meeting every SLO (treatment - control); limit: the largest drop"
        )
    if g.note:
        parts.append(g.note)
    return "; ".join(parts)


def facts_table(facts: dict[str, object]) -> str:
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
            f"<tr><th class=l>{escape(k)}</th><td class=l>{escape(plain(v))}</td></tr>" for k, v in rows
        )
        + "</table>"
    )


#: mismatched pairs shown per stage, and characters of context around the divergence


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
    arms: dict[Arm, dict[int, Request]] = {arm: {} for arm in Arm}
    for r in records:
        if r.stage == stage.name and not r.warmup and r.ok and r.arm in arms:
            arms[r.arm][r.index] = r
    rows: list[str] = []
    count = 0
    for i in sorted(arms[Arm.CONTROL].keys() & arms[Arm.TREATMENT].keys()):
        c, t = arms[Arm.CONTROL][i], arms[Arm.TREATMENT][i]
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


def stage_section(stage: StageResult, records: Sequence[Request]) -> str:
    sp = stage.speedup
    out = [
        f"<h3>{escape(stage.name)} <span class=muted>({escape(stage.load or '')})</span> {badge(stage.verdict)}</h3>"
    ]
    if sp is not None:
        out.append(
            f"<p>{escape(sp.metric)} speed-up <b>{escape(ci(sp.estimate, sp.ci_low, sp.ci_high))}</b> "
            f"from {sp.n} pairs ({escape(sp.method or '')}"
            + (f", decided at the look after {sp.decided_at}" if sp.decided_at not in (None, sp.n) else "")
            + f"; p = {num(sp.p_value, 2)})"
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
                f"<tr><td class=l>{escape(t.metric)} p{t.quantile * 100:g}</td><td>{escape(ci(t.estimate, t.ci_low, t.ci_high))}</td></tr>"
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
                    f"<td>{escape(ci(c.speedup, c.ci_low, c.ci_high))}</td>"
                    f"<td>{num(c.acceptance_rate)}</td><td>{num(c.mean_length)}</td></tr>"
                    for c in groups
                )
                + f"</table><p class=muted>{what}: paired t intervals, informative (they do not decide)</p>"
            )
    if stage.guardrails:
        out.append(
            "<table><tr><th class=l>guardrail</th><th>estimate</th><th>interval</th><th>limit</th>"
            "<th class=l>outcome</th><th class=l>note</th></tr>"
            + "".join(
                f"<tr><td class=l>{escape(g.name)}</td><td>{num(g.estimate)}</td>"
                f"<td>[{num(g.ci_low)}, {num(g.ci_high)}]</td><td>{num(g.limit, 4)}</td><td class=l>{escape(_outcome(g))}</td>"
                f"<td class=l>{escape(_guardrail_note(g))}</td></tr>"
                for g in stage.guardrails
            )
            + "</table>"
        )
    out.append(_mismatches(stage, records))
    acc = stage.acceptance
    if acc is not None:
        out.append(
            f"<p>acceptance rate {num(acc.rate)} (source {escape(acc.source or '–')}), mean length "
            f"{num(acc.mean_length)}; estimates: {escape(plain(acc.sources))}"
            + ("" if acc.agreement is None else (" — agree" if acc.agreement else " — <b>DISAGREE</b>"))
            + "</p>"
        )
    if stage.break_even is not None:
        out.append(f"<p><b>break-even</b>: {escape(breakeven.describe(stage.name, stage.break_even))}</p>")
    out.append(_gpu_table(stage))
    mine = [r for r in records if r.stage == stage.name and not r.warmup and r.ok]
    plots = []
    for metric, attr in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms")):
        series: dict[str, list[float]] = {
            arm: [getattr(r, attr) for r in mine if r.arm == arm and getattr(r, attr) is not None]
            for arm in Arm
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
            f"<td>{num(None if g is None else getattr(g, key))}</td>"
            for key in ("utilization_mean", "memory_used_mean_mib", "memory_used_max_mib", "power_mean_watts")
        )
        + "</tr>"
        for arm, g in ((Arm.CONTROL, gpu.control), (Arm.TREATMENT, gpu.treatment))
    )
    return (
        f"<table><caption>GPU per arm ({escape(gpu.source)}, per GPU)</caption><tr><th class=l>arm</th>"
        "<th>GPUs</th><th>util mean %</th><th>memory mean MiB</th><th>memory max MiB</th>"
        "<th>power mean W</th></tr>" + rows + "</table>"
    )
