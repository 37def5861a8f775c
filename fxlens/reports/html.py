"""One self-contained HTML page for a report: inline CSS and JS, no CDN, works offline.

`render_html(report, svg)` is pure. The page has the report JSON embedded in a
``<script type="application/json" id="fxlens-data">`` block (written with `json_script`, so no
``</script>`` can close it early) and a small script (`html_assets/report.js`) that builds
the big parts from it on the client: the module tree (expandable, sortable by any column) and
the ops table (filter box, sortable, virtually scrolled: only the rows on screen exist in the
DOM), so a 2,000-node LLM page is interactive in well under a second.

Rendered here, with every user-derived string through `html_escape`: the headline cards
(`fxlens.reports.views.headline`), hotspots (FLOPs; time with a roofline section; memory with
a memory section), then one section per view (`fxlens.reports.views`: memory, training, KV
cache, roofline, validation, fusion, quantization — the same views the terminal and Markdown
show) with the memory timeline and roofline charts beside their tables, and the graph:
graphviz's SVG inline (its text is already XML-escaped by graphviz; the XML prolog, fixed size
and any script element are removed), with pan and zoom, the colour legend of the graph on
display above it (`fxlens.reports.graph_legend`: the whole graph's, or an expanded block's own
scale), and a details panel on click. The page's data says what each folded node of the SVG
stands for (`fxlens.reports.graph_groups.page_graph`): a run of alike blocks (``b<i>``) opens
its first block in place and shows that block's figures with the run's totals and a link to
its row in the modules table; the input plumbing (``p0``) lists its ops; hidden asserts are
never "first op". The JS only ever writes report strings through ``textContent``.

Why no template engine (jinja2 was considered): the page is a handful of small functions over
the view model, and every string already passes one escaping function; a template with
autoescape would add a second escaping path and a second place where the page's structure
lives, for no fewer lines.

Diff hook: `diff_html` is an HTML *fragment* already rendered and escaped by the diff
renderer (`fxlens.reports.diff_html`); it is placed as the page's "diff" section.

Known limitations: the graph SVG is as big as graphviz makes it (collapsed blocks keep an LLM's
small; ``--expand`` on a 2,000-node graph is slow in graphviz, not in the page). The memory chart
keeps each bucket's maximum when the timeline has more points than pixels, so peaks survive.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fxlens.analyzer.core.report import NodeReport, Report
from fxlens.analyzer.core.sections import Memory, Roofline, Training
from fxlens.reports.chart_svg import chart_svg
from fxlens.reports.dot import collapsed_blocks, dot_legend
from fxlens.reports.escape import html_escape as esc
from fxlens.reports.escape import json_script
from fxlens.reports.graph_groups import page_graph, plan_graph
from fxlens.reports.graph_legend import Legend
from fxlens.reports.sections import module_times, node_times, roofline_roof
from fxlens.reports.units import binary_bytes, percent, seconds, short_op, si
from fxlens.reports.view import Block, Cell, Chart, Code, Detail, Figure, SideBySide, View
from fxlens.reports.views import asked_first, views
from fxlens.reports.views.headline import headline, inputs_text
from fxlens.reports.views.model import UNITS_NOTE, coverage_figure

INTERACTIVE = {"summary", "modules", "top-ops"}   # the page's own cards, tree and ops table
CHART_POINTS = 1200     # the memory chart keeps at most this many (bucket maxima)
TOOLTIP_POINTS = 240    # of which this many carry a tooltip
TOP = 10


@dataclass(frozen=True)
class BlockGraphs:
    """SVGs of repeated blocks with every op drawn (one per run) and, per collapsed block
    index, which of them to show when its summary node is clicked."""

    svgs: tuple[str, ...]
    of_block: Mapping[int, int]


def render_html(report: Report, svg: str | None, diff_html: str | None = None,
                block_graphs: BlockGraphs | None = None, color: str = "flops",
                expand: bool = False) -> str:
    """The whole page. `svg`: graphviz's SVG of the graph (None: dot was not available),
    drawn by `render_dot(report, color, expand)`."""
    return finish_html(draft_html(report), svg, diff_html, block_graphs, color, expand)


@dataclass(frozen=True)
class HtmlDraft:
    """Every part of the page but the graph: its sections and the report's JSON, which are
    most of the page's time on a big report and need nothing from graphviz, so
    `fxlens.reports.write` renders them while graphviz lays the graph out."""

    report: Report
    sections: tuple[tuple[str, str, str], ...]    # (key, title, html)
    report_json: str                              # `json_script` of ``report.to_dict()``


def draft_html(report: Report) -> HtmlDraft:
    """The page's every section but the graph, and the report's JSON."""
    sections = [
        ("summary", "Summary", _summary_cards(report)),
        ("modules", "Modules", _module_tree_shell(report)),
        ("ops", "Ops", _ops_shell(report)),
        ("hotspots", "Hotspots", _hotspots(report)),
    ]
    charts = {"memory": _memory_chart, "training": _memory_chart, "roofline": _roofline_chart}
    for view in views(report, Detail(top=TOP, full=True)):
        if view.key not in INTERACTIVE:
            chart = charts[view.key](report) if view.key in charts else ""
            sections.append((view.key, view.title, chart + render_view(view)))
    order = asked_first([key for key, _, _ in sections])     # the asked section second
    sections.sort(key=lambda section: order.index(section[0]))
    return HtmlDraft(report, tuple(sections), json_script(report.to_dict()))


def finish_html(draft: HtmlDraft, svg: str | None, diff_html: str | None = None,
                block_graphs: BlockGraphs | None = None, color: str = "flops",
                expand: bool = False) -> str:
    """`draft` with the graph (and a diff) added: the page `render_html` returns. `color`
    and `expand` are those the SVG was drawn with: the page's legend and its links from the
    SVG's nodes back to the report follow them."""
    report = draft.report
    legends = _legends(report, block_graphs, color, expand) if svg else ()
    sections = [*draft.sections, ("graph", "Graph", _graph_section(svg, block_graphs, legends))]
    if diff_html:
        sections.append(("diff", "Diff", diff_html))
    nav = "".join(f'<a href="#{key}">{title}</a>' for key, title, _ in sections)
    body = "\n".join(f'<section id="{key}"><h2>{title}</h2>\n{html}\n</section>'
                     for key, title, html in sections)
    view = {"blocks": list(collapsed_blocks(report)), "times": _times_json(report),
            "module_times": module_times(report),
            "block_graphs": {str(k): v for k, v in (block_graphs.of_block.items()
                                                    if block_graphs else ())},
            "graph": page_graph(plan_graph(report, expand))}
    # json_script({"report": …, "view": …}) in two pieces (its keys sorted, no spaces)
    data = f'{{"report":{draft.report_json},"view":{json_script(view)}}}'
    title = esc(f"fxlens · {report.model.name}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<link rel=\"icon\" href=\"data:,\"><title>{title}</title>"
        f"<style>{_asset('report.css')}</style></head>\n<body>\n"
        f"<header><h1>{title}</h1><nav>{nav}</nav></header>\n<main>\n{body}\n</main>\n"
        f"<aside id=\"details\" hidden><button id=\"details-close\" title=\"close\">×</button>"
        f"<div id=\"details-body\"></div></aside>\n"
        f"<script type=\"application/json\" id=\"fxlens-data\">{data}</script>\n"
        f"<script>{_asset('report.js')}</script>\n</body></html>\n"
    )


