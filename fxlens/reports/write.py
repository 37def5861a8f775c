"""Write the rendered files of one report: graph.dot (+ .svg/.png), report.html, summary.md.

The renderers (`dot`, `html`, `markdown`) are pure; this is the one place in `reports/` that
touches the file system or runs graphviz; every file is written atomically
(`fxlens.analyzer.core.files.write_atomic`), so a failed run never leaves half a page. It
never prints: it returns what it wrote and the notes the CLI should show (e.g. graphviz
missing), so `fxlens.cli` stays the only printer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.files import write_atomic
from fxlens.analyzer.core.report import Report
from fxlens.reports.dot import (
    DOT_TIMEOUT_S,
    block_runs,
    dot_binary,
    graphviz_render,
    render_block_dot,
    render_dot,
)
from fxlens.reports.html import BlockGraphs, render_html
from fxlens.reports.markdown import render_markdown

DEFAULT_SVG_BUDGET_S = 10


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


def write_pages(report: Report, options: PageOptions) -> Written:
    """Render and write every page; graphviz output only when the `dot` binary exists."""
    written = Written()
    dot_source = render_dot(report, options.color, options.expand)
    _write(written, options.dot or options.folder / "graph.dot", dot_source)
    svg = None
    if dot_binary() is None:
        written.notes.append("graphviz's `dot` not found: wrote graph.dot only, no SVG/PNG "
                             "and no graph in the HTML (apt-get install graphviz)")
    else:
        svg_path = options.svg or options.folder / "graph.svg"
        # NB: graphviz's cluster layout grows steeply with many blocks (llama-3-70b's 80 took
        # minutes); the default SVG gets a short budget, an asked-for --svg the long one.
        budget = DOT_TIMEOUT_S if options.svg else DEFAULT_SVG_BUDGET_S
        try:
            svg = graphviz_render(dot_source, "svg", budget).decode("utf-8")
            _write(written, svg_path, svg)
            if options.png:
                png_path = svg_path.with_suffix(".png")
                write_atomic(png_path, graphviz_render(dot_source, "png"))
                written.paths.append(png_path)
        except ReportError as error:
            written.notes.append(f"graph image skipped: {error}; graph.dot is written "
                                 f"(render it with --svg PATH, up to {DOT_TIMEOUT_S} s)")
    blocks = _block_graphs(report, options, written) if svg is not None else None
    _write(written, options.html or options.folder / "report.html",
           render_html(report, svg, block_graphs=blocks))
    _write(written, options.md or options.folder / "summary.md", render_markdown(report))
    return written


def _block_graphs(report: Report, options: PageOptions, written: Written) -> BlockGraphs | None:
    """Each run's first block with every op drawn, for the page to expand in place of the
    run's summary nodes; skipped (with a note) past the SVG budget."""
    if options.expand:
        return None
    runs = block_runs(report)
    svgs: list[str] = []
    of_block: dict[int, int] = {}
    try:
        for run in runs:
            dot = render_block_dot(report, run[0], options.color)
            svgs.append(graphviz_render(dot, "svg", DEFAULT_SVG_BUDGET_S).decode("utf-8"))
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
