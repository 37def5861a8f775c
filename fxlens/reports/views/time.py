"""Views of the time sections: the roofline estimate and predicted-vs-measured validation.

Times use SI sub-units of seconds (ms, µs); FLOP/s and bandwidth SI, as datasheets print them.
"""

from __future__ import annotations

from collections.abc import Sequence

from fxlens.analyzer.core.graph import ancestors
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    ModuleValidation,
    OpClassValidation,
    Roofline,
    Validation,
)
from fxlens.reports.units import binary_bytes, seconds, short_op, si
from fxlens.reports.view import Block, Cell, Column, Detail, SideBySide, Table, Tone, View
from fxlens.reports.views.tree import Node as TreeNode
from fxlens.reports.views.tree import grouped_rows


def roofline_view(report: Report, detail: Detail) -> View | None:
    section = report.get(Roofline)
    if section is None:
        return None
    blocks: list[Block] = [roofline_summary(section)]
    if detail.full:
        blocks.append(module_times(section, detail.depth))
    blocks.append(hotspots(section, detail.top))
    return View("roofline", "Roofline", tuple(blocks))


def roofline_summary(section: Roofline) -> Table:
    device, totals = section.device, section.totals
    figures = "calibrated profile" if device.calibrated else "datasheet × achievable factor"
    total = totals.time_s
    rows: list[tuple[str | Cell, ...]] = [
        ("graph time", seconds(total), section.settings.dtype_rule)]
    bounds = (("compute-bound", totals.compute_bound_s),
              ("memory-bound", totals.memory_bound_s),
              *((("latency-bound", totals.latency_bound_s),) if totals.latency_bound_s else ()),
              ("launch-bound", totals.launch_bound_s), ("all launches", totals.launch_s))
    for label, value in bounds:
        rows.append((f"  {label}", seconds(value), f"{100 * value / total:.1f}%" if total
                     else "-"))
    rows += [(f"  {phase}", seconds(value), "") for phase, value in totals.by_phase.items()]
    if totals.step_time_s is not None:
        rows.append(("  optimizer step", seconds(totals.optimizer_s or 0.0), ""))
        rows.append((Cell("training step", Tone.STRONG),
                     Cell(seconds(totals.step_time_s), Tone.STRONG), ""))
    rate = section.throughput
    per = "step" if totals.step_time_s is not None else "forward"
    rows.append(("samples/s", si(rate.samples_per_s), f"batch {rate.batch} per {per}"))
    if rate.tokens_per_s is not None:
        rows.append(("tokens/s", si(rate.tokens_per_s),
                     f"{rate.tokens} tokens per {per}; at most "
                     f"{si(rate.tokens_per_s_bound or 0.0)} at the {section.mfu_dtype} peak"))
    peak = "calibrated" if device.calibrated else "datasheet"
    rows.append(("MFU", f"{section.mfu:.1%}", f"of the {peak} {section.mfu_dtype} peak"))
    if totals.uncosted_nodes:
        rows.append(("uncosted nodes", str(totals.uncosted_nodes),
                     Cell("unsupported ops: time not estimated", Tone.BAD)))
    kernels = "".join(f", {name} {share:.2g}" for name, share in
                      sorted(device.kernel_efficiency.items()))
    caption = (f"{device.source} · efficiency: compute {device.compute_efficiency}{kernels}, "
               f"bandwidth {device.bandwidth_efficiency}; launch {seconds(device.launch_s)} "
               "per kernel"
               + (f" · memory {binary_bytes(device.capacity_bytes)} usable of "
                  f"{binary_bytes(device.memory_bytes)} (the driver's reserve and the CUDA "
                  f"context out)" if device.capacity_bytes < device.memory_bytes else ""))
    return Table.of(f"roofline · {device.name} ({figures})",
                    (Column("", strong=True), Column("", right=True), Column("")), rows,
                    caption=caption, show_header=False)


