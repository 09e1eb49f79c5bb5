"""The terminal summary: the verdict on a line of its own, one line saying why (which stages
`requireStages` needed and what they got), the message, then the stage tables (speed-up, then
latencies; one per prompt category when the prompts carry categories, one per turn of multi-turn
sessions, and the noise-floor table of an A/A run) and the recommendation.

Readable at 80 columns and in logs (no tty): the tables have no vertical borders, headers and cells
wrap at spaces or fold instead of being cut to `…`, and a blank line separates the verdict block from
the first table.
"""

from __future__ import annotations

from collections.abc import Callable

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from specdecode.experiment import (
    breakeven,
    confirm,
    degradations,
    fairness,
    kvcache,
    placement,
    search,
    spec,
    telemetry,
)
from specdecode.experiment.status import (
    CategoryResult,
    ExperimentStatus,
    Goodput,
    NoiseFloor,
    StageResult,
    StageVerdict,
)

_STYLE = {
    "Promote": "bold green",
    "Pass": "green",
    "Reject": "bold red",
    "Fail": "red",
    "Inconclusive": "yellow",
    "Failed": "bold white on red",
}


def _n(v: float | None, fmt: str = ".1f") -> str:
    return "–" if v is None else format(v, fmt)


def _pct(g: Goodput | None) -> str:
    return "–" if g is None or g.fraction is None else f"{g.fraction:.0%}"


def _ci(est: float | None, low: float | None, high: float | None, fmt: str, suffix: str) -> str:
    if est is None:
        return "–"
    text = f"{format(est, fmt)}{suffix}"
    if low is not None and high is not None:
        text += f" [{format(low, fmt)}, {format(high, fmt)}]"
    return text


