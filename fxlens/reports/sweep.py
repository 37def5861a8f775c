"""A sweep's rows on every surface: one `View` (tables, rendered by the terminal, HTML and
Markdown renderers like any section) and, on the page, line charts of FLOPs, memory peak and
time against the swept axis with the most values, one line per combination of the others.

Every figure is labelled by what it counts (the rows' ``flops_of`` and ``peak_of``). A point
that failed or was refused gets a short cell in its own ``failure`` column pointing to a note
(``refused [1]``); the notes, in full, are a table below (a footnote list on every surface),
so one long message never stretches the table. Series are ordered by value (128 before 1024),
and the value axis has 1-2-5 ticks in one unit from zero to just past the largest point.

Reads the rows `fxlens.sweep` writes; computes nothing but labels and positions on a chart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fxlens.reports.axes import BYTE_UNITS, FLOP_UNITS, SECOND_UNITS, Ladder, axis_ticks
from fxlens.reports.escape import html_escape as esc
from fxlens.reports.html import render_view as html_view
from fxlens.reports.markdown import render_view as markdown_view
from fxlens.reports.units import binary_bytes, seconds, si
from fxlens.reports.view import Cell, Column, Table, Tone, View

Row = Mapping[str, Any]
AxisValue = Callable[[Row, str], str]
# metric key, what it counts (None: from the rows, `labels`), tooltip format, tick units
CHARTS: tuple[tuple[str, str | None, Callable[[float], str], Ladder], ...] = (
    ("flops", None, lambda v: si(v, "FLOP"), FLOP_UNITS),
    ("peak_bytes", None, binary_bytes, BYTE_UNITS),
    ("time_s", None, seconds, SECOND_UNITS),
    ("plan_step_s", "planned step time (first layout)", seconds, SECOND_UNITS),
)
SHORT_FAILURE = 24      # characters of a failure's kind shown in the table


def _mfu(v: Any) -> str:
    return f"{float(v):.1%}"


PLANNED = (("layout", "plan_layout", str), ("GPUs", "plan_gpus", str),
           ("fits", "plan_fits", None), ("peak / GPU", "plan_peak_bytes", binary_bytes),
           ("step", "plan_step_s", seconds), ("MFU", "plan_mfu", _mfu))


def labels(rows: Sequence[Row]) -> dict[str, str]:
    """What each single-device figure counts, from the rows (``forward FLOPs``, ``weights +
    activation peak (eager, simulated)``); rows that disagree get a generic label."""
    def common(key: str) -> str | None:
        found = {str(r[key]) for r in rows if r.get(key)}
        return found.pop() if len(found) == 1 else None

    flops_of, peak_of = common("flops_of"), common("peak_of")
    what = "step" if flops_of == "training step" else "forward" if flops_of else "point"
    return {"flops": f"{flops_of} FLOPs" if flops_of else "FLOPs",
            "peak_bytes": peak_of or "memory peak (see each row's peak_of)",
            "fits": "fits device",
            "time_s": f"{what} time (roofline)",
            "mfu": "MFU"}


def sweep_view(rows: Sequence[Row], axes: Sequence[str], axis_value: AxisValue) -> View:
    """The single-device figures, the plans where points have one, and the failure notes."""
    shown = list(axes) or ["target"]
    notes = failure_notes(rows)
    named = labels(rows)
    single = [(named[key], key, fmt) for key, fmt in (
        ("flops", si), ("peak_bytes", binary_bytes), ("fits", None), ("time_s", seconds),
        ("mfu", _mfu))]
    counts = {said: sum(1 for r in rows if r.get("status") == status)
              for status, said in (("error", "failed"), ("refused", "refused"))}
    caption = (f"{len(rows)} points" + "".join(f", {n} {s}" for s, n in counts.items() if n)
               + (" (notes below)" if notes else "")
               + ("" if any(r.get("time_s") is not None for r in rows)
                  else "; time needs --device"))
    tables = [_table("sweep", rows, shown, axis_value, single, notes, caption)]
    if any(r.get("plan_layout") is not None for r in rows):
        tables.append(_table("sweep · parallel plan", rows, shown, axis_value, PLANNED, notes,
                             ""))
    if notes:
        tables.append(Table.of("failed and refused points", (Column("note"), Column("why")),
                               [(f"[{n}]", message) for message, n in notes.items()]))
    return View("sweep", "Sweep", tuple(tables))


def failure_notes(rows: Sequence[Row]) -> dict[str, int]:
    """Each distinct failure message, numbered in row order from 1."""
    notes: dict[str, int] = {}
    for row in rows:
        if row.get("status") != "ok":
            notes.setdefault(str(row.get("error") or "unknown error"), len(notes) + 1)
    return notes


def failure_cell(row: Row, notes: Mapping[str, int]) -> Cell:
    """``refused [1]``, ``LoadError [2]``: what kind of failure, and its note."""
    message = str(row.get("error") or "unknown error")
    kind = "refused" if row.get("status") == "refused" else message.partition(":")[0]
    if not kind.isidentifier() or len(kind) > SHORT_FAILURE:
        kind = "error"
    return Cell(f"{kind} [{notes[message]}]", Tone.BAD)


def _table(title: str, rows: Sequence[Row], shown: Sequence[str], axis_value: AxisValue,
           figures: Sequence[tuple[str, str, Any]], notes: Mapping[str, int],
           caption: str) -> Table:
    used = [f for f in figures if any(r.get(f[1]) is not None for r in rows)]
    body = []
    for row in rows:
        cells: list[str | Cell] = [axis_value(row, a) for a in shown]
        if row.get("status") != "ok":
            cells += [""] * len(used) + [failure_cell(row, notes)]
        else:
            cells += [_cell(row.get(key), fmt) for _, key, fmt in used]
            cells += [""] if notes else []
        body.append(tuple(cells))
    heads = tuple(Column(a.removeprefix("set:")) for a in shown)
    figures_heads = tuple(Column(f[0], right=True) for f in used)
    failure_head = (Column("failure"),) if notes else ()
    return Table.of(title, heads + figures_heads + failure_head, body, caption=caption)


def _cell(value: Any, fmt: Callable[[Any], str] | None) -> str | Cell:
    """`fmt` None: a verdict."""
    if value is None:
        return "-"
    if fmt is None:
        return Cell("yes" if value else "no", Tone.GOOD if value else Tone.BAD)
    return fmt(value)


def render_sweep_html(rows: Sequence[Row], axes: Sequence[str], axis_value: AxisValue) -> str:
    view = sweep_view(rows, axes, axis_value)
    named = labels(rows)
    charts = "".join(line_chart(rows, axes, axis_value, key, label or named[key], fmt, units)
                     for key, label, fmt, units in CHARTS)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>fxlens · sweep</title><style>" + _STYLE + "</style></head><body>"
            "<h1>fxlens · sweep</h1><section id=\"charts\">" + charts + "</section>"
            "<section id=\"sweep\">" + html_view(view) + "</section></body></html>\n")


def render_sweep_markdown(rows: Sequence[Row], axes: Sequence[str],
                          axis_value: AxisValue) -> str:
    """The tables in the open (not folded: they are the page), failure notes below."""
    lines = markdown_view(sweep_view(rows, axes, axis_value), folded=False)
    return "# fxlens · sweep\n\n" + "\n".join(lines)


def chart_axes(rows: Sequence[Row], axes: Sequence[str], axis_value: AxisValue
               ) -> tuple[str, list[str]]:
    """The x axis, the swept axis with the most values among the points that ran (ties: a
    numeric one, then the first), and the others, whose values name the lines."""
    ran = [r for r in rows if r.get("status") == "ok"] or list(rows)

    def rank(item: tuple[int, str]) -> tuple[int, bool, int]:
        at, axis = item
        values = {axis_value(r, axis) for r in ran}
        return -len(values), not all(_number(v) is not None for v in values), at

    x_axis = min(enumerate(axes), key=rank)[1]
    return x_axis, [a for a in axes if a != x_axis]


def line_chart(rows: Sequence[Row], axes: Sequence[str], axis_value: AxisValue, key: str,
               label: str, fmt: Callable[[float], str], units: Ladder = FLOP_UNITS,
               width: int = 560, height: int = 260) -> str:
    """`key` against `chart_axes`'s x axis (log scale when numeric), one line per combination
    of the others, in order of their values; ticks on both axes, a tooltip on every point."""
    points = [r for r in rows if r.get("status") == "ok" and isinstance(r.get(key), int | float)]
    if not points or not axes:
        return ""
    x_axis, others = chart_axes(rows, axes, axis_value)
    # an axis with one value among the plotted points names no line (the others failed)
    others = [a for a in others if len({axis_value(r, a) for r in points}) > 1]
    xs = sorted({axis_value(r, x_axis) for r in points}, key=_order)
    numeric = all(_number(x) is not None for x in xs)
    series: dict[tuple[str, ...], list[tuple[str, float]]] = {}
    for row in points:
        series.setdefault(tuple(axis_value(row, a) for a in others), []).append(
            (axis_value(row, x_axis), float(row[key])))
    ordered = sorted(series, key=lambda values: tuple(_order(v) for v in values))
    ticks = axis_ticks(max(v for line in series.values() for _, v in line), units)
    top = ticks[-1][0] or 1.0
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

    svg = "".join(
        f'<line class="grid" x1="{pad_l}" x2="{width - 10}" y1="{py(v):.1f}" y2="{py(v):.1f}"/>'
        f'<text class="tick" x="{pad_l - 6}" y="{py(v) + 4:.1f}" text-anchor="end">'
        f"{esc(text)}</text>" for v, text in ticks)
    svg += "".join(f'<text class="tick" x="{px(x):.1f}" y="{height - pad_b + 16}" '
                   f'text-anchor="middle">{esc(x)}</text>' for x in xs)
    names = {values: _series_name(others, values) or label for values in ordered}
    x_name = x_axis.removeprefix("set:")
    for i, values in enumerate(ordered):
        line = sorted(series[values], key=lambda p: xs.index(p[0]))
        path = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in line)
        svg += (f'<polyline class="s{i % 6}" points="{path}"><title>{esc(names[values])}'
                "</title></polyline>" + "".join(
                    f'<circle class="s{i % 6}" cx="{px(x):.1f}" cy="{py(v):.1f}" r="3.5">'
                    f"<title>{esc(names[values])} · {esc(x_name)}={esc(x)}: "
                    f"{esc(fmt(v))}</title></circle>" for x, v in line))
    legend = "".join(f'<span class="s{i % 6}">■ {esc(names[values])}</span>'
                     for i, values in enumerate(ordered))
    return (f'<figure class="chart" data-metric="{esc(key)}"><figcaption>{esc(label)} vs '
            f"{esc(x_name)}</figcaption>"
            f'<svg viewBox="0 0 {width} {height}">{svg}'
            f'<text class="tick" x="{(width + pad_l) / 2}" y="{height - 6}" '
            f'text-anchor="middle">{esc(x_name)}</text></svg>'
            f'<div class="legend">{legend}</div></figure>')


def _series_name(axes: Sequence[str], values: Sequence[str]) -> str:
    return ", ".join(f"{a.removeprefix('set:')}={v}" for a, v in zip(axes, values, strict=True))


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
table{border-collapse:collapse;margin-top:16px;max-width:100%}
td,th{border:1px solid #ddd;padding:3px 8px;vertical-align:top;text-align:left}
td.num,th.num{text-align:right}td.num{white-space:nowrap}
.tone-bad{color:#b00020;white-space:nowrap}.tone-good{color:#1b7f3b}
.tone-strong{font-weight:600}.muted{color:#666}
"""
