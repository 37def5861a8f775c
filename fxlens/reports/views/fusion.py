"""View of the fusion sections: kernels and bytes before and after fusion, and the findings
ranked by the time they save on the roofline device when one was given, else by bytes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Finding, Findings, Fusion
from fxlens.reports.units import binary_bytes, seconds, si
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
             ("fused", str(fusion.kernels_fused), binary_bytes(fusion.bytes_fused))],
            caption=f"the default fusion saves {binary_bytes(default_saving(fusion))}"
                    + (f"; the findings' fixes save {binary_bytes(findings_saving(found))} "
                       f"in all, some beyond it (epilogues, attention, hand-written kernels)"
                       if found is not None and found.items else "")))
    if found is not None and found.items:
        groups = grouped_findings(found.items)
        rows = [(g.code, g.module, saves(g),
                 seconds(g.saved_s) if g.saved_s is not None else "-",
                 f"{g.message}\nfix: {g.fix}" if detail.full else g.message)
                for g in groups[:top]]
        blocks.append(Table.of(
            f"fusion findings (top {min(top, len(groups))} of {len(groups)}, "
            f"{len(found.items)} in all, by {ranked_by(groups)} saved, blocks grouped)",
            columns(("code", "module"), ("saves", "time"))
            + columns(("finding · fix" if detail.full else "finding",), ()), rows,
            caption="" if detail.full else "how to fix each: analyze explain CODE "
                                            "(or --full)"))
    return View("fusion", "Fusion", tuple(blocks)) if blocks else None


def default_saving(fusion: Fusion) -> int:
    """Bytes a fusing compiler's default policy takes off the traffic."""
    return fusion.bytes_unfused - fusion.bytes_fused


def findings_saving(found: Findings) -> int:
    """Bytes the findings' fixes take off the traffic, all of them applied."""
    return sum(f.saved_bytes for f in found.items)


@dataclass(frozen=True)
class FindingGroup:
    """The same finding in every block of a run: ``blocks.*.mlp.0 ×6``, figures summed."""

    code: str
    module: str
    saved_bytes: int
    saved_s: float | None
    message: str
    fix: str
    saved_flops: int = 0


def saves(group: FindingGroup) -> str:
    """What a finding's fix saves: bytes, and FLOPs where it skips work too."""
    moved = binary_bytes(group.saved_bytes)
    return f"{moved} + {si(group.saved_flops, 'FLOP')}" if group.saved_flops else moved


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


def grouped_findings(items: Sequence[Finding]) -> list[FindingGroup]:
    """Findings that differ only in a block index, one group each, most time saved first
    (most bytes where a finding has no time)."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in items:
        module = (f.modules or ("",))[0]
        groups.setdefault((f.code, _INDEX.sub("*", module), f.message), []).append(f)
    out = []
    for (code, generic, message), members in groups.items():
        module = members[0].modules[0] if len(members) == 1 and members[0].modules else generic
        times = [m.saved_s for m in members if m.saved_s is not None]
        out.append(FindingGroup(
            code, (module or "(root)") + _times(members),
            sum(m.saved_bytes for m in members), sum(times) if times else None, message,
            members[0].fix, sum(m.saved_flops for m in members)))
    if ranked_by(out) == "time":
        return sorted(out, key=lambda g: (-(g.saved_s or 0.0), -g.saved_bytes, g.code, g.module))
    return sorted(out, key=lambda g: (-g.saved_bytes, g.code, g.module))


def _times(members: Sequence[Finding]) -> str:
    """`` ×6`` for one finding in each of 6 blocks; `` ×6 (11 findings)`` where some blocks
    hold it twice (a residual add before each of a block's two norms)."""
    places = len({m.modules[0] if m.modules else "" for m in members})
    if len(members) == 1:
        return ""
    return f" ×{places}" + (f" ({len(members)} findings)" if places != len(members) else "")


def ranked_by(groups: Sequence[FindingGroup]) -> str:
    """"time" when every group has the time it saves (a device was given), else "bytes"."""
    return "time" if groups and all(g.saved_s is not None for g in groups) else "bytes"
