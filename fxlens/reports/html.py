"""One self-contained HTML page for a report: inline CSS and JS, no CDN, works offline.

`render_html(report, svg)` is pure. The page has the report JSON embedded in a
``<script type="application/json" id="fxlens-data">`` block (written with `json_script`, so no
``</script>`` can close it early) and a small script (`html_assets/report.js`) that builds
the big parts from it on the client: the module tree (expandable, sortable by any column) and
the ops table (filter box, sortable, virtually scrolled: only the rows on screen exist in the
DOM), so a 2,000-node LLM page is interactive in well under a second.

Rendered here, with every user-derived string through `html_escape`: the headline cards
(`fxlens.reports.views.headline`), hotspots (FLOPs; time with a roofline section; memory with a
memory section), then one section per view (`fxlens.reports.views`: memory, training, KV cache,
roofline, validation, fusion, quantization — the same views the terminal and Markdown show)
with the memory timeline and roofline charts (`fxlens.reports.html_charts`) beside their
tables, and the graph: graphviz's SVG inline (its text is already XML-escaped by graphviz; the
XML prolog, fixed size and any script element are removed), with pan and zoom, the colour
legend of the graph on display above it (`fxlens.reports.graph_legend`: the whole graph's, or
an expanded block's own scale), and a details panel on click. The page's data says what each
folded node of the SVG stands for (`fxlens.reports.graph_groups.page_graph`): a run of alike
blocks (``b<i>``) opens its first block in place and shows that block's figures with the run's
totals and a link to its row in the modules table; the input plumbing (``p0``) lists its ops;
hidden asserts are never "first op". The JS only ever writes report strings through
``textContent``.

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

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fxlens.analyzer.core.report import NodeReport, Report
from fxlens.analyzer.core.sections import Memory
from fxlens.reports.chart_svg import chart_svg
from fxlens.reports.dot import collapsed_blocks, dot_legend
from fxlens.reports.escape import html_escape as esc
from fxlens.reports.escape import json_script
from fxlens.reports.graph_groups import page_graph, plan_graph
from fxlens.reports.graph_legend import Legend
from fxlens.reports.html_charts import memory_chart, roofline_chart
from fxlens.reports.sections import module_times, node_times
from fxlens.reports.units import binary_bytes, percent, seconds, short_op, si
from fxlens.reports.view import Block, Cell, Chart, Code, Detail, Figure, SideBySide, View
from fxlens.reports.views import asked_first, views
from fxlens.reports.views.headline import headline, inputs_text
from fxlens.reports.views.model import UNITS_NOTE, coverage_figure

INTERACTIVE = {"summary", "modules", "top-ops"}   # the page's own cards, tree and ops table
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
    charts = {"memory": memory_chart, "training": memory_chart, "roofline": roofline_chart}
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
