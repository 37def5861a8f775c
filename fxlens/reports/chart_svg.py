"""A view's `Chart` as inline SVG for the HTML page: `chart_svg(chart)`.

Both axes are linear and span the data (the x axis from its least point, not from 0: a
memory–time curve lives between the least peak and the step without checkpointing; the y axis
from 0, so recompute reads as a share of the height), with 1-2-5 ticks in one unit each
(`fxlens.reports.axes`); every point has a tooltip, every `Mark` a ring and its label. Labels
come from views and may carry user text: escaped here, with the page's one HTML escape.
"""

from __future__ import annotations

from collections.abc import Callable

from fxlens.reports.axes import (
    BYTE_UNITS,
    FLOP_UNITS,
    RATE_UNITS,
    SECOND_UNITS,
    Ladder,
    axis_ticks,
)
from fxlens.reports.escape import html_escape as esc
from fxlens.reports.units import binary_bytes, seconds, si
from fxlens.reports.view import Chart

LADDERS: dict[str, tuple[Ladder, Callable[[float], str]]] = {
    "B": (BYTE_UNITS, lambda v: binary_bytes(int(v))),
    "s": (SECOND_UNITS, seconds),
    "FLOP": (FLOP_UNITS, lambda v: si(v, "FLOP")),
    "tok/s": (RATE_UNITS, lambda v: f"{v:,.0f} tok/s"),
}
WIDTH, HEIGHT = 640, 300
PAD_L, PAD_R, PAD_T, PAD_B = 80, 20, 16, 44


def chart_svg(chart: Chart) -> str:
    """The figure: caption, SVG (grid, ticks, axis names, lines, points, marks), note."""
    points = [p for s in chart.series for p in s.points] + [(m.x, m.y) for m in chart.marks]
    if not points:
        return ""
    x_ladder, x_text = LADDERS[chart.x_unit]
    y_ladder, y_text = LADDERS[chart.y_unit]
    xs = axis_ticks(max(x for x, _ in points), x_ladder, bottom=min(x for x, _ in points))
    ys = axis_ticks(max(y for _, y in points), y_ladder)
    left, right = xs[0][0], xs[-1][0]
    top = ys[-1][0] or 1.0

    def px(x: float) -> float:
        share = (x - left) / (right - left) if right > left else 0.5
        return PAD_L + share * (WIDTH - PAD_L - PAD_R)

    def py(y: float) -> float:
        return PAD_T + (HEIGHT - PAD_T - PAD_B) * (1 - y / top)

    def tip(x: float, y: float) -> str:
        return esc(f"{chart.x_label} {x_text(x)}: {chart.y_label} {y_text(y)}")

    grid = "".join(
        f'<line class="grid" x1="{PAD_L}" x2="{WIDTH - PAD_R}" y1="{py(v):.1f}" '
        f'y2="{py(v):.1f}"/><text class="tick y-tick" x="{PAD_L - 6}" y="{py(v) + 4:.1f}" '
        f'text-anchor="end">{esc(text)}</text>' for v, text in ys)
    grid += "".join(
        f'<text class="tick x-tick" x="{px(v):.1f}" y="{HEIGHT - PAD_B + 16}" '
        f'text-anchor="middle">{esc(text)}</text>' for v, text in xs)
    lines = ""
    for i, series in enumerate(chart.series):
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in series.points)
        lines += (f'<polyline class="line s{i % 6}" points="{path}"><title>{esc(series.name)}'
                  "</title></polyline>" + "".join(
                      f'<circle class="point s{i % 6}" cx="{px(x):.1f}" cy="{py(y):.1f}" '
                      f'r="3.5"><title>{tip(x, y)}</title></circle>' for x, y in series.points))
    marks = "".join(
        f'<circle class="mark" cx="{px(m.x):.1f}" cy="{py(m.y):.1f}" r="7"><title>'
        f'{tip(m.x, m.y)}</title></circle><text class="mark-label" x="{px(m.x):.1f}" '
        f'y="{max(py(m.y) - 12, PAD_T + 10):.1f}" text-anchor="{_anchor(px(m.x))}">'
        f"{esc(m.label)}</text>" for m in chart.marks)
    names = (f'<text class="axis-name" x="{(WIDTH + PAD_L) / 2:.0f}" y="{HEIGHT - 6}" '
             f'text-anchor="middle">{esc(chart.x_label)}</text>'
             f'<text class="axis-name" transform="translate(14 {(HEIGHT - PAD_B) / 2:.0f}) '
             f'rotate(-90)" text-anchor="middle">{esc(chart.y_label)}</text>')
    caption = f'<p class="muted">{esc(chart.caption)}</p>' if chart.caption else ""
    return (f'<figure class="view-chart"><figcaption>{esc(chart.title)}</figcaption>'
            f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{esc(chart.title)}">{grid}{names}{lines}{marks}</svg>{caption}'
            "</figure>")


def _anchor(x: float) -> str:
    """Where a mark's label hangs: never off the plot's edge."""
    if x > WIDTH - PAD_R - 120:
        return "end"
    return "start" if x < PAD_L + 120 else "middle"