def _asset(name: str) -> str:
    return (resources.files("fxlens.reports") / "html_assets" / name).read_text("utf-8")


def _times_json(report: Report) -> dict[str, float]:
    times = node_times(report) or {}
    return {str(k): v for k, v in sorted(times.items())}


# --- summary ---------------------------------------------------------------------------------


def _summary_cards(report: Report) -> str:
    model = report.model
    cards = [*headline(report), coverage_figure(report),
             Figure("ops", str(len(report.nodes)), model.capture_method)]
    html = "".join(f'<div class="card tone-{f.tone.value}"><div class="k">{esc(f.label)}</div>'
                   f'<div class="v">{esc(f.value)}</div><div class="s">{esc(f.detail)}</div>'
                   "</div>" for f in cards)
    notes = "".join(f"<li>{esc(n)}</li>" for n in model.capture_notes)
    source = (f'<p class="muted">inputs: {esc(inputs_text(report) or "none")} · '
              f"source: {esc(model.source)}</p>")
    missing = _coverage_gaps(report)
    return (f'<div class="cards">{html}</div>{source}'
            + (f'<ul class="notes">{notes}</ul>' if notes else "") + missing
            + f'<p class="muted">{esc(UNITS_NOTE)}</p>')


def _coverage_gaps(report: Report) -> str:
    coverage = report.coverage
    items = [f"{op} ×{n} unsupported" for op, n in coverage.unsupported.items()]
    items += [f"{op}: rule failed: {error}" for op, error in coverage.failed.items()]
    if not items:
        return ""
    return '<ul class="bad">' + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"


