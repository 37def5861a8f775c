"""Write the rendered files of one report: graph.dot (+ .svg/.png), report.html, summary.md.

The renderers (`dot`, `html`, `markdown`) are pure; this is the one place in `reports/` that
touches the file system or runs graphviz; every file is written atomically
(`fxlens.analyzer.core.files.write_atomic`), so a failed run never leaves half a page. It
never prints: it returns what it wrote and the notes the CLI should show (e.g. graphviz
missing), so `fxlens.cli` stays the only printer.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.files import write_atomic
from fxlens.analyzer.core.report import Report
from fxlens.reports.dot import (
    DOT_TIMEOUT_S,
    Layout,
    dot_binary,
    graphviz_render,
    render_block_dot,
    render_dot,
)
from fxlens.reports.graph_groups import block_runs
from fxlens.reports.html import BlockGraphs, draft_html, finish_html
from fxlens.reports.markdown import render_markdown

DEFAULT_SVG_BUDGET_S = 10
PARALLEL_LAYOUTS = 4     # graphviz processes at once: more only share the same cores


@dataclass(frozen=True)
class PageOptions:
    """Where each file goes; None: the default name in `folder`."""

    folder: Path
    dot: Path | None = None
    svg: Path | None = None
    png: bool = False
    html: Path | None = None
    md: Path | None = None
    color: str = "flops"
    expand: bool = False


@dataclass
class Written:
    paths: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def start_layouts(report: Report, options: PageOptions) -> dict[str, Layout]:
    """The graph layouts `write_pages` will need, started now (each run's first block, then
    the whole graph; the first `PARALLEL_LAYOUTS` of them), by DOT source: given to
    `write_pages`, each is used if the report still gives the same source. None started
    without graphviz or where the report cannot be drawn yet (a colouring by a section
    still to come)."""
    if dot_binary() is None:
        return {}
    try:
        sources = _sources(report, options)
    except ReportError:
        return {}
    started: dict[str, Layout] = {}
    try:
        for source, budget in sources[:PARALLEL_LAYOUTS]:
            started[source] = Layout(source, "svg", budget)
    except (ReportError, OSError):   # no process to be had: write_pages lays out itself
        close_layouts(started)
        return {}
    return started


def close_layouts(layouts: Mapping[str, Layout]) -> None:
    for layout in layouts.values():
        layout.close()


def _sources(report: Report, options: PageOptions) -> list[tuple[str, float]]:
    """(DOT source, time budget) of each layout the pages need: each run's first block,
    then the whole graph. NB: graphviz's cluster layout grows steeply with many blocks
    (llama-3-70b's 80 took minutes); the default SVG gets a short budget, an asked-for
    --svg the long."""
    runs = [] if options.expand else _runs(report)
    blocks = [(render_block_dot(report, run[0], options.color), DEFAULT_SVG_BUDGET_S)
              for run in runs]
    budget = DOT_TIMEOUT_S if options.svg else DEFAULT_SVG_BUDGET_S
    return [*blocks, (render_dot(report, options.color, options.expand), budget)]


def _runs(report: Report) -> list[list[int]]:
    """Indices into `collapsed_blocks` of each run of alike blocks (one node in the graph,
    its first block drawn op by op for the page)."""
    return [list(range(run.first, run.first + run.count)) for run in block_runs(report)]


def write_pages(report: Report, options: PageOptions,
                started: Mapping[str, Layout] | None = None) -> Written:
    """Render and write every page; graphviz output only when the `dot` binary exists.

    The graphviz layouts (the whole graph, each run's first block; `PARALLEL_LAYOUTS` at
    once) run while Python renders the Markdown and every part of the HTML but the graph
    (`draft_html`): on a big report these are most of the pages' time, and they need
    nothing from each other. The blocks' start first: one layer's forward and backward is
    the longest layout (0.6 s on hf:llama-2-7b's training step, the whole graph 0.1 s). A
    layout in `started` (`start_layouts`, called as soon as the ops were costed) is read
    where its source is the one this report gives; the caller closes those."""
    written = Written()
    dot_path = options.dot or options.folder / "graph.dot"
    if dot_binary() is None:
        _write(written, dot_path, render_dot(report, options.color, options.expand))
        written.notes.append("graphviz's `dot` not found: wrote graph.dot only, no SVG/PNG "
                             "and no graph in the HTML (apt-get install graphviz)")
        svg, blocks = None, None
        markdown, draft = render_markdown(report), draft_html(report)
    else:
        runs = [] if options.expand else _runs(report)
        started = started or {}
        sources = _sources(report, options)
        with ThreadPoolExecutor(max_workers=PARALLEL_LAYOUTS) as pool:
            laid_out = [pool.submit(started[source].result) if source in started
                        else pool.submit(graphviz_render, source, "svg", budget)
                        for source, budget in sources]
            dot_source = sources[-1][0]
            _write(written, dot_path, dot_source)
            markdown, draft = render_markdown(report), draft_html(report)
            svg = _graph_image(written, options, laid_out[-1], dot_source)
            blocks = (_block_graphs(runs, laid_out[:-1], written) if svg is not None and runs
                      else None)
    _write(written, options.html or options.folder / "report.html",
           finish_html(draft, svg, block_graphs=blocks, color=options.color,
                       expand=options.expand))
    _write(written, options.md or options.folder / "summary.md", markdown)
    return written


def _graph_image(written: Written, options: PageOptions, whole: Future[bytes],
                 dot_source: str) -> str | None:
    """The whole graph's SVG (and PNG, once the SVG made it) written; None, with a note,
    past its budget."""
    svg_path = options.svg or options.folder / "graph.svg"
    try:
        svg = whole.result().decode("utf-8")
        _write(written, svg_path, svg)
        if options.png:
            png_path = svg_path.with_suffix(".png")
            write_atomic(png_path, graphviz_render(dot_source, "png"))
            written.paths.append(png_path)
    except ReportError as error:
        written.notes.append(f"graph image skipped: {error}; graph.dot is written "
                             f"(render it with --svg PATH, up to {DOT_TIMEOUT_S} s)")
        return None
    return svg


def _block_graphs(runs: list[list[int]], laid_out: list[Future[bytes]], written: Written
                  ) -> BlockGraphs | None:
    """Each run's first block with every op drawn, for the page to expand in place of the
    run's summary nodes; skipped (with a note) past the SVG budget."""
    svgs: list[str] = []
    of_block: dict[int, int] = {}
    try:
        for run, svg in zip(runs, laid_out, strict=True):
            svgs.append(svg.result().decode("utf-8"))
            of_block.update({index: len(svgs) - 1 for index in run})
    except ReportError as error:
        written.notes.append(f"expanded blocks skipped on the page: {error}")
        return None
    return BlockGraphs(tuple(svgs), of_block)


def _write(written: Written, path: Path, text: str) -> None:
    write_atomic(path, text)
    written.paths.append(path)


def page_paths(options: PageOptions) -> list[Path]:
    """Every path `write_pages` may write, so the CLI can check them before an analysis."""
    svg = options.svg or options.folder / "graph.svg"
    return [options.dot or options.folder / "graph.dot", svg,
            *([svg.with_suffix(".png")] if options.png else []),
            options.html or options.folder / "report.html",
            options.md or options.folder / "summary.md"]


PAGE_MARK = 'id="fxlens-data"'     # in every report.html this module writes


def stale_pages(folder: Path) -> list[Path]:
    """The pages an earlier run left in `folder` (a run with ``--no-pages`` writes only the
    JSON, and a report.html beside it would describe another run). Only a folder whose
    report.html is one of ours counts: a user's own files of those names are left alone."""
    html = folder / "report.html"
    try:
        ours = PAGE_MARK in html.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    if not ours:
        return []
    named = page_paths(PageOptions(folder=folder, png=True))
    return [path for path in named if path.is_file()]
