"""Formatting shared by the diff renderers: metric labels, values and signed changes.

Counts (FLOPs, MACs, parameters) use SI prefixes, bytes binary ones, time seconds with SI
sub-units; a figure a report lacks shows as ``n/a``. Pure text; escaping is the caller's.
"""

from __future__ import annotations

from fxlens.analyzer.review.diff import Delta, ModuleDelta, ModuleStatus, ReportDiff
from fxlens.analyzer.review.gates import GateResult
from fxlens.reports.units import binary_bytes, seconds, si

LABELS = {
    "flops": "FLOPs", "macs": "MACs", "params": "params", "param_bytes": "param bytes",
    "bytes_read": "bytes read", "bytes_written": "bytes written",
    "peak_memory": "activation peak", "step_peak": "training step peak",
    "activation_bytes": "activations", "live_at_peak_bytes": "live at peak",
    "time": "est. time",
}
#: Per-module columns the tables show (all metrics stay in the JSON).
MODULE_COLUMNS = ("flops", "params", "bytes_read", "bytes_written", "activation_bytes", "time")


def value(metric: str, number: float | None) -> str:
    if number is None:
        return "n/a"
    if metric == "time":
        return seconds(number)
    if "bytes" in metric or metric in ("peak_memory", "step_peak"):
        return binary_bytes(number)
    return si(number)


def change(metric: str, delta: Delta) -> str:
    """``+1.20 MiB`` / ``-3.00 k`` / ``0``."""
    if delta.old is None and delta.new is None:
        return "n/a"
    if not delta.change:
        return "0"
    sign = "+" if delta.change > 0 else "-"
    return sign + value(metric, abs(delta.change))


def relative(delta: Delta) -> str:
    if not delta.present or not delta.change:
        return ""
    ratio = delta.relative
    return "new" if ratio is None else f"{100 * ratio:+.1f}%"


def change_with_relative(metric: str, delta: Delta) -> str:
    rel = relative(delta)
    return change(metric, delta) + (f" ({rel})" if rel else "")


def module_label(module: ModuleDelta) -> str:
    """The module's path, with its old path for a rename; raw text."""
    if module.status is ModuleStatus.RENAMED:
        return f"{module.old_path} → {module.path}"
    return module.path


def gate_line(result: GateResult) -> str:
    """``flops:+2% TRIPPED: 1.00 G → 1.05 G (+50.00 M, +5.0%)``."""
    gate, delta = result.gate, result.delta
    verdict = "TRIPPED" if result.tripped else "ok"
    rel = relative(delta)
    return (f"{gate.text} {verdict}: {value(gate.metric, delta.old)} → "
            f"{value(gate.metric, delta.new)} ({change(gate.metric, delta)}"
            f"{', ' + rel if rel else ''})")


def module_columns(diff: ReportDiff) -> tuple[str, ...]:
    """`MODULE_COLUMNS` less those no module has on either side (no memory or roofline)."""
    return tuple(m for m in MODULE_COLUMNS
                 if m in ("flops", "params") or any(
                     d.metrics[m].old is not None or d.metrics[m].new is not None
                     for d in diff.modules if m in d.metrics))
