"""Hand-written inline SVG plots for report.html: no plotting library, no external files, readable offline.

Each function returns one `<svg>` element as a string; all text is escaped. Coordinates are
computed here, so the page needs neither JavaScript nor fonts from the network. Legends sit in a
row above the plot area, where they cover no curve; tick labels are round numbers (1, 2, 5 per
decade on a log axis) written without exponents.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from specdecode.experiment.spec import Arm

WIDTH = 420
HEIGHT = 240
MARGIN_LEFT = 52
MARGIN_RIGHT = 12
MARGIN_TOP = 40
LEGEND_Y = 31
"""The legend row: between the title and the plot area."""
FONT_SIZE = 11
MARGIN_BOTTOM = 38
COLOURS: dict[str, str] = {Arm.CONTROL: "#5b6b7f", Arm.TREATMENT: "#d9480f"}
PALETTE = ("#5b6b7f", "#d9480f", "#2b8a3e", "#1c7ed6", "#ae3ec9", "#f08c00")


@dataclass(frozen=True)
class Interval:
    """A labelled point estimate with its interval (speed-up vs load)."""

    label: str
    estimate: float
    low: float | None
    high: float | None
    colour: str = "#1c7ed6"


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log axis spanning 10**lo..10**hi: 1-2-5 per decade (1 per decade over many
    decades, more in a narrow range); below three such, round linear steps."""
    ticks: list[float] = []
    for mantissas in ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)):
        ticks = [
            m * 10.0**e
            for e in range(math.floor(lo), math.ceil(hi) + 1)
            for m in mantissas
            if lo <= math.log10(m * 10.0**e) <= hi
        ]
        if len(ticks) >= 3:
            break
    if len(ticks) < 3:
        ticks = [t for t in _ticks(10.0**lo, 10.0**hi, 4) if t > 0]
    while len(ticks) > 7:
        ticks = ticks[::2]
    return ticks


def _fmt(v: float) -> str:
    """Three significant digits, never an exponent (`1,000` ms, not `1e+03`)."""
    if v != 0 and math.isfinite(v) and abs(v) >= 100:
        return f"{v:,.0f}"
    text = f"{v:.3g}"
    if "e" in text:  # tiny
        text = f"{v:.{2 - math.floor(math.log10(abs(v)))}f}"
    return text


def _frame(title: str, xlabel: str, ylabel: str, *, width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title)}" font-family="sans-serif" '
        f'font-size="{FONT_SIZE}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{width / 2}" y="15" text-anchor="middle" font-size="13">{escape(title)}</text>',
        f'<text x="{(MARGIN_LEFT + width - MARGIN_RIGHT) / 2}" y="{height - 4}" text-anchor="middle">'
        f"{escape(xlabel)}</text>",
        f'<text x="13" y="{(MARGIN_TOP + height - MARGIN_BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 13 {(MARGIN_TOP + height - MARGIN_BOTTOM) / 2})">{escape(ylabel)}</text>',
    ]


def _legend(parts: list[str], entries: Sequence[tuple[str, str]]) -> None:
    """Name and colour of each series in a row above the plot area (never over a curve)."""
    x = float(MARGIN_LEFT)
    for name, colour in entries:
        parts.append(
            f'<rect x="{x:.1f}" y="{LEGEND_Y - 8}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14:.1f}" y="{LEGEND_Y + 1}" fill="{colour}">{escape(name)}</text>'
        )
        x += 14 + 0.62 * FONT_SIZE * len(name) + 14


