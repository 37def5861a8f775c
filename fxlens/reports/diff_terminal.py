"""Terminal tables for a `ReportDiff` and its gate results: pure, rich renderables.

Module names come from user code, so every user string is placed in a `rich.text.Text`
(never parsed as console markup).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.review.diff import TOTAL_METRICS, ModuleStatus, ReportDiff
from fxlens.analyzer.review.gates import GateResult
from fxlens.reports import diff_format as fmt

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
    table = Table(title=Text(f"fxlens diff · {diff.old_name} → {diff.new_name}"),
                  title_justify="left")
    for name in ("metric", "old", "new", "change"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for metric in TOTAL_METRICS:
        delta = diff.totals.get(metric)
        if delta is None or (delta.old is None and delta.new is None):
            continue
        style = "red" if delta.change > 0 else "green" if delta.change < 0 else ""
        table.add_row(fmt.LABELS[metric], fmt.value(metric, delta.old),
                      fmt.value(metric, delta.new),
                      Text(fmt.change_with_relative(metric, delta), style=style))
    table.caption = Text("; ".join(diff.notes)) if diff.notes else None
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
        label = Text(fmt.module_label(module), style=_STATUS_STYLE[module.status])
        if module.status is not ModuleStatus.CHANGED:
            label.append(f" ({module.status.value})", style="dim")
        table.add_row(label, *(fmt.change(m, module.metrics[m]) for m in columns))
    if len(diff.modules) > top:
        table.caption = f"{len(diff.modules) - top} more in the JSON / Markdown / HTML diff"
    return table


def shapes_table(diff: ReportDiff, top: int) -> Table:
    table = Table(title="changed output shapes", title_justify="left")
    for name in ("module", "op", "call", "old", "new"):
        table.add_column(name)
    for change in diff.shapes[:top]:
        table.add_row(Text(change.module or "(root)"), Text(change.op), str(change.index),
                      str([list(s) for s in change.old]), str([list(s) for s in change.new]))
    return table


def findings_table(diff: ReportDiff) -> Table:
    table = Table(title="findings", title_justify="left")
    for name in ("", "code", "modules", "message"):
        table.add_column(name)
    for label, style, findings in (("new", "red", diff.new_findings),
                                   ("resolved", "green", diff.resolved_findings)):
        for finding in findings:
            table.add_row(Text(label, style=style), Text(finding.code),
                          Text(", ".join(finding.modules)), Text(finding.message))
    return table


def gates_table(gates: Sequence[GateResult]) -> Table:
    table = Table(title="gates", title_justify="left", show_header=False)
    table.add_column()
    for result in gates:
        table.add_row(Text(fmt.gate_line(result),
                           style="bold red" if result.tripped else "green"))
    return table
