"""The presentation model every surface renders: a section's view is titled tables of text.

A view function (`fxlens.reports.views`) turns one typed section into a `View`: tables whose
cells are already formatted strings (and, where a section carries code to paste, a `Code`
block; where a curve reads better drawn, a `Chart` of figures in base units beside the table
that lists them) (units formatted once, in `fxlens.reports.units`), with
a tone where a cell is a verdict. The formats — terminal (`terminal`), HTML (`html`),
Markdown (`markdown`) — render any view the same generic way, each escaping user text with
its own one function, so a section shown on one surface is shown on all.

Nothing here touches a report: views are plain frozen data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum


class Tone(str, Enum):
    """How a cell reads at a glance; formats map it to colour or emphasis."""

    PLAIN = "plain"
    STRONG = "strong"      # a headline figure (bold)
    GOOD = "good"          # a passing verdict (bold green)
    BAD = "bad"            # a failing verdict or a gap (bold red)
    WARN = "warn"          # worth a look (yellow)
    MUTED = "muted"        # a note (dim)


@dataclass(frozen=True)
class Cell:
    text: str
    tone: Tone = Tone.PLAIN
    # A cell may carry extra runs of text with their own tone (a coverage line whose gaps are
    # red): rendered after `text`.
    tail: tuple[tuple[str, Tone], ...] = ()

    @property
    def plain(self) -> str:
        return self.text + "".join(text for text, _ in self.tail)


def cell(value: str | Cell, tone: Tone = Tone.PLAIN) -> Cell:
    return value if isinstance(value, Cell) else Cell(value, tone)


@dataclass(frozen=True)
class Column:
    name: str
    right: bool = False          # figures align right
    strong: bool = False         # a label column (bold)
    no_wrap: bool = False


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    caption: str = ""
    show_header: bool = True

    @staticmethod
    def of(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str | Cell]],
           caption: str = "", show_header: bool = True) -> Table:
        return Table(title, tuple(columns), tuple(tuple(cell(c) for c in row) for row in rows),
                     caption, show_header)


def columns(text: Sequence[str], figures: Sequence[str]) -> tuple[Column, ...]:
    """`text` columns left-aligned, then `figures` columns right-aligned."""
    return (*(Column(n) for n in text), *(Column(n, right=True) for n in figures))


@dataclass(frozen=True)
class SideBySide:
    """Tables meant to be read side by side (top ops by time beside top ops by FLOPs)."""

    tables: tuple[Table, ...]


@dataclass(frozen=True)
class Code:
    """Text to copy as it is (a policy to paste): every format shows it verbatim, in a
    monospaced block, never wrapped or reflowed."""

    title: str
    text: str
    language: str = "python"


@dataclass(frozen=True)
class Series:
    """One line of a `Chart`: points (x, y) in the axes' base units, in order of x."""

    name: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Mark:
    """A point of a `Chart` called out with a label (the run's own choice on a curve)."""

    label: str
    x: float
    y: float


@dataclass(frozen=True)
class Chart:
    """A line chart of figures in base units; `x_unit` and `y_unit` ("B", "s" or "FLOP") pick
    the ticks' unit ladder (`fxlens.reports.axes`). HTML draws it (inline SVG); the text
    formats leave it out, so a view puts the table with the same numbers beside it."""

    title: str
    x_label: str
    y_label: str
    x_unit: str
    y_unit: str
    series: tuple[Series, ...]
    marks: tuple[Mark, ...] = ()
    caption: str = ""


Block = Table | SideBySide | Code | Chart


@dataclass(frozen=True)
class Detail:
    """How much a view shows: module-tree `depth`, `top` rows per ranking, and `full` for the
    tables a first screen can do without (per-module breakdowns, fix texts)."""

    depth: int = 2
    top: int = 10
    full: bool = False


@dataclass(frozen=True)
class View:
    """One section as shown: `key` anchors it on pages, `title` names it."""

    key: str
    title: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)

    def tables(self) -> tuple[Table, ...]:
        out: list[Table] = []
        for block in self.blocks:
            if isinstance(block, Code | Chart):
                continue
            out.extend(block.tables if isinstance(block, SideBySide) else (block,))
        return tuple(out)


@dataclass(frozen=True)
class Figure:
    """One headline number: what it counts (`label`), the figure, and what it is made of."""

    label: str
    value: str
    detail: str = ""
    tone: Tone = Tone.PLAIN