def module_times(section: Roofline, depth: int) -> Table:
    total = next((m.time_s for m in section.modules if m.path == ""), 0.0)
    nodes = [TreeNode(m.path, "", (m.time_s,)) for m in section.modules]
    rows = [(r.label, seconds(r.figures[0]),
             f"{100 * r.figures[0] / total:.1f}%" if total else "-")
            for r in grouped_rows(nodes, depth)]
    return Table.of(f"predicted time by module (depth ≤ {depth})",
                    (Column("module"), Column("time", right=True), Column("share", right=True)),
                    rows)


def hotspots(section: Roofline, top: int) -> SideBySide:
    """Top ops by predicted time beside top ops by FLOPs: they often differ."""

    def heads(figure: str) -> tuple[Column, ...]:
        return (Column("op"), *(Column(n, right=True, no_wrap=True)
                                for n in ("calls", figure, "share")))

    by_time = [(short_op(r.target), str(r.calls), seconds(r.time_s),
                f"{100 * r.time_share:.1f}%") for r in section.hotspots.by_time[:top]]
    by_flops = [(short_op(r.target), str(r.calls), si(r.flops), f"{100 * r.flops_share:.1f}%")
                for r in section.hotspots.by_flops[:top]]
    return SideBySide((Table.of(f"top {top} ops by predicted time", heads("time"), by_time),
                       Table.of(f"top {top} ops by FLOPs", heads("FLOPs"), by_flops)))


def validation_view(report: Report, detail: Detail) -> View | None:
    depth, top = detail.depth, detail.top
    section = report.get(Validation)
    if section is None:
        return None
    modules = [m for m in section.modules if len(ancestors(m.path)) - 1 <= depth]
    return View("validation", "Validation", (
        validation_summary(section),
        compare_table(f"per op class (top {top} by measured time)", "op",
                      section.op_classes[:top]),
        compare_table(f"per module (depth ≤ {depth})", "path", modules)))


def error_cell(value: float | None) -> Cell:
    if value is None:
        return Cell("-")
    tone = Tone.GOOD if abs(value) <= 0.25 else Tone.WARN if abs(value) <= 1.0 else Tone.BAD
    return Cell(f"{value:+.0%}", tone)


def validation_summary(section: Validation) -> Table:
    settings, profile, total = section.settings, section.profile, section.total
    figures = "calibrated" if profile.calibrated else "uncalibrated"
    memory = section.memory
    rows: list[tuple[str | Cell, ...]] = [
        ("total (sum of nodes)", seconds(total.predicted_s), seconds(total.measured_s),
         error_cell(total.error)),
        ("  one interpreted pass", "", seconds(total.pass_s), ""),
        ("  eager forward", "", seconds(total.eager_s), ""),
        ("peak memory", binary_bytes(memory.predicted_peak_bytes),
         binary_bytes(memory.measured_peak_bytes), error_cell(memory.error))]
    caption = (f"{section.timed_nodes} nodes timed; median of {settings.repeat} runs after "
               f"{settings.warmup} warm-up; error = (predicted − measured) / measured")
    if section.made_up_inputs:
        caption += f"; made-up inputs: {', '.join(section.made_up_inputs)}"
    return Table.of(f"validate · {settings.device} · predicted with {profile.name} ({figures})",
                    (Column("figure", strong=True), *(Column(n, right=True) for n in
                                                      ("predicted", "measured", "error"))),
                    rows, caption=caption)


def compare_table(title: str, key: str,
                  rows: Sequence[OpClassValidation | ModuleValidation]) -> Table:
    out = []
    for row in rows:
        if isinstance(row, ModuleValidation):
            level = len(ancestors(row.path)) - 1
            label = "  " * level + (row.path.rsplit(".", 1)[-1] if row.path else "(root)")
        else:
            label = row.op
        out.append((label, str(row.calls), seconds(row.predicted_s), seconds(row.measured_s),
                    error_cell(row.error)))
    return Table.of(title, (Column(key), *(Column(n, right=True) for n in
                                           ("calls", "predicted", "measured", "error"))), out)