# --- shells the JS fills ---------------------------------------------------------------------


def _module_tree_shell(report: Report) -> str:
    return ('<div class="toolbar"><button id="tree-expand">expand all</button>'
            '<button id="tree-collapse">collapse</button>'
            '<span class="muted">click a header to sort (siblings stay under their parent)'
            "</span></div>"
            '<div class="scroll"><table id="module-table" class="data">'
            "<thead></thead><tbody></tbody></table></div>")


def _ops_shell(report: Report) -> str:
    return (f'<div class="toolbar"><input id="op-filter" type="search" '
            f'placeholder="filter by op, module, shape or source…" size="48">'
            '<label class="muted"><input id="op-free" type="checkbox"> show free ops '
            '(views, metadata)</label> '
            f'<span id="op-count" class="muted">{len(report.nodes)} ops</span></div>'
            '<div id="ops-scroll" class="scroll vscroll"><table id="ops-table" class="data">'
            "<thead></thead><tbody></tbody></table></div>")


# --- hotspots --------------------------------------------------------------------------------


def _hotspots(report: Report) -> str:
    total = report.totals.flops
    by_flops = sorted((n for n in report.nodes if n.flops), key=lambda n: (-n.flops, n.id))
    parts = [_node_table("by FLOPs", by_flops[:TOP],
                         ("FLOPs", "share"), lambda n: (si(n.flops), percent(n.flops, total)))]
    times = node_times(report)
    if times:
        total_s = sum(times.values())
        ranked = sorted((n for n in report.nodes if times.get(n.id)),
                        key=lambda n: (-times.get(n.id, 0.0), n.id))
        parts.append(_node_table("by estimated time", ranked[:TOP], ("time", "share"),
                                 lambda n: (seconds(times.get(n.id, 0.0)),
                                            percent(times.get(n.id, 0.0), total_s))))
    memory = report.get(Memory)
    if memory is not None and memory.live_at_peak:
        rows = [(str(t.node), t.target, t.module or "(root)",
                 "×".join(str(d) for d in t.shape) + f" {t.dtype}",
                 binary_bytes(t.bytes), t.category)
                for t in memory.live_at_peak[:TOP]]
        parts.append('<div class="hot"><h3>by memory: largest tensors live at the peak</h3>'
                     + _table(("node", "op", "module", "shape", "bytes", "kind"), rows,
                              node_column=0) + "</div>")
    return '<div class="hotspots">' + "".join(parts) + "</div>"


