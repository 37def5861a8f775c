"""View of the fusion sections: kernels and bytes before and after fusion, and the findings
ranked by bytes saved (with the time saved on the roofline device when one was given)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Finding, Findings, Fusion
from fxlens.reports.units import binary_bytes, seconds
from fxlens.reports.view import Block, Detail, Table, View, columns


def fusion_view(report: Report, detail: Detail) -> View | None:
    top = detail.top
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
        groups = grouped_findings(found.items)
        rows = [(g.code, g.module, binary_bytes(g.saved_bytes),
                 seconds(g.saved_s) if g.saved_s is not None else "-",
                 f"{g.message}\nfix: {g.fix}" if detail.full else g.message)
                for g in groups[:top]]
        blocks.append(Table.of(
            f"fusion findings (top {min(top, len(groups))} of {len(groups)}, "
            f"{len(found.items)} in all, by bytes saved; repeated blocks grouped)",
            columns(("code", "module"), ("saves", "time"))
            + columns(("finding · fix" if detail.full else "finding",), ()), rows,
            caption="" if detail.full else "how to fix each: analyze explain CODE "
                                            "(or --full)"))
    return View("fusion", "Fusion", tuple(blocks)) if blocks else None


@dataclass(frozen=True)
class FindingGroup:
    """The same finding in every block of a run: ``blocks.*.mlp.0 ×6``, figures summed."""

    code: str
    module: str
    saved_bytes: int
    saved_s: float | None
    message: str
    fix: str


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


def grouped_findings(items: Sequence[Finding]) -> list[FindingGroup]:
    """Findings that differ only in a block index, one group each, most bytes saved first."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in items:
        module = (f.modules or ("",))[0]
        groups.setdefault((f.code, _INDEX.sub("*", module), f.message), []).append(f)
    out = []
    for (code, generic, message), members in groups.items():
        module = members[0].modules[0] if len(members) == 1 and members[0].modules else generic
        times = [m.saved_s for m in members if m.saved_s is not None]
        out.append(FindingGroup(
            code, (module or "(root)") + (f" ×{len(members)}" if len(members) > 1 else ""),
            sum(m.saved_bytes for m in members), sum(times) if times else None, message,
            members[0].fix))
    return sorted(out, key=lambda g: (-g.saved_bytes, g.code, g.module))
