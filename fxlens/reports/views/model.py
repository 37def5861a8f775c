"""Views of the model itself: summary (source, capture, params, FLOPs, coverage), the
module tree and the top ops by FLOPs."""

from __future__ import annotations

from collections import defaultdict

from fxlens.analyzer.core.report import ModuleReport, Report
from fxlens.reports.units import binary_bytes, percent, si
from fxlens.reports.view import Cell, Column, Table, Tone, View, columns

UNITS_NOTE = "1 MAC = 2 FLOPs · SI prefixes for counts, binary (KiB…) for bytes"


def summary_view(report: Report, depth: int, top: int) -> View:
    model, totals = report.model, report.totals
    rows: list[tuple[str | Cell, str | Cell]] = [("source", model.source),
                                                 ("capture", model.capture_method)]
    rows += [("", Cell(note, Tone.MUTED)) for note in model.capture_notes]
    rows += [
        ("parameters", f"{si(model.params)} ({binary_bytes(model.param_bytes)})"
         + (f", buffers {binary_bytes(model.buffer_bytes)}" if model.buffers else "")),
        ("forward FLOPs", f"{si(totals.flops, 'FLOP')}  ({si(totals.macs, 'MAC')})"),
        ("bytes moved", f"read {binary_bytes(totals.bytes_read)}, "
                        f"written {binary_bytes(totals.bytes_written)}"),
        ("coverage", coverage_cell(report)),
    ]
    table = Table.of(f"fxlens · {model.name}", (Column("", strong=True), Column("")), rows,
                     caption=UNITS_NOTE, show_header=False)
    return View("summary", "Summary", (table,))


def coverage_cell(report: Report) -> Cell:
    coverage = report.coverage
    tail: list[tuple[str, Tone]] = []
    if coverage.unsupported:
        listed = ", ".join(f"{op} ×{n}" for op, n in coverage.unsupported.items())
        tail.append((f"; unsupported: {listed}", Tone.BAD))
    if coverage.failed:
        tail.append((f"; rule failures: {', '.join(coverage.failed)}", Tone.BAD))
    return Cell(f"{coverage.ratio:.1%} of ops: {coverage.costed} costed, {coverage.free} free",
                tail=tuple(tail))


def modules_view(report: Report, depth: int, top: int) -> View:
    total = report.totals.flops
    rows = [("  " * m.depth + (m.path.rsplit(".", 1)[-1] if m.path else "(root)"),
             m.type.rsplit(".", 1)[-1], si(m.params), si(m.flops), percent(m.flops, total))
            for m in tree_order(report.modules, depth)]
    table = Table.of(f"modules (depth ≤ {depth})",
                     columns(("module", "type"), ("params", "FLOPs", "share")), rows)
    return View("modules", "Modules", (table,))


def tree_order(modules: tuple[ModuleReport, ...], depth: int) -> list[ModuleReport]:
    """Depth-first, children in execution order, without recursion."""
    children: dict[str, list[ModuleReport]] = defaultdict(list)
    root = None
    for module in modules:
        if module.path == "":
            root = module
        elif module.depth <= depth:
            children[module.path.rpartition(".")[0]].append(module)
    ordered: list[ModuleReport] = []
    stack = [root] if root else []
    while stack:
        module = stack.pop()
        ordered.append(module)
        stack.extend(reversed(children.get(module.path, [])))
    return ordered


def ops_view(report: Report, depth: int, top: int) -> View:
    total = report.totals.flops
    rows = [(op.target, str(op.calls), si(op.flops), percent(op.flops, total),
             binary_bytes(op.bytes_moved)) for op in report.by_op()[:top]]
    table = Table.of(f"top {top} ops by FLOPs",
                     columns(("op",), ("calls", "FLOPs", "share", "bytes moved")), rows)
    return View("top-ops", "Top ops", (table,))