def _axes(
    parts: list[str],
    xs: Sequence[float],
    ys: Sequence[float],
    x_of: Callable[[float], float],
    y_of: Callable[[float], float],
    x_text: Sequence[str] | None = None,
    *,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> None:
    x0, y0 = MARGIN_LEFT, height - MARGIN_BOTTOM
    parts.append(f'<line x1="{x0}" y1="{y0}" x2="{width - MARGIN_RIGHT}" y2="{y0}" stroke="#333"/>')
    parts.append(f'<line x1="{x0}" y1="{MARGIN_TOP}" x2="{x0}" y2="{y0}" stroke="#333"/>')
    for i, v in enumerate(xs):
        x = x_of(v)
        label = x_text[i] if x_text is not None else _fmt(v)
        parts.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#333"/>')
        parts.append(f'<text x="{x:.1f}" y="{y0 + 15}" text-anchor="middle">{escape(label)}</text>')
    for v in ys:
        y = y_of(v)
        parts.append(
            f'<line x1="{x0 - 4}" y1="{y:.1f}" x2="{width - MARGIN_RIGHT}" y2="{y:.1f}" stroke="#eee"/>'
        )
        parts.append(f'<text x="{x0 - 6}" y="{y + 3:.1f}" text-anchor="end">{_fmt(v)}</text>')


def empty(title: str, why: str = "no data") -> str:
    """A placeholder of the same size."""
    parts = _frame(title, "", "")
    parts.append(
        f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#888">{escape(why)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def cdf(title: str, series: Mapping[str, Sequence[float]], *, xlabel: str) -> str:
    """Empirical CDFs, one step line per series, on a log x axis (latencies span decades)."""
    clean = {k: sorted(v for v in vals if math.isfinite(v) and v > 0) for k, vals in series.items()}
    clean = {k: v for k, v in clean.items() if v}
    if not clean:
        return empty(title)
    lo = math.log10(min(v[0] for v in clean.values()))
    hi = math.log10(max(v[-1] for v in clean.values()))
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    # 5% room on each side, so a curve at the smallest or largest value is not drawn on the frame.
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    pw, ph = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def x_of(v: float) -> float:
        return MARGIN_LEFT + (math.log10(v) - lo) / (hi - lo) * pw

    def y_of(p: float) -> float:
        return HEIGHT - MARGIN_BOTTOM - p * ph

    parts = _frame(title, xlabel + " (log scale)", "fraction ≤ x")
    _axes(parts, _log_ticks(lo, hi), [0.0, 0.25, 0.5, 0.75, 1.0], x_of, y_of)
    legend = []
    for i, (name, vals) in enumerate(clean.items()):
        colour = COLOURS.get(name, PALETTE[i % len(PALETTE)])
        n = len(vals)
        step = max(1, n // 400)  # at most ~400 vertices per curve
        pts = [f"{x_of(vals[0]):.1f},{y_of(0.0):.1f}"]
        for j in range(0, n, step):
            pts.append(f"{x_of(vals[j]):.1f},{y_of(j / n):.1f}")
            pts.append(f"{x_of(vals[j]):.1f},{y_of(min(1.0, (j + step) / n)):.1f}")
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(pts)}"/>')
        legend.append((f"{name} (n={n})", colour))
    _legend(parts, legend)
    parts.append("</svg>")
    return "".join(parts)


def intervals(
    title: str,
    points: Sequence[Interval],
    *,
    ylabel: str,
    reference: float | None = None,
    reference_label: str = "",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Point estimates with confidence bars, one per category (speed-up vs load), and a reference line."""
    vals = [v for p in points for v in (p.estimate, p.low, p.high) if v is not None and math.isfinite(v)]
    if reference is not None:
        vals.append(reference)
    if not points or not vals:
        return empty(title)
    lo, hi = min(vals), max(vals)
    pad = max(0.05 * (hi - lo), 0.02)
    lo, hi = lo - pad, hi + pad
    pw, ph = width - MARGIN_LEFT - MARGIN_RIGHT, height - MARGIN_TOP - MARGIN_BOTTOM
    slot = pw / len(points)

    def x_of(i: float) -> float:
        return MARGIN_LEFT + slot * (i + 0.5)

    def y_of(v: float) -> float:
        return MARGIN_TOP + (hi - v) / (hi - lo) * ph

    parts = _frame(title, "stage (increasing load →)", ylabel, width=width, height=height)
    _axes(
        parts,
        list(range(len(points))),
        _ticks(lo, hi),
        x_of,
        y_of,
        [p.label for p in points],
        width=width,
        height=height,
    )
    if reference is not None:
        y = y_of(reference)
        parts.append(
            f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{width - MARGIN_RIGHT}" y2="{y:.1f}" '
            f'stroke="#c92a2a" stroke-dasharray="4 3"/>'
        )
        _legend(parts, [(f"– – {reference_label}", "#c92a2a")] if reference_label else [])
    for i, p in enumerate(points):
        x = x_of(i)
        if p.low is not None and p.high is not None and math.isfinite(p.low) and math.isfinite(p.high):
            parts.append(
                f'<line x1="{x:.1f}" y1="{y_of(p.low):.1f}" x2="{x:.1f}" y2="{y_of(p.high):.1f}" '
                f'stroke="{p.colour}" stroke-width="2"/>'
            )
            for v in (p.low, p.high):
                parts.append(
                    f'<line x1="{x - 6:.1f}" y1="{y_of(v):.1f}" x2="{x + 6:.1f}" y2="{y_of(v):.1f}" '
                    f'stroke="{p.colour}" stroke-width="2"/>'
                )
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y_of(p.estimate):.1f}" r="4" fill="{p.colour}">'
            f"<title>{escape(p.label)}: {_fmt(p.estimate)}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def bars(title: str, series: Mapping[str, Sequence[float]], *, xlabel: str, ylabel: str) -> str:
    """Grouped bars in [0, 1] (acceptance per draft position, one group per position, one bar per series)."""
    series = {k: list(v) for k, v in series.items() if v}
    if not series:
        return empty(title)
    positions = max(len(v) for v in series.values())
    pw, ph = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    slot = pw / positions
    width = slot * 0.8 / len(series)

    def x_of(i: float) -> float:
        return MARGIN_LEFT + slot * (i + 0.5)

    def y_of(v: float) -> float:
        return MARGIN_TOP + (1.0 - v) * ph

    parts = _frame(title, xlabel, ylabel)
    _axes(
        parts,
        list(range(positions)),
        [0.0, 0.25, 0.5, 0.75, 1.0],
        x_of,
        y_of,
        [str(i + 1) for i in range(positions)],
    )
    legend = []
    for s, (name, vals) in enumerate(series.items()):
        colour = PALETTE[(s + 1) % len(PALETTE)]
        for i, v in enumerate(vals):
            v = min(1.0, max(0.0, v)) if math.isfinite(v) else 0.0
            x = MARGIN_LEFT + slot * i + slot * 0.1 + width * s
            parts.append(
                f'<rect x="{x:.1f}" y="{y_of(v):.1f}" width="{width:.1f}" height="{y_of(0) - y_of(v):.1f}" '
                f'fill="{colour}"><title>{escape(name)} position {i + 1}: {v:.3f}</title></rect>'
            )
        legend.append((name, colour))
    _legend(parts, [(name, colour) for name, colour in legend if name])
    parts.append("</svg>")
    return "".join(parts)
