"""A self-contained HTML diff page: inline CSS, no script, no CDN, works offline.

Every user-derived string (model and module names, types, op names, messages) is written
through `fxlens.reports.escape.html_escape`, the one HTML escaping function; this module never
builds markup from unescaped report text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fxlens.analyzer.review.diff import TOTAL_METRICS, ReportDiff
from fxlens.analyzer.review.gates import GateResult
from fxlens.reports import diff_format as fmt
from fxlens.reports.escape import html_escape as esc

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}
th{background:#f3f3f3}
.up{color:#b00020}.down{color:#1b7a1b}
.added{background:#eaffea}.removed{background:#ffecec}.renamed{background:#fff8e0}
.tripped{color:#b00020;font-weight:bold}.ok{color:#1b7a1b}
"""


def render_diff_html(diff: ReportDiff, gates: Sequence[GateResult] = ()) -> str:
    title = esc(f"fxlens diff · {diff.old_name} → {diff.new_name}")
    body = [f"<h1>{title}</h1>", *_gates(gates), "<h2>totals</h2>", _totals(diff)]
    body += [f"<p><em>{esc(note)}</em></p>" for note in diff.notes]
    body += [f"<h2>modules ({len(diff.modules)} differ, {diff.unchanged} unchanged)</h2>",
             _modules(diff)]
    if diff.shapes:
        body += ["<h2>changed output shapes</h2>", _table(
            ("module", "op", "call", "old", "new"),
            ((s.module or "(root)", s.op, str(s.index), str([list(x) for x in s.old]),
              str([list(x) for x in s.new])) for s in diff.shapes))]
    if diff.new_findings or diff.resolved_findings:
        body += ["<h2>findings</h2>", _table(
            ("", "code", "modules", "message"),
            ((label, f.code, ", ".join(f.modules), f.message)
             for label, found in (("new", diff.new_findings),
                                  ("resolved", diff.resolved_findings)) for f in found))]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _gates(gates: Sequence[GateResult]) -> list[str]:
    if not gates:
        return []
    items = "".join(f'<li class="{"tripped" if g.tripped else "ok"}">{esc(fmt.gate_line(g))}'
                    "</li>" for g in gates)
    return ["<h2>gates</h2>", f"<ul>{items}</ul>"]


def _totals(diff: ReportDiff) -> str:
    rows = []
    for metric in TOTAL_METRICS:
        delta = diff.totals.get(metric)
        if delta is None or (delta.old is None and delta.new is None):
            continue
        css = "up" if delta.change > 0 else "down" if delta.change < 0 else ""
        rows.append(f"<tr><td>{esc(fmt.LABELS[metric])}</td>"
                    f"<td>{esc(fmt.value(metric, delta.old))}</td>"
                    f"<td>{esc(fmt.value(metric, delta.new))}</td>"
                    f'<td class="{css}">{esc(fmt.change_with_relative(metric, delta))}</td></tr>')
    return _wrap(("metric", "old", "new", "change"), rows)


def _modules(diff: ReportDiff) -> str:
    rows = []
    columns = fmt.module_columns(diff)
    for module in diff.modules:
        cells = "".join(f"<td>{esc(fmt.change(m, module.metrics[m]))}</td>"
                        for m in columns)
        rows.append(f'<tr class="{module.status.value}"><td>{esc(fmt.module_label(module))}'
                    f"</td><td>{esc(module.type)}</td><td>{module.status.value}</td>{cells}</tr>")
    header = ("module", "type", "status", *(fmt.LABELS[m] for m in columns))
    return _wrap(header, rows)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    return _wrap(header, ("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
                          for row in rows))


def _wrap(header: Sequence[str], rows: Iterable[str]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    return f"<table><thead><tr>{head}</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