def _node_table(title: str, nodes: Sequence[NodeReport], heads: tuple[str, str],
                values: Any) -> str:
    rows = [(str(n.id), short_op(n.target), n.module or "(root)", *values(n), n.source)
            for n in nodes]
    return (f'<div class="hot"><h3>{esc(title)}</h3>'
            + _table(("node", "op", "module", *heads, "source"), rows, node_column=0)
            + "</div>")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]],
           node_column: int | None = None) -> str:
    """A static sortable table; `node_column` makes rows open that node's details."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        attr = f' data-node="{esc(row[node_column])}"' if node_column is not None else ""
        cells = "".join(f"<td>{esc('' if c is None else c)}</td>" for c in row)
        body.append(f"<tr{attr}>{cells}</tr>")
    return (f'<table class="data sortable"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


# --- charts ----------------------------------------------------------------------------------


def _memory_chart(report: Report, width: int = 960, height: int = 220) -> str:
    """Live bytes per node, the peak marked, a tooltip on every plotted point, and the room a
    known device leaves for them (its memory less what stays resident) as a dashed line."""
    memory = report.get(Memory)
    timeline = list(memory.timeline) if memory is not None else []
    if not timeline:
        return ""
    points = _bucket_max(timeline, TOOLTIP_POINTS)
    peak = max(max(timeline), 1)
    room = _device_room(report)
    top = max(peak, room[1]) * 1.05 if room is not None and room[1] <= 1.5 * peak else peak
    peak_index = timeline.index(max(timeline))
    pad_l, pad_b = 70, 24
    plot_w, plot_h = width - pad_l - 10, height - pad_b - 20

    def x(i: float) -> float:
        return pad_l + plot_w * i / max(len(timeline) - 1, 1)

    def y(v: float) -> float:
        return 20 + plot_h * (1 - v / top)

    nodes = report.nodes
    aligned = len(nodes) == len(timeline)
    coords = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in _bucket_max(timeline, CHART_POINTS))
    tips = "".join(
        f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" class="tip"><title>'
        + esc(f"{binary_bytes(v)} live after #{nodes[int(i)].id} "
              f"{short_op(nodes[int(i)].target)} · {nodes[int(i)].module or '(root)'}"
              if aligned else f"{binary_bytes(v)} live after op {int(i)}")
        + "</title></circle>" for i, v in points)
    phases = _phase_bands(report, x, 20, plot_h)
    peak_node = nodes[peak_index] if aligned else None
    label = (f"peak {binary_bytes(peak)} at node {peak_node.id if peak_node else peak_index}"
             + (f" ({peak_node.module or '(root)'})" if peak_node else ""))
    ticks = "".join(f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" class="tick" '
                    f'text-anchor="end">{esc(binary_bytes(v))}</text>'
                    f'<line x1="{pad_l}" x2="{width - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                    'class="grid"/>' for v in (0, top / 4, top / 2, 3 * top / 4, top))
    data_node = f' data-node="{peak_node.id}"' if peak_node else ""
    return (f'<svg id="memory-chart" class="chart" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="live memory per node">{phases}{ticks}'
            f'<polyline points="{coords}" class="line"/>{tips}'
            f'{_room_line(room, top, y, pad_l, width, height - 6)}'
            f'<line x1="{x(peak_index):.1f}" x2="{x(peak_index):.1f}" y1="20" '
            f'y2="{20 + plot_h}" class="peak"/>'
            f'<circle cx="{x(peak_index):.1f}" cy="{y(peak):.1f}" r="4" class="peak"'
            f'{data_node}><title>{esc(label)}</title></circle>'
            f'<text x="{min(x(peak_index) + 6, width - 260):.1f}" y="14" class="peak-label">'
            f"{esc(label)}</text>"
            f'<text x="{pad_l}" y="{height - 6}" class="tick">node order →  '
            f"({len(timeline)} ops; {_live_what(report)})</text>"
            "</svg>")


def _device_room(report: Report) -> tuple[str, int] | None:
    """The device the report knows (the training fit's, else the roofline's) and the bytes it
    leaves for the line: its memory less weights (and states, KV cache) that stay resident."""
    training, roofline = report.get(Training), report.get(Roofline)
    if training is not None and training.fit is not None:
        name, capacity = training.fit.device, training.fit.device_bytes
        resident = training.peak_breakdown.persistent_bytes
    elif roofline is not None and roofline.device.capacity_bytes > 0:
        name, capacity = roofline.device.name, roofline.device.capacity_bytes
        resident = (training.peak_breakdown.persistent_bytes if training is not None else
                    report.model.param_bytes + report.model.buffer_bytes)
    else:
        return None
    return name, capacity - resident


def _room_line(room: tuple[str, int] | None, top: float, y: Any, left: float, width: float,
               bottom: float) -> str:
    if room is None:
        return ""
    name, free = room
    text = f"{name}: {binary_bytes(free)} left for these after what stays resident"
    if free > top:
        return (f'<text x="{width - 12}" y="{bottom}" class="tick capacity" '
                f'text-anchor="end">{esc(text)} (off the chart)</text>')
    return (f'<line x1="{left}" x2="{width - 10}" y1="{y(max(free, 0)):.1f}" '
            f'y2="{y(max(free, 0)):.1f}" class="capacity"><title>{esc(text)}</title></line>'
            f'<text x="{width - 12}" y="{y(max(free, 0)) - 4:.1f}" class="tick capacity" '
            f'text-anchor="end">{esc(text)}</text>')


def _live_what(report: Report) -> str:
    """What the memory timeline counts: activations, and in a training step gradients and the
    optimizer's temporaries too (weights and optimizer state are resident, not in the line)."""
    if report.get(Training) is not None:
        return "live activations and gradients of the step, resident states excluded"
    return "live activations of the graph executor, weights excluded"


