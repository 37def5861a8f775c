"""Terminal tables: Report → rich renderables. Pure: the CLI decides where they are printed.

FLOPs and parameter counts use SI prefixes (G = 10⁹), bytes binary ones (GiB = 2³⁰); the
summary says so.
"""

from __future__ import annotations

from collections import defaultdict

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.report import ModuleReport, Report
from fxlens.reports.units import binary_bytes, percent, si


def render_terminal(report: Report, depth: int = 2, top: int = 10) -> RenderableType:
    return Group(summary(report), module_tree(report, depth), top_ops(report, top))


def summary(report: Report) -> Table:
    model, totals = report.model, report.totals
    table = Table(title=f"fxlens · {model.name}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("source", model.source)
    table.add_row("capture", model.capture_method)
    for note in model.capture_notes:
        table.add_row("", Text(note, style="dim"))
    table.add_row("parameters", f"{si(model.params)} ({binary_bytes(model.param_bytes)})"
                  + (f", buffers {binary_bytes(model.buffer_bytes)}" if model.buffers else ""))
    table.add_row("forward FLOPs", f"{si(totals.flops, 'FLOP')}  ({si(totals.macs, 'MAC')})")
    table.add_row("bytes moved", f"read {binary_bytes(totals.bytes_read)}, "
                  f"written {binary_bytes(totals.bytes_written)}")
    table.add_row("coverage", _coverage_text(report))
    table.caption = "1 MAC = 2 FLOPs · SI prefixes for counts, binary (KiB…) for bytes"
    return table


def _coverage_text(report: Report) -> Text:
    coverage = report.coverage
    text = Text(f"{coverage.ratio:.1%} of ops: {coverage.costed} costed, {coverage.free} free")
    if coverage.unsupported:
        listed = ", ".join(f"{op} ×{n}" for op, n in coverage.unsupported.items())
        text.append(f"; unsupported: {listed}", style="bold red")
    if coverage.failed:
        text.append(f"; rule failures: {', '.join(coverage.failed)}", style="bold red")
    return text


def module_tree(report: Report, depth: int) -> Table:
    total = report.totals.flops
    table = Table(title=f"modules (depth ≤ {depth})", title_justify="left")
    for name, justify in (("module", "left"), ("type", "left"), ("params", "right"),
                          ("FLOPs", "right"), ("share", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for module in _tree_order(report.modules, depth):
        label = module.path.rsplit(".", 1)[-1] if module.path else "(root)"
        table.add_row("  " * module.depth + label, module.type.rsplit(".", 1)[-1],
                      si(module.params), si(module.flops), percent(module.flops, total))
    return table


def _tree_order(modules: tuple[ModuleReport, ...], depth: int) -> list[ModuleReport]:
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


def top_ops(report: Report, top: int) -> Table:
    by_op: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for node in report.nodes:
        entry = by_op[node.target]
        entry[0] += 1
        entry[1] += node.flops
        entry[2] += node.bytes_read + node.bytes_written
    total = report.totals.flops
    table = Table(title=f"top {top} ops by FLOPs", title_justify="left")
    for name, justify in (("op", "left"), ("calls", "right"), ("FLOPs", "right"),
                          ("share", "right"), ("bytes moved", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    ranked = sorted(by_op.items(), key=lambda kv: (-kv[1][1], -kv[1][2], kv[0]))[:top]
    for op, (calls, flops, moved) in ranked:
        table.add_row(op, str(calls), si(flops), percent(flops, total), binary_bytes(moved))
    return table
