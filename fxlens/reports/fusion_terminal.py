"""Terminal tables of the ``findings`` and ``fusion`` sections: Report → rich renderables. Pure.

The top findings ranked by bytes saved (the analyzer already sorted them) with the time saved
on the roofline device when one was given, and the kernels and bytes moved before and after
fusion. Bytes binary (KiB = 2¹⁰); nothing is computed here beyond formatting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.core.report import Report
from fxlens.reports.roofline_terminal import seconds
from fxlens.reports.sections import findings
from fxlens.reports.units import binary_bytes


def fusion_parts(report: Report, top: int = 10) -> list[RenderableType]:
    """The fusion summary and the top findings, when the report has them, else none."""
    parts: list[RenderableType] = []
    fusion = report.sections.get("fusion")
    if isinstance(fusion, Mapping):
        parts.append(fusion_summary(fusion))
    rows = findings(report)
    if rows:
        parts.append(findings_table(rows, top))
    return parts


def fusion_summary(fusion: Mapping[str, Any]) -> Table:
    table = Table(title="fusion (predicted kernels of a fusing compiler, Inductor default)",
                  title_justify="left")
    for name in ("", "kernels", "bytes moved"):
        table.add_column(name, justify="left" if not name else "right")
    table.add_row("unfused (one kernel per op)", str(fusion.get("kernels_unfused", "-")),
                  binary_bytes(fusion.get("bytes_unfused", 0)))
    table.add_row("fused", str(fusion.get("kernels_fused", "-")),
                  binary_bytes(fusion.get("bytes_fused", 0)))
    return table


def findings_table(rows: list[dict[str, Any]], top: int) -> Table:
    table = Table(title=f"fusion findings (top {min(top, len(rows))} of {len(rows)}, "
                        "by bytes saved)", title_justify="left")
    for name in ("code", "module", "saves", "time", "finding · fix"):
        table.add_column(name, justify="right" if name in ("saves", "time") else "left")
    for row in rows[:top]:
        modules = row.get("modules") or [""]
        saved_s = row.get("saved_s")
        table.add_row(str(row.get("code", "")), Text(str(modules[0] or "<root>")),
                      binary_bytes(row.get("saved_bytes", 0)),
                      seconds(saved_s) if isinstance(saved_s, (int, float)) else "-",
                      Text(f"{row.get('message', '')}\nfix: {row.get('fix', '')}"))
    return table