def _bucket_max(values: Sequence[int], limit: int) -> list[tuple[float, int]]:
    if len(values) <= limit:
        return list(enumerate(values))
    step = len(values) / limit
    out = []
    for b in range(limit):
        lo, hi = int(b * step), max(int((b + 1) * step), int(b * step) + 1)
        chunk = values[lo:hi]
        best = max(range(len(chunk)), key=chunk.__getitem__)
        out.append((float(lo + best), chunk[best]))
    return out


def _phase_bands(report: Report, x: Any, top: float, plot_h: float) -> str:
    bands, start = [], 0
    nodes = report.nodes
    for i in range(1, len(nodes) + 1):
        if i == len(nodes) or nodes[i].phase != nodes[start].phase:
            bands.append((nodes[start].phase, start, i - 1))
            start = i
    if len(bands) < 2:
        return ""
    return "".join(f'<rect x="{x(a):.1f}" y="{top}" width="{max(x(b) - x(a), 1):.1f}" '
                   f'height="{plot_h}" class="phase phase-{k % 3}"><title>{esc(p)}</title>'
                   f'</rect><text x="{x(a) + 4:.1f}" y="{top + 12}" class="tick">{esc(p)}'
                   "</text>" for k, (p, a, b) in enumerate(bands))


def _roofline_chart(report: Report, width: int = 640, height: int = 360) -> str:
    """Each node at (FLOP/byte, FLOP/s). NB: when the section gives no intensity, the
    x position is the node's FLOPs over its bytes moved, a plot coordinate only."""
    roofline = report.get(Roofline)
    if roofline is None:
        return ""
    by_id = {n.id: n for n in report.nodes}
    points = []
    for entry in roofline.nodes:
        node = by_id.get(entry.id)
        if node is None or not node.flops or not entry.time_s:
            continue
        moved = node.bytes_read + node.bytes_written
        intensity = entry.intensity or (node.flops / moved if moved else None)
        if intensity:
            points.append((node, float(intensity), node.flops / entry.time_s))
    if not points:
        return ""
    return _log_scatter(points, roofline_roof(report), width, height)


