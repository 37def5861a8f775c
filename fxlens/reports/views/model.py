"""Views of the model itself: summary (source, capture, params, FLOPs, coverage), the
module tree and the top ops by FLOPs."""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Training
from fxlens.reports.units import binary_bytes, percent, short_op, si
from fxlens.reports.view import Cell, Column, Detail, Figure, Table, Tone, View, columns
from fxlens.reports.views.headline import headline, inputs_text
from fxlens.reports.views.tree import Node as TreeNode
from fxlens.reports.views.tree import grouped_rows

UNITS_NOTE = "1 MAC = 2 FLOPs · SI prefixes for counts, binary (KiB…) for bytes"


def summary_view(report: Report, detail: Detail) -> View:
    """The answer first: every headline figure and verdict, then where the numbers come from."""
    model = report.model
    rows: list[tuple[str | Cell, ...]] = [
        (f.label, Cell(f.value, Tone.STRONG if f.tone is Tone.PLAIN else f.tone), f.detail)
        for f in (*headline(report), coverage_figure(report))]
    table = Table.of(f"fxlens · {model.name}",
                     (Column("", strong=True), Column("", right=True), Column("")), rows,
                     caption=f"{provenance(report)}\n{UNITS_NOTE}", show_header=False)
    return View("summary", "Summary", (table,))


def provenance(report: Report) -> str:
    """Where the numbers come from, in one line under the figures: the inputs the graph was
    captured on, how, and from what."""
    model = report.model
    capture = "; ".join((model.capture_method, *model.capture_notes))
    return f"inputs {inputs_text(report) or 'none'} · {capture} · source {model.source}"


def coverage_figure(report: Report) -> Figure:
    coverage = report.coverage
    missing = sum(coverage.unsupported.values()) + len(coverage.failed)
    return Figure("coverage", f"{coverage.ratio:.1%}",
                  f"ops: {coverage.costed} costed, {coverage.free} free, {missing} missing",
                  Tone.BAD if missing else Tone.PLAIN)


def modules_view(report: Report, detail: Detail) -> View:
    depth = detail.depth
    total = report.totals.flops
    nodes = [TreeNode(m.path, m.type.rsplit(".", 1)[-1], (m.params, m.flops))
             for m in report.modules]
    rows = [(r.label, r.kind, si(r.figures[0]), si(r.figures[1]), percent(r.figures[1], total))
            for r in grouped_rows(nodes, depth)]
    training = report.get(Training)
    caption = ("" if training is None else
               f"FLOPs of the forward and backward; the optimizer step's "
               f"{si(training.optimizer_flops, 'FLOP')} belong to no module (step total "
               f"{si(training.step_flops, 'FLOP')})")
    table = Table.of(f"modules (depth ≤ {depth}; runs of identical blocks as one row)",
                     columns(("module", "type"), ("params", "FLOPs", "share")), rows,
                     caption=caption)
    return View("modules", "Modules", (table,))


def ops_view(report: Report, detail: Detail) -> View:
    top = detail.top
    total = report.totals.flops
    rows = [(short_op(op.target), str(op.calls), si(op.flops), percent(op.flops, total),
             binary_bytes(op.bytes_moved)) for op in report.by_op() if op.flops][:top]
    table = Table.of(f"top {top} ops by FLOPs",
                     columns(("op",), ("calls", "FLOPs", "share", "bytes moved")), rows)
    return View("top-ops", "Top ops", (table,))
