"""The terminal format: views → rich renderables. Pure: the CLI decides where they print.

Every cell becomes a `rich.text.Text`, never a markup string, so a module or op name holding
``[bold]`` or ``[/]`` prints as itself; every string goes through `terminal_escape` (`plain`),
so control characters and bidi overrides in a name show as ``\\x1b`` / ``\\u202e`` instead of
driving the terminal. FLOPs and parameter counts use SI prefixes (G = 10⁹),
bytes binary ones (GiB = 2³⁰); the summary says so.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table as RichTable
from rich.text import Text

from fxlens.analyzer.core.report import Report
from fxlens.reports.escape import terminal_escape
from fxlens.reports.view import (
    Block,
    Cell,
    Chart,
    Code,
    Detail,
    SideBySide,
    Table,
    Tone,
    View,
)
from fxlens.reports.views import first_screen, views

STACK_BELOW = 120   # columns: narrower terminals get side-by-side tables one under the other
STYLES = {Tone.PLAIN: "", Tone.STRONG: "bold", Tone.GOOD: "bold green", Tone.BAD: "bold red",
          Tone.WARN: "yellow", Tone.MUTED: "dim"}


def render_terminal(report: Report, depth: int = 2, top: int = 10, full: bool = False,
                    show: tuple[str, ...] = ()) -> RenderableType:
    """The first screen: the summary and the one section the run asked about (`ASKED`), then
    what else the report holds. `show` names the views to print instead; `full` prints every
    view with the per-module breakdowns and fix texts a first screen does without."""
    every = views(report, Detail(depth, top, full))
    if full:
        return Group(*(render_view(view) for view in every))
    keys = [view.key for view in every]
    wanted = set(show) or {"summary", *first_screen(keys)}
    parts: list[RenderableType] = []
    for view in every:
        if view.key not in wanted:
            continue
        if show or view.key == "summary" or len(view.blocks) == 1:
            parts.append(render_view(view))
            continue
        parts.append(render_block(view.blocks[0]))    # the section's answer; the rest named
        parts.append(plain(f"--show {view.key} for the rest of this section", "dim"))
    rest = [view.key for view in every if view.key not in wanted]
    if rest:
        parts.append(plain(f"also in this report: {', '.join(rest)} — --show NAME prints "
                           "one, --full every table; report.html holds them all", "dim"))
    return Group(*parts)


def render_view(view: View) -> RenderableType:
    """A view's blocks; a chart is left out (the table beside it holds its numbers)."""
    blocks = [render_block(block) for block in view.blocks if not isinstance(block, Chart)]
    return blocks[0] if len(blocks) == 1 else Group(*blocks)


def render_block(block: Block) -> RenderableType:
    if isinstance(block, Chart):
        return Group()
    if isinstance(block, SideBySide):
        return _SideBySide(tuple(render_table(t) for t in block.tables))
    if isinstance(block, Code):
        return Group(Text(terminal_escape(block.title), style="bold", overflow="fold"),
                     Text(terminal_escape(block.text, newlines=True), overflow="fold"))
    return render_table(block)


class _SideBySide:
    """Tables side by side on a terminal wide enough for both at their natural width (and at
    least `STACK_BELOW`), else one under the other: side by side, a table narrower than its
    content would fold its labels."""

    def __init__(self, tables: tuple[RenderableType, ...]) -> None:
        self.tables = tables

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        natural = sum(Measurement.get(console, options, table).maximum for table in self.tables)
        if options.max_width < max(STACK_BELOW, natural + 2 * (len(self.tables) - 1)):
            yield from self.tables
            return
        grid = RichTable.grid(padding=(0, 2))
        grid.add_row(*self.tables)
        yield grid


def render_table(table: Table) -> RenderableType:
    """The title on its own line, then the table. Nothing is cut: text wraps at spaces, and a
    word wider than its column (a strategy ``dp=8,tp=4,pp=2,zero=1,sp``, a dotted module
    path) folds onto the next line, so two labels that differ only at the end never print
    the same."""
    out = RichTable(show_header=table.show_header, caption_justify="left",
                    caption=plain(table.caption, "dim") if table.caption else None)
    for column in table.columns:
        out.add_column(plain(column.name), justify="right" if column.right else "left",
                       style="bold" if column.strong else None,
                       overflow="fold", no_wrap=column.no_wrap)
    for row in table.rows:
        out.add_row(*(text(c) for c in row))
    title = Text(terminal_escape(table.title), style="bold", overflow="fold")
    return Group(title, out)


def text(cell: Cell) -> Text:
    out = plain(cell.text, STYLES[cell.tone])
    for part, tone in cell.tail:
        out.append(terminal_escape(part, newlines=True), style=STYLES[tone])
    return out


def plain(value: object, style: str = "") -> Text:
    """User or report text as a rich `Text`: never markup, nothing that drives the terminal
    (a table cell may span lines, so ``\\n`` is kept)."""
    return Text(terminal_escape(value, newlines=True), style=style)