def _log_scatter(points: list[tuple[NodeReport, float, float]],
                 roof_spec: tuple[float, float, str] | None, width: int, height: int) -> str:
    xs = [p[1] for p in points]
    ys = [p[2] for p in points] + ([roof_spec[0]] if roof_spec else [])
    x0, x1 = math.log10(min(xs)) - 0.3, math.log10(max(xs)) + 0.3
    y0, y1 = math.log10(min(ys)) - 0.3, math.log10(max(ys)) + 0.3
    pad = 72

    def px(v: float) -> float:
        return pad + (width - pad - 10) * (math.log10(v) - x0) / (x1 - x0)

    def py(v: float) -> float:
        return 10 + (height - pad - 10) * (1 - (math.log10(v) - y0) / (y1 - y0))

    roof = ""
    if roof_spec:
        peak, bandwidth, label = roof_spec
        lo, hi = 10 ** x0, 10 ** x1
        ridge = peak / bandwidth
        pts = [(lo, lo * bandwidth), (max(min(ridge, hi), lo), min(ridge, hi) * bandwidth),
               (hi, peak)]
        roof = ('<polyline class="roof" points="'
                + " ".join(f"{px(a):.1f},{py(max(b, 10 ** y0)):.1f}" for a, b in pts) + '"/>'
                f'<text x="{width - 12}" y="{py(peak) - 5:.1f}" class="tick" '
                f'text-anchor="end">{esc(label)} peak {esc(si(peak, "FLOP/s"))}</text>')
    dots = "".join(f'<circle cx="{px(i):.1f}" cy="{py(f):.1f}" r="3" data-node="{n.id}">'
                   f"<title>{esc(_point_title(n))}</title></circle>" for n, i, f in points)
    ticks = "".join(
        f'<line x1="{px(10 ** e):.1f}" x2="{px(10 ** e):.1f}" y1="10" y2="{height - pad}" '
        f'class="grid"/><text x="{px(10 ** e):.1f}" y="{height - pad + 14}" class="tick" '
        f'text-anchor="middle">{esc(_power_of_ten(e))}</text>'
        for e in range(math.ceil(x0), math.floor(x1) + 1))
    ticks += "".join(
        f'<line x1="{pad}" x2="{width - 10}" y1="{py(10 ** e):.1f}" y2="{py(10 ** e):.1f}" '
        f'class="grid"/><text x="{pad - 4}" y="{py(10 ** e) + 4:.1f}" class="tick" '
        f'text-anchor="end">{esc(_power_of_ten(e))}</text>'
        for e in range(math.ceil(y0), math.floor(y1) + 1))
    axes = (f'<text x="{width / 2}" y="{height - 8}" class="tick" text-anchor="middle">'
            "arithmetic intensity (FLOP/byte, log)</text>"
            f'<text x="12" y="{height / 2}" class="tick" transform="rotate(-90 12 '
            f'{height / 2})" text-anchor="middle">FLOP/s (log)</text>')
    return (f'<svg id="roofline-chart" class="chart" viewBox="0 0 {width} {height}">'
            f"{ticks}{roof}<g class=\"dots\">{dots}</g>{axes}</svg>")


def _power_of_ten(exponent: int) -> str:
    """``10 G``, ``100 M``, ``0.1``: a log axis tick, SI like every figure."""
    return si(10.0 ** exponent).replace(".00", "")


def _point_title(node: NodeReport) -> str:
    return f"#{node.id} {short_op(node.target)} · {node.module or '(root)'}"


# --- findings, quantization ------------------------------------------------------------------


def render_view(view: View) -> str:
    """A view's tables as static sortable HTML tables, every string escaped."""
    return "".join(_render_block(block) for block in view.blocks)


def _render_block(block: Block) -> str:
    if isinstance(block, SideBySide):
        return ('<div class="side">' + "".join(_render_block(t) for t in block.tables)
                + "</div>")
    if isinstance(block, Code):
        return (f'<div class="view-code"><h3>{esc(block.title)}</h3><pre><code class="'
                f'language-{esc(block.language)}">{esc(block.text)}</code></pre></div>')
    if isinstance(block, Chart):
        return chart_svg(block)
    head = "".join(f'<th class="{"num" if c.right else ""}">{esc(c.name)}</th>'
                   for c in block.columns) if block.show_header else ""
    body = "".join("<tr>" + "".join(_cell_html(c, col.right or False)
                                    for c, col in zip(row, block.columns, strict=True))
                   + "</tr>" for row in block.rows)
    caption = f'<p class="muted">{esc(block.caption)}</p>' if block.caption else ""
    return (f'<div class="view-table"><h3>{esc(block.title)}</h3>'
            f'<table class="data sortable">{f"<thead><tr>{head}</tr></thead>" if head else ""}'
            f"<tbody>{body}</tbody></table>{caption}</div>")


