"""The terminal format: views → rich renderables. Pure: the CLI decides where they print.

Every cell becomes a `rich.text.Text`, never a markup string, so a module or op name holding
``[bold]`` or ``[/]`` prints as itself. FLOPs and parameter counts use SI prefixes (G = 10⁹),
bytes binary ones (GiB = 2³⁰); the summary says so.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table as RichTable
from rich.text import Text

from fxlens.analyzer.core.report import Report
from fxlens.reports.view import Block, Cell, SideBySide, Table, Tone, View
from fxlens.reports.views import views

STYLES = {Tone.PLAIN: "", Tone.STRONG: "bold", Tone.GOOD: "bold green", Tone.BAD: "bold red",
          Tone.WARN: "yellow", Tone.MUTED: "dim"}


def render_terminal(report: Report, depth: int = 2, top: int = 10) -> RenderableType:
    """Every view of the report, in reading order."""
    return Group(*(render_view(view) for view in views(report, depth, top)))


def render_view(view: View) -> RenderableType:
    blocks = [render_block(block) for block in view.blocks]
    return blocks[0] if len(blocks) == 1 else Group(*blocks)


def render_block(block: Block) -> RenderableType:
    if isinstance(block, SideBySide):
        grid = RichTable.grid(padding=(0, 2))
        grid.add_row(*(render_table(t) for t in block.tables))
        return grid
    return render_table(block)


def render_table(table: Table) -> RichTable:
    out = RichTable(title=Text(table.title), title_justify="left",
                    show_header=table.show_header,
                    caption=Text(table.caption) if table.caption else None)
    for column in table.columns:
        out.add_column(column.name, justify="right" if column.right else "left",
                       style="bold" if column.strong else None,
                       overflow="fold" if column.fold else "ellipsis", no_wrap=column.no_wrap)
    for row in table.rows:
        out.add_row(*(text(c) for c in row))
    return out


def text(cell: Cell) -> Text:
    out = Text(cell.text, style=STYLES[cell.tone])
    for part, tone in cell.tail:
        out.append(part, style=STYLES[tone])
    return out
