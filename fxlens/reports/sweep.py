"""A sweep's rows on every surface: one `View` (a table, rendered by the terminal, HTML and
Markdown renderers like any section) and, on the page, line charts of FLOPs, peak memory and
time against the swept axis, one line per combination of the other axes.

Reads the rows `fxlens.sweep` writes; computes nothing but positions on a chart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fxlens.reports.escape import html_escape as esc
from fxlens.reports.html import render_view as html_view
from fxlens.reports.markdown import render_view as markdown_view
from fxlens.reports.units import binary_bytes, seconds, si
from fxlens.reports.view import Cell, Column, Table, Tone, View

Row = Mapping[str, Any]
CHARTS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("flops", "FLOPs", lambda v: si(v, "FLOP")),
    ("peak_bytes", "peak memory", binary_bytes),
    ("time_s", "estimated time", seconds),
    ("plan_step_s", "planned step time", seconds),
)


SINGLE = (("FLOPs", "flops", si), ("peak", "peak_bytes", binary_bytes), ("fits", "fits", None),
          ("time", "time_s", seconds), ("MFU", "mfu", lambda v: f"{float(v):.1%}"))
PLANNED = (("layout", "plan_layout", str), ("GPUs", "plan_gpus", str),
           ("fits", "plan_fits", None), ("peak / GPU", "plan_peak_bytes", binary_bytes),
           ("step", "plan_step_s", seconds), ("MFU", "plan_mfu", lambda v: f"{float(v):.1%}"))


def sweep_view(rows: Sequence[Row], axes: Sequence[str],
               axis_value: Callable[[Row, str], str]) -> View:
    """One table of the single-device figures, and one of the plans where points have one."""
    shown = list(axes) or ["target"]
    failed = sum(1 for r in rows if r.get("status") != "ok")
    counted = ", ".join(sorted({str(r["flops_of"]) for r in rows if r.get("flops_of")})) or "-"
    caption = (f"{len(rows)} points, {failed} failed; FLOPs and peak of the {counted}"
               + ("" if any(r.get("time_s") is not None for r in rows)
                  else "; time needs --device"))
    tables = [_table("sweep", rows, shown, axis_value, SINGLE, caption)]
    if any(r.get("plan_layout") is not None for r in rows):
        tables.append(_table("sweep · parallel plan", rows, shown, axis_value, PLANNED, ""))
    return View("sweep", "Sweep", tuple(tables))


def _table(title: str, rows: Sequence[Row], shown: Sequence[str],
           axis_value: Callable[[Row, str], str], figures: Sequence[tuple[str, str, Any]],
           caption: str) -> Table:
    used = [f for f in figures if any(r.get(f[1]) is not None for r in rows)]
    body = []
    for row in rows:
        cells: list[str | Cell] = [axis_value(row, a) for a in shown]
        if row.get("status") != "ok":
            cells.append(Cell(f"error: {row.get('error')}", Tone.BAD))
            cells += [""] * (len(used) - 1)
        else:
            cells += [_cell(row.get(key), fmt) for _, key, fmt in used]
        body.append(tuple(cells))
    heads = tuple(Column(a.removeprefix("set:")) for a in shown)
    figures_heads = tuple(Column(f[0], right=True) for f in used) or (Column("result"),)
    return Table.of(title, heads + figures_heads, body, caption=caption)


def _cell(value: Any, fmt: Callable[[Any], str] | None) -> str | Cell:
    """`fmt` None: a verdict."""
    if value is None:
        return "-"
    if fmt is None:
        return Cell("yes" if value else "no", Tone.GOOD if value else Tone.BAD)
    return fmt(value)


def render_sweep_html(rows: Sequence[Row], axes: Sequence[str],
                      axis_value: Callable[[Row, str], str]) -> str:
    view = sweep_view(rows, axes, axis_value)
    charts = "".join(line_chart(rows, axes, axis_value, key, label, fmt)
                     for key, label, fmt in CHARTS)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>fxlens · sweep</title><style>" + _STYLE + "</style></head><body>"
            "<h1>fxlens · sweep</h1><section id=\"charts\">" + charts + "</section>"
            "<section id=\"sweep\">" + html_view(view) + "</section></body></html>\n")


def render_sweep_markdown(rows: Sequence[Row], axes: Sequence[str],
                          axis_value: Callable[[Row, str], str]) -> str:
    return "# fxlens · sweep\n\n" + "\n".join(markdown_view(sweep_view(rows, axes, axis_value)))


def line_chart(rows: Sequence[Row], axes: Sequence[str], axis_value: Callable[[Row, str], str],
               key: str, label: str, fmt: Callable[[float], str],
               width: int = 560, height: int = 260) -> str:
    """`key` against the first swept axis (log scale when numeric and wide), one line per
    combination of the others; ticks on both axes, a tooltip on every point."""
    points = [r for r in rows if r.get("status") == "ok" and isinstance(r.get(key), int | float)]
    if not points or not axes:
        return ""
    x_axis, others = axes[0], axes[1:]
    xs = sorted({axis_value(r, x_axis) for r in points}, key=_order)
    numeric = all(_number(x) is not None for x in xs)
    series: dict[str, list[tuple[str, float]]] = {}
    for row in points:
        name = ", ".join(f"{a.removeprefix('set:')}={axis_value(row, a)}" for a in others)
        series.setdefault(name or label, []).append((axis_value(row, x_axis), float(row[key])))
    values = [v for line in series.values() for _, v in line]
    top = max(values) or 1.0
    pad_l, pad_b = 100, 40

    def px(x: str) -> float:
        if numeric and len(xs) > 1:
            lo, hi = math.log(_number(xs[0]) or 1), math.log(_number(xs[-1]) or 1)
            at = math.log(_number(x) or 1)
            share = (at - lo) / (hi - lo) if hi > lo else 0.5
        else:
            share = xs.index(x) / (len(xs) - 1) if len(xs) > 1 else 0.5
        return pad_l + share * (width - pad_l - 20)

    def py(v: float) -> float:
        return 10 + (height - pad_b - 10) * (1 - v / top)

    ticks = "".join(
        f'<line class="grid" x1="{pad_l}" x2="{width - 10}" y1="{py(top * f):.1f}" '
        f'y2="{py(top * f):.1f}"/><text class="tick" x="{pad_l - 6}" y="{py(top * f) + 4:.1f}" '
        f'text-anchor="end">{esc(fmt(top * f))}</text>' for f in (0, 0.25, 0.5, 0.75, 1))
    ticks += "".join(f'<text class="tick" x="{px(x):.1f}" y="{height - pad_b + 16}" '
                     f'text-anchor="middle">{esc(x)}</text>' for x in xs)
    lines = ""
    for i, (name, line) in enumerate(sorted(series.items())):
        line.sort(key=lambda p: xs.index(p[0]))
        path = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in line)
        lines += (f'<polyline class="s{i % 6}" points="{path}"><title>{esc(name)}</title>'
                  "</polyline>" + "".join(
                      f'<circle class="s{i % 6}" cx="{px(x):.1f}" cy="{py(v):.1f}" r="3.5">'
                      f"<title>{esc(name)} · {esc(x_axis.removeprefix('set:'))}={esc(x)}: "
                      f"{esc(fmt(v))}</title></circle>" for x, v in line))
    legend = "".join(f'<span class="s{i % 6}">■ {esc(name)}</span>'
                     for i, name in enumerate(sorted(series)))
    return (f'<figure class="chart" data-metric="{esc(key)}"><figcaption>{esc(label)} vs '
            f"{esc(x_axis.removeprefix('set:'))}</figcaption>"
            f'<svg viewBox="0 0 {width} {height}">{ticks}{lines}'
            f'<text class="tick" x="{(width + pad_l) / 2}" y="{height - 6}" '
            f'text-anchor="middle">{esc(x_axis.removeprefix("set:"))}</text></svg>'
            f'<div class="legend">{legend}</div></figure>')


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 and math.isfinite(value) else None


def _order(text: str) -> tuple[int, float, str]:
    number = _number(text)
    return (0, number, "") if number is not None else (1, 0.0, text)


_STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}
#charts{display:flex;flex-wrap:wrap;gap:16px}
figure.chart{margin:0;border:1px solid #ddd;padding:8px;width:560px}
figcaption{font-weight:600;margin-bottom:4px}
svg{width:100%;height:auto}
.grid{stroke:#eee}.tick{font-size:11px;fill:#555}
polyline{fill:none;stroke-width:2}
.s0{stroke:#1f77b4;fill:#1f77b4;color:#1f77b4}.s1{stroke:#d62728;fill:#d62728;color:#d62728}
.s2{stroke:#2ca02c;fill:#2ca02c;color:#2ca02c}.s3{stroke:#9467bd;fill:#9467bd;color:#9467bd}
.s4{stroke:#ff7f0e;fill:#ff7f0e;color:#ff7f0e}.s5{stroke:#8c564b;fill:#8c564b;color:#8c564b}
polyline.s0,polyline.s1,polyline.s2,polyline.s3,polyline.s4,polyline.s5{fill:none}
.legend span{margin-right:12px;font-size:12px}
table{border-collapse:collapse;margin-top:16px}td,th{border:1px solid #ddd;padding:3px 8px}
td.num,th.num{text-align:right}.tone-bad{color:#b00020}.tone-good{color:#1b7f3b}
.tone-strong{font-weight:600}.muted{color:#666}
"""
