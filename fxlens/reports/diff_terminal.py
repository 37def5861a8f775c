"""Terminal tables for a `ReportDiff` and its gate results: pure, rich renderables.

Module names come from user code and reports from anyone, so every string is placed in a
`rich.text.Text` through `fxlens.reports.terminal.plain` (never parsed as console markup,
control characters made visible), titles and captions included.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table

from fxlens.analyzer.review.diff import TOTAL_METRICS, ModuleStatus, ReportDiff
from fxlens.analyzer.review.gates import GateResult
from fxlens.reports import diff_format as fmt
from fxlens.reports.terminal import plain

_STATUS_STYLE = {ModuleStatus.ADDED: "green", ModuleStatus.REMOVED: "red",
                 ModuleStatus.RENAMED: "yellow", ModuleStatus.CHANGED: ""}


def render_diff_terminal(diff: ReportDiff, gates: Sequence[GateResult] = (),
                         top: int = 20) -> RenderableType:
    parts: list[RenderableType] = [totals_table(diff), modules_table(diff, top)]
    if diff.shapes:
        parts.append(shapes_table(diff, top))
    if diff.new_findings or diff.resolved_findings:
        parts.append(findings_table(diff))
    if gates:
        parts.append(gates_table(gates))
    return Group(*parts)


def totals_table(diff: ReportDiff) -> Table:
    table = Table(title=plain(f"fxlens diff · {diff.old_name} → {diff.new_name}"),
                  title_justify="left")
    for name in ("metric", "old", "new", "change"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for metric in TOTAL_METRICS:
        delta = diff.totals.get(metric)
        if delta is None or (delta.old is None and delta.new is None):
            continue
        style = "red" if delta.change > 0 else "green" if delta.change < 0 else ""
        table.add_row(plain(fmt.LABELS[metric]), plain(fmt.value(metric, delta.old)),
                      plain(fmt.value(metric, delta.new)),
                      plain(fmt.change_with_relative(metric, delta), style))
    table.caption = plain("; ".join(diff.notes)) if diff.notes else None
    return table


def modules_table(diff: ReportDiff, top: int) -> Table:
    counts = {s: len(diff.with_status(s)) for s in ModuleStatus}
    table = Table(title=f"modules by impact: {counts[ModuleStatus.CHANGED]} changed, "
                        f"{counts[ModuleStatus.ADDED]} added, {counts[ModuleStatus.REMOVED]} "
                        f"removed, {counts[ModuleStatus.RENAMED]} renamed, "
                        f"{diff.unchanged} unchanged", title_justify="left")
    columns = fmt.module_columns(diff)
    table.add_column("module (status)", min_width=14, overflow="fold")
    for metric in columns:
        table.add_column(fmt.LABELS[metric], justify="right")
    for module in diff.modules[:top]:
        label = plain(fmt.module_label(module), style=_STATUS_STYLE[module.status])
        if module.status is not ModuleStatus.CHANGED:
            label.append(f" ({module.status.value})", style="dim")
        table.add_row(label, *(plain(fmt.change(m, module.metrics[m])) for m in columns))
    if len(diff.modules) > top:
        table.caption = plain(f"{len(diff.modules) - top} more in the JSON / Markdown / HTML "
                              "diff")
    return table


def shapes_table(diff: ReportDiff, top: int) -> Table:
    table = Table(title="changed output shapes", title_justify="left")
    for name in ("module", "op", "call", "old", "new"):
        table.add_column(name)
    for change in diff.shapes[:top]:
        table.add_row(plain(change.module or "(root)"), plain(change.op), plain(change.index),
                      plain([list(s) for s in change.old]), plain([list(s) for s in change.new]))
    return table


def findings_table(diff: ReportDiff) -> Table:
    table = Table(title="findings", title_justify="left")
    for name in ("", "code", "modules", "message"):
        table.add_column(name)
    for label, style, findings in (("new", "red", diff.new_findings),
                                   ("resolved", "green", diff.resolved_findings)):
        for finding in findings:
            table.add_row(plain(label, style), plain(finding.code),
                          plain(", ".join(finding.modules)), plain(finding.message))
    return table


def gates_table(gates: Sequence[GateResult]) -> Table:
    table = Table(title="gates", title_justify="left", show_header=False)
    table.add_column()
    for result in gates:
        table.add_row(plain(fmt.gate_line(result),
                            "bold red" if result.tripped else "green"))
    return table
