"""Markdown for a pull-request comment: a compact summary, the per-module table collapsed.

Layout: a one-line verdict (gates), the totals table, then ``<details>`` blocks with the
per-module table, changed shapes and findings. Every user-derived string (module paths and
types, op names, messages) goes through `fxlens.reports.escape.markdown_escape`, so ``|`` does
not split a cell and markup in a name never renders.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fxlens.analyzer.review.diff import TOTAL_METRICS, ModuleStatus, ReportDiff
from fxlens.analyzer.review.gates import GateResult
from fxlens.reports import diff_format as fmt
from fxlens.reports.escape import markdown_escape as esc


def render_diff_markdown(diff: ReportDiff, gates: Sequence[GateResult] = (),
                         top: int = 50) -> str:
    lines = [f"### fxlens · {esc(diff.old_name)} → {esc(diff.new_name)}", ""]
    lines += _verdict(gates)
    lines += _table(("metric", "old", "new", "change"), _total_rows(diff))
    lines += [f"_{esc(note)}_" for note in diff.notes]
    columns = fmt.module_columns(diff)
    lines += _details(_modules_summary(diff),
                      _table(("module", "status", *(fmt.LABELS[m] for m in columns)),
                             _module_rows(diff, columns, top)))
    if diff.shapes:
        lines += _details(f"{len(diff.shapes)} changed output shapes", _table(
            ("module", "op", "call", "old", "new"),
            ([esc(s.module or "(root)"), esc(s.op), str(s.index), esc([list(x) for x in s.old]),
              esc([list(x) for x in s.new])] for s in diff.shapes[:top])))
    if diff.new_findings or diff.resolved_findings:
        lines += _details(f"findings: {len(diff.new_findings)} new, "
                          f"{len(diff.resolved_findings)} resolved",
                          _table(("", "code", "modules", "message"), _finding_rows(diff)))
    return "\n".join(lines).rstrip() + "\n"


def _verdict(gates: Sequence[GateResult]) -> list[str]:
    if not gates:
        return []
    tripped = [g for g in gates if g.tripped]
    head = (f"**{len(tripped)} gate(s) tripped**" if tripped
            else f"All {len(gates)} gate(s) passed")
    return [head, "", *(f"- {'❌' if g.tripped else '✅'} {esc(fmt.gate_line(g))}"
                        for g in gates), ""]


def _total_rows(diff: ReportDiff) -> Iterable[list[str]]:
    for metric in TOTAL_METRICS:
        delta = diff.totals.get(metric)
        if delta is None or (delta.old is None and delta.new is None):
            continue
        yield [fmt.LABELS[metric], fmt.value(metric, delta.old), fmt.value(metric, delta.new),
               esc(fmt.change_with_relative(metric, delta))]


def _modules_summary(diff: ReportDiff) -> str:
    counts = {s: len(diff.with_status(s)) for s in ModuleStatus}
    return (f"modules: {counts[ModuleStatus.CHANGED]} changed, {counts[ModuleStatus.ADDED]} "
            f"added, {counts[ModuleStatus.REMOVED]} removed, {counts[ModuleStatus.RENAMED]} "
            f"renamed, {diff.unchanged} unchanged")


def _module_rows(diff: ReportDiff, columns: Sequence[str], top: int) -> Iterable[list[str]]:
    for module in diff.modules[:top]:
        yield [esc(fmt.module_label(module)), module.status.value,
               *(esc(fmt.change(m, module.metrics[m])) for m in columns)]
    if len(diff.modules) > top:
        yield [f"… {len(diff.modules) - top} more in the JSON diff", "",
               *("" for _ in columns)]


def _finding_rows(diff: ReportDiff) -> Iterable[list[str]]:
    for label, findings in (("new", diff.new_findings), ("resolved", diff.resolved_findings)):
        for finding in findings:
            yield [label, esc(finding.code), esc(", ".join(finding.modules)),
                   esc(finding.message)]


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _details(summary: str, body: list[str]) -> list[str]:
    return ["<details>", f"<summary>{esc(summary)}</summary>", "", *body, "</details>", ""]
