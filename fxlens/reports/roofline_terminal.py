"""Terminal tables of a report's ``roofline`` section: Report section → rich renderables. Pure.

Times use SI prefixes of seconds (ms, µs); FLOP/s and bandwidth SI (T = 10¹²), as the
datasheets print them. Nothing is computed here beyond shares and formatting.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.core.graph import ancestors
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import ModuleValidation, OpClassValidation, Roofline, Validation
from fxlens.reports.units import binary_bytes, si


def seconds(value: float) -> str:
    """``0.00123`` → ``1.23 ms``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value / 1e-9:.0f} ns" if value else "0"


def roofline_parts(report: Report, depth: int = 2, top: int = 10) -> list[Group]:
    """The roofline tables when the report has the section (``--device``), else none."""
    section = report.get(Roofline)
    return [roofline_tables(section, depth, top)] if section is not None else []


def roofline_tables(section: Roofline, depth: int = 2, top: int = 10) -> Group:
    return Group(roofline_summary(section), module_times(section, depth),
                 hotspot_table(section, top))


def roofline_summary(section: Roofline) -> Table:
    device, totals = section.device, section.totals
    figures = "calibrated profile" if device.calibrated else "datasheet × achievable factor"
    table = Table(title=f"roofline · {device.name} ({figures})", show_header=False,
                  title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column()
    total = totals.time_s
    table.add_row("graph time", seconds(total), section.settings.dtype_rule)
    for label, value in (("compute-bound", totals.compute_bound_s),
                         ("memory-bound", totals.memory_bound_s),
                         ("launch-bound", totals.launch_bound_s),
                         ("all launches", totals.launch_s)):
        share = f"{100 * value / total:.1f}%" if total else "-"
        table.add_row(f"  {label}", seconds(value), share)
    for phase, value in totals.by_phase.items():
        table.add_row(f"  {phase}", seconds(value), "")
    if totals.step_time_s is not None:
        table.add_row("  optimizer step", seconds(totals.optimizer_s or 0.0), "")
        table.add_row(Text("training step", style="bold"),
                      Text(seconds(totals.step_time_s), style="bold"), "")
    _throughput_rows(table, section)
    if totals.uncosted_nodes:
        table.add_row("uncosted nodes", str(totals.uncosted_nodes),
                      Text("unsupported ops: time not estimated", style="bold red"))
    table.caption = (f"{device.source} · efficiency: compute {device.compute_efficiency}"
                     f", bandwidth {device.bandwidth_efficiency}; launch "
                     f"{seconds(device.launch_s)} per kernel")
    return table


def _throughput_rows(table: Table, section: Roofline) -> None:
    rate = section.throughput
    per = "step" if section.totals.step_time_s is not None else "forward"
    table.add_row("samples/s", f"{rate.samples_per_s:.4g}", f"batch {rate.batch} per {per}")
    if rate.tokens_per_s is not None:
        table.add_row("tokens/s", f"{rate.tokens_per_s:.4g}",
                      f"{rate.tokens} tokens per {per}; bound at peak "
                      f"{rate.tokens_per_s_bound or 0.0:.4g}")
    table.add_row("MFU", f"{section.mfu:.1%}", f"of the {section.mfu_dtype} datasheet peak")


def module_times(section: Roofline, depth: int) -> Table:
    table = Table(title=f"predicted time by module (depth ≤ {depth})", title_justify="left")
    for name in ("module", "time", "share"):
        table.add_column(name, justify="left" if name == "module" else "right")
    for module in section.modules:
        level = len(ancestors(module.path)) - 1
        if level > depth:
            continue
        label = module.path.rsplit(".", 1)[-1] if module.path else "(root)"
        table.add_row("  " * level + label, seconds(module.time_s),
                      f"{100 * module.share:.1f}%")
    return table


def hotspot_table(section: Roofline, top: int) -> Table:
    """Top ops by predicted time beside top ops by FLOPs: they often differ."""
    by_time = Table(title=f"top {top} ops by predicted time", title_justify="left")
    by_flops = Table(title=f"top {top} ops by FLOPs", title_justify="left")
    for table, figure in ((by_time, "time"), (by_flops, "FLOPs")):
        for name in ("op", "calls", figure, "share"):
            table.add_column(name, justify="left" if name == "op" else "right",
                             no_wrap=name != "op")
    for row in section.hotspots.by_time[:top]:
        by_time.add_row(_short(row.target), str(row.calls), seconds(row.time_s),
                        f"{100 * row.time_share:.1f}%")
    for row in section.hotspots.by_flops[:top]:
        by_flops.add_row(_short(row.target), str(row.calls), si(row.flops),
                         f"{100 * row.flops_share:.1f}%")
    grid = Table.grid(padding=(0, 2))
    grid.add_row(by_time, by_flops)
    return grid


def _short(target: str) -> str:
    """``aten.layer_norm.default`` → ``layer_norm``; other overloads keep their name."""
    name = target.removeprefix("aten.")
    return name.removesuffix(".default")


# --- analyze validate -------------------------------------------------------------------------

def _error(value: float | None) -> Text:
    if value is None:
        return Text("-")
    style = "green" if abs(value) <= 0.25 else "yellow" if abs(value) <= 1.0 else "red"
    return Text(f"{value:+.0%}", style=style)


def validation_tables(section: Validation, depth: int = 2, top: int = 10) -> Group:
    """Predicted vs measured: total, per op class, per module, and the peak memory."""
    return Group(_validation_summary(section), _compare_table(
        f"per op class (top {top} by measured time)", "op", section.op_classes[:top]),
        _compare_table(f"per module (depth ≤ {depth})", "path",
                       [m for m in section.modules if len(ancestors(m.path)) - 1 <= depth]))


def _validation_summary(section: Validation) -> Table:
    settings, profile, total = section.settings, section.profile, section.total
    figures = "calibrated" if profile.calibrated else "uncalibrated"
    table = Table(title=f"validate · {settings.device} · predicted with {profile.name} "
                        f"({figures})", show_header=False, title_justify="left")
    table.add_column(style="bold")
    for name in ("predicted", "measured", "error"):
        table.add_column(name, justify="right")
    table.add_row("total (sum of nodes)", seconds(total.predicted_s),
                  seconds(total.measured_s), _error(total.error))
    table.add_row("  one interpreted pass", "", seconds(total.pass_s), "")
    table.add_row("  eager forward", "", seconds(total.eager_s), "")
    memory = section.memory
    table.add_row("peak memory", binary_bytes(memory.predicted_peak_bytes),
                  binary_bytes(memory.measured_peak_bytes), _error(memory.error))
    table.caption = (f"{section.timed_nodes} nodes timed; median of {settings.repeat} "
                     f"runs after {settings.warmup} warm-up; error = (predicted − measured) "
                     "/ measured")
    if section.made_up_inputs:
        table.caption += f"; made-up inputs: {', '.join(section.made_up_inputs)}"
    return table


def _compare_table(title: str, key: str,
                   rows: Sequence[OpClassValidation | ModuleValidation]) -> Table:
    table = Table(title=title, title_justify="left")
    for name in (key, "calls", "predicted", "measured", "error"):
        table.add_column(name, justify="left" if name == key else "right")
    for row in rows:
        if isinstance(row, ModuleValidation):
            level = len(ancestors(row.path)) - 1
            label = "  " * level + (row.path.rsplit(".", 1)[-1] if row.path else "(root)")
        else:
            label = row.op
        table.add_row(label, str(row.calls), seconds(row.predicted_s),
                      seconds(row.measured_s), _error(row.error))
    return table