def _cell_html(cell: Cell, right: bool) -> str:
    classes = " ".join(c for c in ("num" if right else "", f"tone-{cell.tone.value}") if c)
    text = esc(cell.text).replace("\n", "<br>")
    tail = "".join(f'<span class="tone-{tone.value}">{esc(part)}</span>'
                   for part, tone in cell.tail)
    return f'<td class="{classes}">{text}{tail}</td>'


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


# --- graph -----------------------------------------------------------------------------------


def _graph_section(svg: str | None, blocks: BlockGraphs | None = None,
                   legends: Sequence[Legend] = ()) -> str:
    if not svg:
        return ('<p class="muted" id="graph-missing">The graph image needs graphviz\'s '
                "<code>dot</code> (apt-get install graphviz); graph.dot was written next to "
                "this report.</p>")
    templates = "".join(f'<template id="block-graph-{i}">{clean_svg(s)}</template>'
                        for i, s in enumerate(blocks.svgs if blocks else ()))
    hint = "click a block to see its ops in place" if blocks and blocks.svgs else ""
    return ('<div class="toolbar"><button id="zoom-in">+</button><button id="zoom-out">−'
            '</button><button id="zoom-fit">fit</button><button id="graph-back" hidden>'
            '← whole graph</button><span class="muted">drag to pan, wheel to zoom, click a '
            f"node for its details{'; ' + hint if hint else ''}</span></div>"
            + "".join(_legend_html(legend, i - 1) for i, legend in enumerate(legends))
            + f'<div id="graph-view">{clean_svg(svg)}</div>{templates}')


def _legends(report: Report, blocks: BlockGraphs | None, color: str, expand: bool
             ) -> tuple[Legend, ...]:
    """The colour legend of the whole graph, then of each block graph (its own scale)."""
    first: dict[int, int] = {}
    for block, graph in sorted(blocks.of_block.items() if blocks else ()):
        first.setdefault(graph, block)
    return (dot_legend(report, color, expand),
            *(dot_legend(report, color, block=first[i]) for i in sorted(first)))


def _legend_html(legend: Legend, graph: int) -> str:
    """A colour legend above the graph, where panning and zooming never move it; the page
    shows the one of the graph on display (-1: the whole graph, else block graph `graph`)."""
    bins = "".join(f'<span class="bin"><i style="background:{esc(b.color)}"></i>'
                   f"{esc(b.text)}</span>" for b in legend.bins)
    shown = ('id="graph-legend" data-graph="whole"' if graph < 0 else
             f'data-graph="{graph}" hidden')
    return (f'<div class="legend" {shown}><b>{esc(legend.title)}</b>{bins}'
            f'<span class="muted">{esc(legend.note)}</span></div>')


def clean_svg(svg: str) -> str:
    """Graphviz SVG ready to inline: no XML prolog or doctype, no fixed size, no scripts."""
    svg = re.sub(r"<\?xml.*?\?>|<!DOCTYPE.*?>|<!--.*?-->", "", svg, flags=re.S)
    svg = re.sub(r"<script\b.*?</script\s*>|<foreignObject\b.*?</foreignObject\s*>", "", svg,
                 flags=re.S | re.I)
    return re.sub(r"<svg\b([^>]*?)\s(?:width|height)=\"[^\"]*\"([^>]*?)\s(?:width|height)="
                  r"\"[^\"]*\"", r"<svg\1\2", svg, count=1).strip()


__all__ = ["clean_svg", "render_html"]
