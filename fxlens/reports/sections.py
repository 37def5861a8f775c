"""Per-node and per-module figures the graph and page views draw from typed sections.

Each function returns what one view needs from one section (`fxlens.analyzer.core.sections`),
or None / {} when the report lacks that section, so a view leaves its part out. Nothing here
computes a metric: it only re-keys numbers the analysis wrote.
"""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Memory, Roofline


def node_times(report: Report) -> dict[int, float] | None:
    """Estimated seconds per node id from the roofline section, or None without one."""
    roofline = report.get(Roofline)
    return roofline.node_times() if roofline is not None else None


def module_times(report: Report) -> dict[str, float]:
    """Estimated seconds per module path (submodules included), {} without a roofline."""
    roofline = report.get(Roofline)
    return roofline.module_times() if roofline is not None else {}


def roofline_roof(report: Report) -> tuple[float, float, str] | None:
    """(peak FLOP/s, bandwidth bytes/s, dtype label) of the roof to draw, or None."""
    roofline = report.get(Roofline)
    if roofline is None:
        return None
    peaks = roofline.device.peak_flops
    key = roofline.mfu_dtype if roofline.mfu_dtype in peaks else max(
        peaks, key=lambda k: peaks[k], default="")
    peak, bandwidth = peaks.get(key, 0.0), roofline.device.bandwidth_bytes_per_s
    return (float(peak), float(bandwidth), key) if peak > 0 and bandwidth > 0 else None


def node_memory(report: Report) -> dict[int, int] | None:
    """Live bytes right after each node (the memory timeline), keyed by node id."""
    memory = report.get(Memory)
    if memory is None or len(memory.timeline) != len(report.nodes):
        return None
    return {node.id: live for node, live in zip(report.nodes, memory.timeline, strict=True)}
