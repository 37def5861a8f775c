"""A compact Markdown summary of a report, fit for a pull-request comment.

One headline table (parameters, FLOPs, bytes, coverage, and the memory, training, KV cache and
roofline figures when the report holds them), the top modules and ops by FLOPs, the top
findings when present, and the rest folded in ``<details>`` blocks so the comment stays short.
Every user-derived string goes through `markdown_escape`. Pure: Report → str.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

from fxlens.analyzer.core.report import Report
from fxlens.reports.dot import collapsed_blocks
from fxlens.reports.escape import markdown_escape as esc
from fxlens.reports.units import percent, si
from fxlens.reports.view import Chart, Code, Detail, SideBySide, Table, View
from fxlens.reports.views import asked_first, first_screen, views
from fxlens.reports.views.headline import headline, inputs_text
from fxlens.reports.views.model import coverage_figure

TOP = 5


def render_markdown(report: Report, top: int = TOP) -> str:
    model = report.model
    lines = [f"### fxlens · {esc(model.name)}", "",
             *_table(("figure", "value"), _headline(report)), ""]
    lines += _details(f"top {top} leaf modules by FLOPs", _module_rows(report, top),
                      ("module", "type", "params", "FLOPs", "share"))
    shown = {view.key: view for view in views(report, Detail(top=top))
             if view.key not in ("summary", "modules")}     # the headline and the leaf table
    asked = first_screen(list(shown))
    for key in asked_first(list(shown)):
        lines += render_view(shown[key], folded=key not in asked)    # the answer unfolded
    lines.append(f"<sub>capture: {esc(model.capture_method)} · fxlens "
                 f"{esc(report.meta.get('fxlens_version', ''))} · 1 MAC = 2 FLOPs · SI "
                 "prefixes for counts, binary for bytes</sub>")
    return "\n".join(lines) + "\n"


def _headline(report: Report) -> list[tuple[str, str]]:
    figures = (*headline(report), coverage_figure(report))
    return [*((f.label, f"{f.value} ({f.detail})" if f.detail else f.value) for f in figures),
            ("inputs", inputs_text(report) or "none")]


def _module_rows(report: Report, top: int) -> list[tuple[str, ...]]:
    """The leaf modules (no submodule of their own) that carry the most FLOPs; the same leaf
    of every repeated block is one row (``layers.*.mlp.up_proj ×32``)."""
    total = report.totals.flops
    blocks = collapsed_blocks(report)
    parents = {m.path.rpartition(".")[0] for m in report.modules if m.path}
    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for m in report.modules:
        if m.path and m.path not in parents:
            entry = groups[(_generic_path(m.path, blocks), m.type.rsplit(".", 1)[-1])]
            entry[0] += 1
            entry[1] += m.params
            entry[2] += m.flops
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][2], kv[0]))[:top]
    return [(path + (f" ×{count}" if count > 1 else ""), kind, si(params), si(flops),
             percent(flops, total)) for (path, kind), (count, params, flops) in ranked]


def _generic_path(path: str, blocks: Sequence[str]) -> str:
    for block in blocks:
        if path == block or path.startswith(block + "."):
            return block.rpartition(".")[0] + ".*" + path[len(block):]
    return path


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return lines


def _details(summary: str, rows: Sequence[Sequence[str]], header: Sequence[str]) -> list[str]:
    if not rows:
        return []
    return [f"<details><summary>{esc(summary)}</summary>", "", *_table(header, rows), "",
            "</details>", ""]


def render_view(view: View, folded: bool = True) -> list[str]:
    """One view, each table under its title, then caption; folded in a ``<details>`` block
    unless the view is the page's point (`folded` False: the section the run asked about, a
    sweep's table), which stands under a heading."""
    lines = ([f"<details><summary>{esc(view.title)}</summary>", ""] if folded else
             [f"#### {esc(view.title)}", ""])
    for block in view.blocks:
        if isinstance(block, Chart):
            continue      # the table beside it holds its numbers
        if isinstance(block, Code):
            lines += [f"**{esc(block.title)}**", "", *_fenced(block), ""]
            continue
        for table in block.tables if isinstance(block, SideBySide) else (block,):
            lines += _table_lines(table)
    return [*lines, "</details>", ""] if folded else lines


def _fenced(code: Code) -> list[str]:
    """A fenced block longer than any run of backticks in the code, so none closes it."""
    longest = max((len(run) for run in re.findall(r"`+", code.text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{code.language}", *code.text.splitlines(), fence]


def _table_lines(table: Table) -> list[str]:
    header = ([c.name for c in table.columns] if table.show_header
              else [""] * len(table.columns))
    lines = [f"**{esc(table.title)}**", "",
             *_table(header, [[c.plain for c in row] for row in table.rows])]
    # the blank line ends the table: a caption right under it would be read as a row
    return lines + (["", f"<sub>{esc(table.caption)}</sub>", ""] if table.caption else [""])
