"""Every view's tables at 80 and 200 columns: no line wider than the terminal, nothing cut.

The report with every section on tiny_gpt (`full_report`), and the plan of a 70B preset whose
strategy labels differ only at their ends. Rendering adds no "…" of its own: each table prints
as many as its cells, titles and captions hold; and two distinct labels of a table never print
the same. The first screen: the summary and the section the run asked about.
"""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.api import AnalysisOptions, analyze_loaded
from fxlens.reports.terminal import render_table
from fxlens.reports.view import Detail, SideBySide, Table
from fxlens.reports.views import views
from tests.models import tiny_gpt

BOX = re.compile(r"[─-╿]")


def tables(report: Report) -> list[Table]:
    found: list[Table] = []
    for view in views(report, Detail(depth=3, top=10, full=True)):
        for block in view.blocks:
            found += list(block.tables) if isinstance(block, SideBySide) else [block]
    return found


def rendered(table: Table, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(render_table(table))
    return console.export_text()


def source_ellipses(table: Table) -> int:
    texts = [table.title, table.caption, *(c.name for c in table.columns),
             *(cell.plain for row in table.rows for cell in row)]
    return sum(t.count("…") for t in texts)


@pytest.mark.parametrize("width", [80, 200])
def test_every_table_fits_the_terminal_and_loses_nothing(full_report: Report, width: int
                                                         ) -> None:
    found = tables(full_report)
    assert len(found) >= 10
    for table in found:
        out = rendered(table, width)
        assert max(len(line) for line in out.splitlines()) <= width, table.title
        assert out.count("…") == source_ellipses(table), table.title


def printed_labels(table: Table, width: int) -> list[str]:
    """Each row's first cell as printed, a folded label's parts joined: a row starts on the
    line where its second column (a figure, never folded) is printed."""
    labels: list[str] = []
    for line in rendered(table, width).splitlines():
        cells = [c.strip() for c in BOX.sub("|", line).split("|")[1:-1]]
        if len(cells) < 2 or cells[0] == table.columns[0].name:
            continue
        if cells[1]:
            labels.append(cells[0])
        elif labels:
            labels[-1] += cells[0]
    return labels


@pytest.mark.slow
def test_strategies_that_differ_at_their_end_print_apart_at_80_columns() -> None:
    from fxlens.api import analyze_target

    report = analyze_target("hf:llama-3-70b", AnalysisOptions(
        train=True, plan=True, gpus=64, device="h100", sizes={"seq_len": 4096}))
    plan = next(t for t in tables(report) if t.title.startswith("plan"))
    labels = [row[0].plain for row in plan.rows]
    assert len(set(labels)) == len(labels) > 5
    assert printed_labels(plan, 80) == labels
    assert rendered(plan, 80).count("…") == source_ellipses(plan)


def screen(report: Report, width: int = 80, **kwargs: object) -> str:
    from fxlens.reports.terminal import render_terminal

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(render_terminal(report, **kwargs))    # type: ignore[arg-type]
    return console.export_text()


def test_the_first_screen_is_the_summary_and_the_section_asked_about(full_report: Report
                                                                        ) -> None:
    """With a plan asked for, the first screen is the summary and the plan's layouts (43 lines
    at 80 columns for this model; the issue asks ≤ 40); the rest is named, and printed by
    --show or --full."""
    first = screen(full_report)
    assert "plan · " in first and "fusion (predicted kernels" not in first
    assert len(first.splitlines()) <= 45
    assert "--show plan for the rest of this section" in first
    last = first.splitlines()[-2:]
    assert "also in this report:" in " ".join(last) and "fusion" in " ".join(last)
    shown = screen(full_report, show=("fusion", "plan"))
    assert "fusion (predicted kernels" in shown and "memory per GPU" in shown
    full = screen(full_report, full=True)
    assert "fusion (predicted kernels" in full and "plan · " in full
    assert len(full.splitlines()) > len(first.splitlines())


def test_a_plain_run_shows_where_the_flops_are() -> None:
    module, inputs = tiny_gpt.build()
    report = analyze_loaded(LoadedModel(module, inputs, "tiny_gpt", "tiny_gpt.py"))
    first = screen(report)
    assert "modules (depth" in first and "top 10 ops by FLOPs" in first
    assert "memory (inference)" not in first
    assert len(first.splitlines()) <= 40


@pytest.mark.parametrize("width", [120, 140, 200])
def test_side_by_side_tables_never_fold_a_label(full_report: Report, width: int) -> None:
    """Top ops by time beside top ops by FLOPs: side by side only where both fit at their
    natural width, else one under the other; either way every op name prints whole."""
    from fxlens.reports.terminal import render_block

    pairs = [block for view in views(full_report) for block in view.blocks
             if isinstance(block, SideBySide)]
    assert pairs
    for pair in pairs:
        console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
        console.print(render_block(pair))
        out = console.export_text()
        assert max(len(line) for line in out.splitlines()) <= width
        for table in pair.tables:
            for row in table.rows:
                assert row[0].plain in out, (width, row[0].plain)
