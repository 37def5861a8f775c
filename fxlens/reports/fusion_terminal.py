"""Terminal tables of the ``findings`` and ``fusion`` sections: Report → rich renderables. Pure.

The top findings ranked by bytes saved (the analyzer already sorted them) with the time saved
on the roofline device when one was given, and the kernels and bytes moved before and after
fusion. Bytes binary (KiB = 2¹⁰); nothing is computed here beyond formatting.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Finding, Findings, Fusion
from fxlens.reports.roofline_terminal import seconds
from fxlens.reports.units import binary_bytes


def fusion_parts(report: Report, top: int = 10) -> list[RenderableType]:
    """The fusion summary and the top findings, when the report has them, else none."""
    parts: list[RenderableType] = []
    fusion = report.get(Fusion)
    if fusion is not None:
        parts.append(fusion_summary(fusion))
    found = report.get(Findings)
    if found is not None and found.items:
        parts.append(findings_table(found.items, top))
    return parts


def fusion_summary(fusion: Fusion) -> Table:
    table = Table(title="fusion (predicted kernels of a fusing compiler, Inductor default)",
                  title_justify="left")
    for name in ("", "kernels", "bytes moved"):
        table.add_column(name, justify="left" if not name else "right")
    table.add_row("unfused (one kernel per op)", str(fusion.kernels_unfused),
                  binary_bytes(fusion.bytes_unfused))
    table.add_row("fused", str(fusion.kernels_fused), binary_bytes(fusion.bytes_fused))
    return table


def findings_table(rows: Sequence[Finding], top: int) -> Table:
    table = Table(title=f"fusion findings (top {min(top, len(rows))} of {len(rows)}, "
                        "by bytes saved)", title_justify="left")
    for name in ("code", "module", "saves", "time", "finding · fix"):
        table.add_column(name, justify="right" if name in ("saves", "time") else "left")
    for row in rows[:top]:
        modules = row.modules or ("",)
        table.add_row(row.code, Text(modules[0] or "<root>"), binary_bytes(row.saved_bytes),
                      seconds(row.saved_s) if row.saved_s is not None else "-",
                      Text(f"{row.message}\nfix: {row.fix}"))
    return table
