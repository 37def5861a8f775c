"""View of the fusion sections: kernels and bytes before and after fusion, and the findings
ranked by bytes saved (with the time saved on the roofline device when one was given)."""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Findings, Fusion
from fxlens.reports.units import binary_bytes, seconds
from fxlens.reports.view import Block, Table, View, columns


def fusion_view(report: Report, depth: int, top: int) -> View | None:
    fusion, found = report.get(Fusion), report.get(Findings)
    blocks: list[Block] = []
    if fusion is not None:
        blocks.append(Table.of(
            "fusion (predicted kernels of a fusing compiler, Inductor default)",
            columns(("",), ("kernels", "bytes moved")),
            [("unfused (one kernel per op)", str(fusion.kernels_unfused),
              binary_bytes(fusion.bytes_unfused)),
             ("fused", str(fusion.kernels_fused), binary_bytes(fusion.bytes_fused))]))
    if found is not None and found.items:
        items = found.items
        rows = [(f.code, (f.modules or ("",))[0] or "(root)", binary_bytes(f.saved_bytes),
                 seconds(f.saved_s) if f.saved_s is not None else "-",
                 f"{f.message}\nfix: {f.fix}") for f in items[:top]]
        blocks.append(Table.of(
            f"fusion findings (top {min(top, len(items))} of {len(items)}, by bytes saved)",
            columns(("code", "module"), ("saves", "time")) + columns(("finding · fix",), ()),
            rows))
    return View("fusion", "Fusion", tuple(blocks)) if blocks else None
