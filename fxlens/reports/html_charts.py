"""The HTML page's two SVG charts, every string through `html_escape`: the memory timeline
(live bytes per node, bucket maxima past `CHART_POINTS` so peaks survive, the peak marked, a
tooltip on up to `TOOLTIP_POINTS` points, the training phases as bands, and the room a known
device leaves as a dashed line) and the roofline (each op at its arithmetic intensity and
achieved rate, log–log, under the device's roofs)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fxlens.analyzer.core.report import NodeReport, Report
from fxlens.analyzer.core.sections import Memory, Roofline, Training
from fxlens.reports.escape import html_escape as esc
from fxlens.reports.sections import roofline_roof
from fxlens.reports.units import binary_bytes, short_op, si

CHART_POINTS = 1200     # the memory chart keeps at most this many (bucket maxima)
TOOLTIP_POINTS = 240    # of which this many carry a tooltip


def memory_chart(report: Report, width: int = 960, height: int = 220) -> str:
    """Live bytes per node, the peak marked, a tooltip on every plotted point, and the room a
    known device leaves for them (its memory less what stays resident) as a dashed line."""
    memory = report.get(Memory)
    timeline = list(memory.timeline) if memory is not None else []
    if not timeline:
        return ""
    points = _bucket_max(timeline, TOOLTIP_POINTS)
    peak = max(max(timeline), 1)
    room = _device_room(report)
    top = max(peak, room[1]) * 1.05 if room is not None and room[1] <= 1.5 * peak else peak
    peak_index = timeline.index(max(timeline))
    pad_l, pad_b = 70, 24
    plot_w, plot_h = width - pad_l - 10, height - pad_b - 20

    def x(i: float) -> float:
        return pad_l + plot_w * i / max(len(timeline) - 1, 1)

    def y(v: float) -> float:
        return 20 + plot_h * (1 - v / top)

    nodes = report.nodes
    aligned = len(nodes) == len(timeline)
    coords = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in _bucket_max(timeline, CHART_POINTS))
    tips = "".join(
        f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" class="tip"><title>'
        + esc(f"{binary_bytes(v)} live after #{nodes[int(i)].id} "
              f"{short_op(nodes[int(i)].target)} · {nodes[int(i)].module or '(root)'}"
              if aligned else f"{binary_bytes(v)} live after op {int(i)}")
        + "</title></circle>" for i, v in points)
    phases = _phase_bands(report, x, 20, plot_h)
    peak_node = nodes[peak_index] if aligned else None
    label = (f"peak {binary_bytes(peak)} at node {peak_node.id if peak_node else peak_index}"
             + (f" ({peak_node.module or '(root)'})" if peak_node else ""))
    ticks = "".join(f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" class="tick" '
                    f'text-anchor="end">{esc(binary_bytes(v))}</text>'
                    f'<line x1="{pad_l}" x2="{width - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                    'class="grid"/>' for v in (0, top / 4, top / 2, 3 * top / 4, top))
    data_node = f' data-node="{peak_node.id}"' if peak_node else ""
    return (f'<svg id="memory-chart" class="chart" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="live memory per node">{phases}{ticks}'
            f'<polyline points="{coords}" class="line"/>{tips}'
            f'{_room_line(room, top, y, pad_l, width, height - 6)}'
            f'<line x1="{x(peak_index):.1f}" x2="{x(peak_index):.1f}" y1="20" '
            f'y2="{20 + plot_h}" class="peak"/>'
            f'<circle cx="{x(peak_index):.1f}" cy="{y(peak):.1f}" r="4" class="peak"'
            f'{data_node}><title>{esc(label)}</title></circle>'
            f'<text x="{min(x(peak_index) + 6, width - 260):.1f}" y="14" class="peak-label">'
            f"{esc(label)}</text>"
            f'<text x="{pad_l}" y="{height - 6}" class="tick">node order →  '
            f"({len(timeline)} ops; {_live_what(report)})</text>"
            "</svg>")


def _device_room(report: Report) -> tuple[str, int] | None:
    """The device the report knows (the training fit's, else the roofline's) and the bytes it
    leaves for the line: its memory less weights (and states, KV cache) that stay resident."""
    training, roofline = report.get(Training), report.get(Roofline)
    if training is not None and training.fit is not None:
        name, capacity = training.fit.device, training.fit.device_bytes
        resident = training.peak_breakdown.persistent_bytes
    elif roofline is not None and roofline.device.capacity_bytes > 0:
        name, capacity = roofline.device.name, roofline.device.capacity_bytes
        resident = (training.peak_breakdown.persistent_bytes if training is not None else
                    report.model.param_bytes + report.model.buffer_bytes)
    else:
        return None
    return name, capacity - resident


def _room_line(room: tuple[str, int] | None, top: float, y: Any, left: float, width: float,
               bottom: float) -> str:
    if room is None:
        return ""
    name, free = room
    text = f"{name}: {binary_bytes(free)} left for these after what stays resident"
    if free > top:
        return (f'<text x="{width - 12}" y="{bottom}" class="tick capacity" '
                f'text-anchor="end">{esc(text)} (off the chart)</text>')
    return (f'<line x1="{left}" x2="{width - 10}" y1="{y(max(free, 0)):.1f}" '
            f'y2="{y(max(free, 0)):.1f}" class="capacity"><title>{esc(text)}</title></line>'
            f'<text x="{width - 12}" y="{y(max(free, 0)) - 4:.1f}" class="tick capacity" '
            f'text-anchor="end">{esc(text)}</text>')


def _live_what(report: Report) -> str:
    """What the memory timeline counts: activations, and in a training step gradients and the
    optimizer's temporaries too (weights and optimizer state are resident, not in the line)."""
    if report.get(Training) is not None:
        return "live activations and gradients of the step, resident states excluded"
    return "live activations of the graph executor, weights excluded"


