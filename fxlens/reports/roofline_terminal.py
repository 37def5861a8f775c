"""Terminal tables of a report's ``roofline`` section: Report section → rich renderables. Pure.

Times use SI prefixes of seconds (ms, µs); FLOP/s and bandwidth SI (T = 10¹²), as the
datasheets print them. Nothing is computed here beyond shares and formatting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.core.graph import ancestors
from fxlens.reports.units import binary_bytes, si


def seconds(value: float) -> str:
    """``0.00123`` → ``1.23 ms``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value / 1e-9:.0f} ns" if value else "0"


def roofline_parts(sections: Mapping[str, Any], depth: int = 2, top: int = 10) -> list[Group]:
    """The roofline tables when the report has the section (``--device``), else none."""
    return [roofline_tables(sections["roofline"], depth, top)] if "roofline" in sections else []


def roofline_tables(section: dict[str, Any], depth: int = 2, top: int = 10) -> Group:
    return Group(roofline_summary(section), module_times(section, depth),
                 hotspot_table(section, top))


def roofline_summary(section: dict[str, Any]) -> Table:
    device, totals = section["device"], section["totals"]
    figures = "calibrated profile" if device["calibrated"] else "datasheet × achievable factor"
    table = Table(title=f"roofline · {device['name']} ({figures})", show_header=False,
                  title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column()
    total = totals["time_s"]
    table.add_row("graph time", seconds(total), f"{section['settings']['dtype_rule']}")
    for label, key in (("compute-bound", "compute_bound_s"), ("memory-bound", "memory_bound_s"),
                       ("launch-bound", "launch_bound_s"), ("all launches", "launch_s")):
        share = f"{100 * totals[key] / total:.1f}%" if total else "-"
        table.add_row(f"  {label}", seconds(totals[key]), share)
    for phase, value in totals["by_phase"].items():
        table.add_row(f"  {phase}", seconds(value), "")
    if "step_time_s" in totals:
        table.add_row("  optimizer step", seconds(totals["optimizer_s"]), "")
        table.add_row(Text("training step", style="bold"),
                      Text(seconds(totals["step_time_s"]), style="bold"), "")
    _throughput_rows(table, section)
    if totals["uncosted_nodes"]:
        table.add_row("uncosted nodes", str(totals["uncosted_nodes"]),
                      Text("unsupported ops: time not estimated", style="bold red"))
    table.caption = (f"{device['source']} · efficiency: compute {device['compute_efficiency']}"
                     f", bandwidth {device['bandwidth_efficiency']}; launch "
                     f"{seconds(device['launch_s'])} per kernel")
    return table


def _throughput_rows(table: Table, section: dict[str, Any]) -> None:
    rate = section["throughput"]
    per = "step" if "step_time_s" in section["totals"] else "forward"
    table.add_row("samples/s", f"{rate['samples_per_s']:.4g}", f"batch {rate['batch']} per {per}")
    if "tokens_per_s" in rate:
        table.add_row("tokens/s", f"{rate['tokens_per_s']:.4g}",
                      f"{rate['tokens']} tokens per {per}; bound at peak "
                      f"{rate['tokens_per_s_bound']:.4g}")
    table.add_row("MFU", f"{section['mfu']:.1%}", f"of the {section['mfu_dtype']} datasheet peak")


def module_times(section: dict[str, Any], depth: int) -> Table:
    table = Table(title=f"predicted time by module (depth ≤ {depth})", title_justify="left")
    for name in ("module", "time", "share"):
        table.add_column(name, justify="left" if name == "module" else "right")
    for module in section["modules"]:
        level = len(ancestors(module["path"])) - 1
        if level > depth:
            continue
        label = module["path"].rsplit(".", 1)[-1] if module["path"] else "(root)"
        table.add_row("  " * level + label, seconds(module["time_s"]),
                      f"{100 * module['share']:.1f}%")
    return table


def hotspot_table(section: dict[str, Any], top: int) -> Table:
    """Top ops by predicted time beside top ops by FLOPs: they often differ."""
    by_time = Table(title=f"top {top} ops by predicted time", title_justify="left")
    by_flops = Table(title=f"top {top} ops by FLOPs", title_justify="left")
    for table, figure in ((by_time, "time"), (by_flops, "FLOPs")):
        for name in ("op", "calls", figure, "share"):
            table.add_column(name, justify="left" if name == "op" else "right",
                             no_wrap=name != "op")
    for row in section["hotspots"]["by_time"][:top]:
        by_time.add_row(_short(row["target"]), str(row["calls"]), seconds(row["time_s"]),
                        f"{100 * row['time_share']:.1f}%")
    for row in section["hotspots"]["by_flops"][:top]:
        by_flops.add_row(_short(row["target"]), str(row["calls"]), si(row["flops"]),
                         f"{100 * row['flops_share']:.1f}%")
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


def validation_tables(section: dict[str, Any], depth: int = 2, top: int = 10) -> Group:
    """Predicted vs measured: total, per op class, per module, and the peak memory."""
    return Group(_validation_summary(section), _compare_table(
        f"per op class (top {top} by measured time)", "op", section["op_classes"][:top]),
        _compare_table(f"per module (depth ≤ {depth})", "path",
                       [m for m in section["modules"]
                        if len(ancestors(m["path"])) - 1 <= depth]))


def _validation_summary(section: dict[str, Any]) -> Table:
    settings, profile, total = section["settings"], section["profile"], section["total"]
    figures = "calibrated" if profile["calibrated"] else "uncalibrated"
    table = Table(title=f"validate · {settings['device']} · predicted with {profile['name']} "
                        f"({figures})", show_header=False, title_justify="left")
    table.add_column(style="bold")
    for name in ("predicted", "measured", "error"):
        table.add_column(name, justify="right")
    table.add_row("total (sum of nodes)", seconds(total["predicted_s"]),
                  seconds(total["measured_s"]), _error(total["error"]))
    table.add_row("  one interpreted pass", "", seconds(total["pass_s"]), "")
    table.add_row("  eager forward", "", seconds(total["eager_s"]), "")
    memory = section["memory"]
    table.add_row("peak memory", binary_bytes(memory["predicted_peak_bytes"]),
                  binary_bytes(memory["measured_peak_bytes"]), _error(memory["error"]))
    table.caption = (f"{section['timed_nodes']} nodes timed; median of {settings['repeat']} "
                     f"runs after {settings['warmup']} warm-up; error = (predicted − measured) "
                     "/ measured")
    if section["made_up_inputs"]:
        table.caption += f"; made-up inputs: {', '.join(section['made_up_inputs'])}"
    return table


def _compare_table(title: str, key: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for name in (key, "calls", "predicted", "measured", "error"):
        table.add_column(name, justify="left" if name == key else "right")
    for row in rows:
        label = row[key]
        if key == "path":
            level = len(ancestors(label)) - 1
            label = "  " * level + (label.rsplit(".", 1)[-1] if label else "(root)")
        table.add_row(label, str(row["calls"]), seconds(row["predicted_s"]),
                      seconds(row["measured_s"]), _error(row["error"]))
    return table
