"""The graph's colours: which metric they show, the linear scale, and its legend.

A drawn item (an op, a run of blocks, the folded plumbing) is worth the metric summed over the
ops it stands for (for live memory, their maximum). The scale is linear from 0 to the largest
worth among the items drawn, cut into `len(PALETTE)` equal bins (ColorBrewer YlOrRd, light to
dark); an item worth exactly 0 is grey (`ZERO_COLOR`). So the colour says what share of the
largest item an item is: a 1 kFLOP ``arange`` is in the lightest bin beside a 34 GFLOP linear
in the darkest. `Legend` lists the bins with their ranges in the metric's units; the DOT
(`fxlens.reports.dot`) and the HTML page (`fxlens.reports.html`) each render that one legend.

Why not logarithmic (the scale before issue 36): between the smallest non-zero and the largest
value it gave a rotary table's ``cos`` a warm colour; a reader takes a colour for a share.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.report import Report
from fxlens.reports.sections import node_memory, node_times
from fxlens.reports.units import binary_bytes, seconds, si

COLORS = ("flops", "bytes", "time", "memory")
PALETTE = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c",
           "#bd0026", "#800026")
ZERO_COLOR = "#eeeeee"
WHITE_TEXT_FROM = 6          # bins this dark or darker get white text
TITLES = {"flops": "FLOPs per node", "bytes": "bytes moved per node (read + written)",
          "time": "estimated time per node (roofline)", "memory": "live memory after each op"}


def metric_values(report: Report, color: str) -> dict[int, float]:
    """Per-node value of the colouring metric, read from the report. Raises ReportError for
    an unknown metric or one the report does not hold."""
    if color == "flops":
        return {n.id: n.flops for n in report.nodes}
    if color == "bytes":
        return {n.id: n.bytes_read + n.bytes_written for n in report.nodes}
    if color == "time":
        times = node_times(report)
        if times is None:
            raise ReportError("--color time needs a roofline section in the report "
                              "(estimate times for a device first)")
        return {n.id: times.get(n.id, 0.0) for n in report.nodes}
    if color == "memory":
        live = node_memory(report)
        if live is None:
            raise ReportError("--color memory needs the memory section's timeline")
        return {n.id: float(v) for n, v in ((n, live[n.id]) for n in report.nodes)}
    raise ReportError(f"unknown colour metric {color!r}; choose one of {', '.join(COLORS)}")


def format_value(value: float, color: str) -> str:
    """A value of the metric in its unit: FLOP (SI), bytes (binary), seconds."""
    if color == "flops":
        return si(value, "FLOP")
    if color == "time":
        return seconds(value)
    return binary_bytes(value)


def format_metric(value: float, color: str) -> str:
    """A value as a node's label shows it (live memory says so)."""
    text = format_value(value, color)
    return f"{text} live" if color == "memory" else text


@dataclass(frozen=True)
class Scale:
    """Linear bins from 0 to `top` (the largest value drawn)."""

    top: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Scale:
        return cls(max((v for v in values if v > 0), default=0.0))

    def level(self, value: float) -> int | None:
        """The bin of `value`: None for zero (grey), else 0 … len(PALETTE)-1."""
        if value <= 0 or self.top <= 0:
            return None
        return min(len(PALETTE) - 1, int(value / self.top * len(PALETTE)))

    def fill(self, value: float) -> str:
        level = self.level(value)
        return ZERO_COLOR if level is None else PALETTE[level]

    def font(self, value: float) -> str:
        level = self.level(value)
        return "#ffffff" if level is not None and level >= WHITE_TEXT_FROM else "#000000"

    def bounds(self) -> list[tuple[float, float]]:
        """(low, high) of every bin, in the metric's base unit."""
        step = self.top / len(PALETTE)
        return [(k * step, (k + 1) * step) for k in range(len(PALETTE))] if self.top else []


@dataclass(frozen=True)
class LegendBin:
    color: str
    low: float
    high: float
    text: str          # the range in the metric's units: "1.51 – 3.01 TFLOP"


@dataclass(frozen=True)
class Legend:
    title: str                      # "FLOPs per node, linear"
    note: str                       # how a node standing for many ops is worth
    bins: tuple[LegendBin, ...]     # grey for zero first, then light to dark


def legend(scale: Scale, color: str) -> Legend:
    """The scale's bins, each with its range in the metric's units."""
    zero = LegendBin(ZERO_COLOR, 0.0, 0.0, "0")
    bins = [LegendBin(c, low, high, range_text(low, high, color))
            for c, (low, high) in zip(PALETTE, scale.bounds(), strict=False)]
    how = "the largest" if color == "memory" else "the sum"
    return Legend(f"{TITLES[color]}, linear", f"a run of blocks or a fold: {how} over its ops",
                  (zero, *bins))


def range_text(low: float, high: float, color: str) -> str:
    """``1.51 – 3.01 TFLOP``; the unit written once where both ends share it."""
    a, b = format_value(low, color), format_value(high, color)
    number_a, _, unit_a = a.partition(" ")
    if low == 0 or unit_a == b.partition(" ")[2]:
        return f"{'0' if low == 0 else number_a} – {b}"
    return f"{a} – {b}"