def _flag(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def _table(title: str, columns: tuple[str, ...], *, left: frozenset[str] = frozenset({"stage"})) -> Table:
    """A table that stays readable when narrow: a rule under the header and no vertical borders; a
    header or cell too wide wraps at spaces and folds a long word, never cut to `…`."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_lines=False)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right", overflow="fold")
    return table


def noise_floor_table(nf: NoiseFloor) -> Table:
    """Per stage of an A/A run: speed-up [CI], min detectable, measurable, mismatch rate [CI]."""
    table = _table(
        f"noise floor (A/A; measurable: min detectable <= minSpeedup {nf.min_speedup:g})",
        ("stage", "pairs", "A/A speed-up [CI]", "min detectable", "measurable", "mismatch [CI]"),
    )
    for s in nf.stages:
        pct = [
            None if v is None else 100 * v for v in (s.mismatch_rate, s.mismatch_ci_low, s.mismatch_ci_high)
        ]
        table.add_row(
            s.name,
            str(s.pairs),
            _ci(s.speedup, s.ci_low, s.ci_high, ".3f", "x"),
            "–" if s.min_detectable is None else f"{s.min_detectable:.3f}x",
            Text(
                _flag(s.measurable),
                style="" if s.measurable is None else ("green" if s.measurable else "red"),
            ),
            _ci(pct[0], pct[1], pct[2], ".1f", "%"),
        )
    return table


def render_terminal(
    status: ExperimentStatus, *, require_stages: str | list[str] | None = None
) -> RenderableType:
    """A rich renderable: the verdict line, why, the message; the stage tables; the recommendation.

    `require_stages`: the spec's `analysis.requireStages`, which the why-line names (None: unknown).
    """
    verdict = str(status.verdict) if status.verdict is not None else str(status.phase)
    head = Text.assemble(
        ("verdict: " if status.verdict is not None else "phase: ", "bold"),
        (verdict, _STYLE.get(verdict, "bold")),
    )
    if status.reason:
        head.append_text(Text.assemble(" (", (status.reason, "cyan"), ")"))
    lines: list[RenderableType] = [head, Text("why: " + why(status, require_stages))]
    if status.message:
        lines.append(Text(status.message))
    lines.append(Text(""))
    speed = _table("speed-up per stage", ("stage", "load", "pairs", "speed-up [CI]", "verdict"), left=_LEFT)
    goodput = any(s.control.goodput is not None or s.treatment.goodput is not None for s in status.stages)
    hits = any(
        s.control.prefix_cache_hit_rate is not None or s.treatment.prefix_cache_hit_rate is not None
        for s in status.stages
    )
    latency = _table(
        "per stage, control / treatment (times in ms)",
        (
            "stage",
            "TPOT p50",
            "TTFT p90",
            "errors",
            *(["goodput"] if goodput else []),
            *(["prefix-cache hits"] if hits else []),
            "acceptance",
            "output match",
        ),
    )
    for s in status.stages:
        sp = s.speedup
        acc = s.acceptance
        speed.add_row(
            s.name,
            s.load or "",
            str(sp.n if sp else 0),
            "–" if sp is None else _interval(sp.estimate, sp.ci_low, sp.ci_high),
            Text(
                str(s.verdict) + (" (early)" if s.stopped_early else ""), style=_STYLE.get(str(s.verdict), "")
            ),
        )
        latency.add_row(
            s.name,
            f"{_ms(s.control.tpot_p50)} / {_ms(s.treatment.tpot_p50)}",
            f"{_ms(s.control.ttft_p90)} / {_ms(s.treatment.ttft_p90)}",
            f"{s.control.errors} / {s.treatment.errors}",
            *([f"{_pct(s.control.goodput)} / {_pct(s.treatment.goodput)}"] if goodput else []),
            *(
                [f"{_rate(s.control.prefix_cache_hit_rate)} / {_rate(s.treatment.prefix_cache_hit_rate)}"]
                if hits
                else []
            ),
            "–"
            if acc is None or acc.rate is None
            else f"{acc.rate:.2f}" + ("" if acc.agreement is not False else " !"),
            "–" if s.output_match is None else f"{s.output_match:.1%}",
        )
    table: RenderableType = Group(speed, latency) if status.stages else Text("no stage measured")
    parts: list[RenderableType] = [*lines, table]
    if status.degradations:
        parts.append(
            Text("speculation degraded: " + degradations.summary(status.degradations), style="yellow")
        )
    if status.arm_differences:
        parts.append(
            Text("the arms' pods differ: " + fairness.summary(status.arm_differences), style="yellow")
        )
    for s in status.stages:
        if s.break_even is not None:
            parts.append(Text("break-even: " + breakeven.describe(s.name, s.break_even), style="yellow"))
    if status.noise_floor is not None:
        parts.append(noise_floor_table(status.noise_floor))
        if status.noise_floor.suggested_baseline_mismatch_rate is not None:
            rate = status.noise_floor.suggested_baseline_mismatch_rate
            parts.append(Text(f"suggested for the Compare run: guardrails.baselineMismatchRate: {rate:.3f}"))
    env = status.environment
    if env is not None and env.prefix_caching:
        parts.append(Text(PREFIX_CACHING_NOTE))
    if env is not None and env.vllm_rules is not None and env.simulator is None:
        parts.append(
            Text(f"vLLM release: {env.vllm_rules}", style="" if "assumed" not in env.vllm_rules else "yellow")
        )

    if env is not None:
        parts.extend(
            Text(line, style="yellow" if "likely cause" in line else "")
            for line in kvcache.summary(env.arms, status.stages)
        )
    parts.extend(Text(line) for line in telemetry.summary(status.stages))
    if env is not None and env.arms is not None:
        where = {
            arm: host.node
            for arm, host in ((spec.Arm.CONTROL, env.arms.control), (spec.Arm.TREATMENT, env.arms.treatment))
            if host is not None and host.node
        }
        if where:
            parts.append(Text("hosts: " + ", ".join(f"{arm} on {node}" for arm, node in where.items())))
        warning = placement.warning(env)
        if warning is not None:
            parts.append(Text(f"placement: {warning}", style="yellow"))
    parts.extend(_crossover(status))
    if status.search is not None:
        parts.append(Text(search.describe(status.search)))
    rec = status.recommendation
    if rec is not None:
        line = f"recommendation: {rec.note or ''}"
        if rec.num_speculative_tokens_per_batch_size is not None:
            line += f"; num_speculative_tokens_per_batch_size={rec.num_speculative_tokens_per_batch_size}"
        parts.append(Text(line))
        for by_length in rec.by_input_length:
            own = by_length.num_speculative_tokens_per_batch_size
            parts.append(
                Text(
                    f"  inputTokens {by_length.input_tokens}: {by_length.note or ''}"
                    + (f"; num_speculative_tokens_per_batch_size={own}" if own is not None else "")
                )
            )
        if rec.confirmation_reason is not None:
            parts.append(Text(confirm.summary(rec), style="green" if rec.confirmed else "yellow"))
    if any(s.categories for s in status.stages):
        parts.append(
            _groups_table(status, "per prompt category (informative)", "category", lambda s: s.categories)
        )
    if any(s.turns for s in status.stages):
        parts.append(
            _groups_table(status, "per turn of the sessions (informative)", "turn", lambda s: s.turns)
        )
    return Group(*parts)


def _groups_table(
    status: ExperimentStatus, title: str, column: str, groups: Callable[[StageResult], list[CategoryResult]]
) -> Table:
    """One row per stage and group (a prompt category, a session's turn): pairs, speed-up, acceptance."""
    table = _table(
        title, ("stage", column, "pairs", "speed-up [CI]", "acceptance"), left=frozenset({"stage", column})
    )
    for s in status.stages:
        for c in groups(s):
            ci = "–" if c.speedup is None else f"{c.speedup:.2f}x"
            if c.speedup is not None and c.ci_low is not None and c.ci_high is not None:
                ci += f" [{c.ci_low:.2f}, {c.ci_high:.2f}]"
            table.add_row(s.name, c.name, str(c.pairs), ci, _n(c.acceptance_rate, ".2f"))
    return table


_LEFT = frozenset({"stage", "load", "verdict"})


#: said wherever the arms ran with prefix caching (multi-turn sessions turn it on for both)
PREFIX_CACHING_NOTE = (
    "prefix caching: on in both arms (--enable-prefix-caching); later turns of a session reuse the "
    "earlier turns' cached prefix, and each arm's hit rate is its own (prompt tokens served from cache)"
)


def _rate(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def _ms(v: float | None) -> str:
    """Milliseconds as shown: two decimals below 100 ms, one below 1000, whole above (no exponent)."""
    if v is None:
        return "–"
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}" if abs(v) < 1000 else f"{v:,.0f}"


def why(status: ExperimentStatus, require: str | list[str] | None) -> str:
    """One line: why the verdict is what it is (the stages `requireStages` needed and what they got)."""
    verdicts = {s.name: s.verdict for s in status.stages}
    listed = ", ".join(f"{name} {v}" for name, v in verdicts.items()) or "none"
    if status.verdict is None:
        return (
            f"no verdict: the run ended {status.phase} ({status.reason or 'no reason given'}); "
            f"stage verdicts so far: {listed}"
        )
    if status.reason == "NoiseFloor":
        return "an A/A run (analysis.mode NoiseFloor) measures the noise floor; it judges no stage"
    if status.reason == "OutputMismatch":
        bad = [
            s.name
            for s in status.stages
            for g in s.guardrails
            if g.name == "outputMatch" and g.outcome in {"Breached", "SurelyBreached"}
        ]
        return (
            f"outputs differ beyond the allowed rate at {', '.join(bad) or 'a stage'}: any mismatch rejects"
        )
    if require is None:
        return f"stage verdicts: {listed}"
    if require == "any":
        passed = [n for n, v in verdicts.items() if v is StageVerdict.PASS]
        if passed:
            return f"requireStages any needs one stage to Pass: {', '.join(passed)} passed ({listed})"
        if verdicts and all(v is StageVerdict.FAIL for v in verdicts.values()):
            return f"requireStages any rejects when every stage fails, and every stage failed ({listed})"
        return f"requireStages any needs one stage to Pass, and none did ({listed})"
    needed = list(verdicts) if require == "all" else list(require)
    spec_words = "all" if require == "all" else "[" + ", ".join(require) + "]"
    got = ", ".join(f"{n} {verdicts[n]}" if n in verdicts else f"{n} not measured" for n in needed)
    return f"requireStages {spec_words} needs Pass at {', '.join(needed) or 'every stage'}: {got}"


def _interval(estimate: float | None, low: float | None, high: float | None) -> str:
    if estimate is None:
        return "–"
    return f"{estimate:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


def _crossover(status: ExperimentStatus) -> list[RenderableType]:
    """The Placement section: the crossover's rounds and the placement effect per stage, or why it did not run."""
    block = status.crossover
    if block is None:
        return []
    if not block.ran:
        return [Text(f"placement: crossover not run ({block.reason}): {block.message or ''}", style="yellow")]
    table = _table(
        "Placement (crossover: the arms' placements swapped)",
        ("stage", "round 1", "round 2 (swapped)", "placement effect", "speed-up without it", "verdict"),
        left=frozenset({"stage", "verdict"}),
    )
    for s in status.stages:
        p, sp = s.placement, s.speedup
        if p is None:
            continue
        swapped = p.swapped
        table.add_row(
            s.name,
            _interval(sp.estimate, sp.ci_low, sp.ci_high) if sp is not None else "–",
            _interval(swapped.estimate, swapped.ci_low, swapped.ci_high) if swapped is not None else "–",
            _interval(p.effect, p.ci_low, p.ci_high),
            _interval(p.speedup, p.speedup_ci_low, p.speedup_ci_high),
            Text(
                str(s.verdict) + (" (PlacementEffect)" if p.demoted else ""),
                style="yellow" if p.demoted else _STYLE.get(str(s.verdict), ""),
            ),
        )
    where = " then ".join(f"control on {r.control}, treatment on {r.treatment}" for r in block.rounds)
    return [table, Text(f"rounds: {where}")] if where else [table]


def console(*, stderr: bool = False) -> Console:
    """A console for the summary: the terminal's width, or in logs (CI, pipes) `COLUMNS` or 80 columns,
    which the summary is laid out for."""
    return Console(stderr=stderr)