def _bucket_max(values: Sequence[int], limit: int) -> list[tuple[float, int]]:
    if len(values) <= limit:
        return list(enumerate(values))
    step = len(values) / limit
    out = []
    for b in range(limit):
        lo, hi = int(b * step), max(int((b + 1) * step), int(b * step) + 1)
        chunk = values[lo:hi]
        best = max(range(len(chunk)), key=chunk.__getitem__)
        out.append((float(lo + best), chunk[best]))
    return out


def _phase_bands(report: Report, x: Any, top: float, plot_h: float) -> str:
    bands, start = [], 0
    nodes = report.nodes
    for i in range(1, len(nodes) + 1):
        if i == len(nodes) or nodes[i].phase != nodes[start].phase:
            bands.append((nodes[start].phase, start, i - 1))
            start = i
    if len(bands) < 2:
        return ""
    return "".join(f'<rect x="{x(a):.1f}" y="{top}" width="{max(x(b) - x(a), 1):.1f}" '
                   f'height="{plot_h}" class="phase phase-{k % 3}"><title>{esc(p)}</title>'
                   f'</rect><text x="{x(a) + 4:.1f}" y="{top + 12}" class="tick">{esc(p)}'
                   "</text>" for k, (p, a, b) in enumerate(bands))


def roofline_chart(report: Report, width: int = 640, height: int = 360) -> str:
    """Each node at (FLOP/byte, FLOP/s). NB: when the section gives no intensity, the
    x position is the node's FLOPs over its bytes moved, a plot coordinate only."""
    roofline = report.get(Roofline)
    if roofline is None:
        return ""
    by_id = {n.id: n for n in report.nodes}
    points = []
    for entry in roofline.nodes:
        node = by_id.get(entry.id)
        if node is None or not node.flops or not entry.time_s:
            continue
        moved = node.bytes_read + node.bytes_written
        intensity = entry.intensity or (node.flops / moved if moved else None)
        if intensity:
            points.append((node, float(intensity), node.flops / entry.time_s))
    if not points:
        return ""
    return _log_scatter(points, roofline_roof(report), width, height)


def _log_scatter(points: list[tuple[NodeReport, float, float]],
                 roof_spec: tuple[float, float, str] | None, width: int, height: int) -> str:
    xs = [p[1] for p in points]
    ys = [p[2] for p in points] + ([roof_spec[0]] if roof_spec else [])
    x0, x1 = math.log10(min(xs)) - 0.3, math.log10(max(xs)) + 0.3
    y0, y1 = math.log10(min(ys)) - 0.3, math.log10(max(ys)) + 0.3
    pad = 72

    def px(v: float) -> float:
        return pad + (width - pad - 10) * (math.log10(v) - x0) / (x1 - x0)

    def py(v: float) -> float:
        return 10 + (height - pad - 10) * (1 - (math.log10(v) - y0) / (y1 - y0))

    roof = ""
    if roof_spec:
        peak, bandwidth, label = roof_spec
        lo, hi = 10 ** x0, 10 ** x1
        ridge = peak / bandwidth
        pts = [(lo, lo * bandwidth), (max(min(ridge, hi), lo), min(ridge, hi) * bandwidth),
               (hi, peak)]
        roof = ('<polyline class="roof" points="'
                + " ".join(f"{px(a):.1f},{py(max(b, 10 ** y0)):.1f}" for a, b in pts) + '"/>'
                f'<text x="{width - 12}" y="{py(peak) - 5:.1f}" class="tick" '
                f'text-anchor="end">{esc(label)} peak {esc(si(peak, "FLOP/s"))}</text>')
    dots = "".join(f'<circle cx="{px(i):.1f}" cy="{py(f):.1f}" r="3" data-node="{n.id}">'
                   f"<title>{esc(_point_title(n))}</title></circle>" for n, i, f in points)
    ticks = "".join(
        f'<line x1="{px(10 ** e):.1f}" x2="{px(10 ** e):.1f}" y1="10" y2="{height - pad}" '
        f'class="grid"/><text x="{px(10 ** e):.1f}" y="{height - pad + 14}" class="tick" '
        f'text-anchor="middle">{esc(_power_of_ten(e))}</text>'
        for e in range(math.ceil(x0), math.floor(x1) + 1))
    ticks += "".join(
        f'<line x1="{pad}" x2="{width - 10}" y1="{py(10 ** e):.1f}" y2="{py(10 ** e):.1f}" '
        f'class="grid"/><text x="{pad - 4}" y="{py(10 ** e) + 4:.1f}" class="tick" '
        f'text-anchor="end">{esc(_power_of_ten(e))}</text>'
        for e in range(math.ceil(y0), math.floor(y1) + 1))
    axes = (f'<text x="{width / 2}" y="{height - 8}" class="tick" text-anchor="middle">'
            "arithmetic intensity (FLOP/byte, log)</text>"
            f'<text x="12" y="{height / 2}" class="tick" transform="rotate(-90 12 '
            f'{height / 2})" text-anchor="middle">FLOP/s (log)</text>')
    return (f'<svg id="roofline-chart" class="chart" viewBox="0 0 {width} {height}">'
            f"{ticks}{roof}<g class=\"dots\">{dots}</g>{axes}</svg>")


def _power_of_ten(exponent: int) -> str:
    """``10 G``, ``100 M``, ``0.1``: a log axis tick, SI like every figure."""
    return si(10.0 ** exponent).replace(".00", "")


def _point_title(node: NodeReport) -> str:
    return f"#{node.id} {short_op(node.target)} · {node.module or '(root)'}"
