"""Chart axes shared by every chart drawn as SVG (a sweep's lines, a section's `Chart`):
1-2-5 ticks in one unit, the unit chosen from a ladder (GiB, ms, TFLOP) by the axis's range.

Positions only, no markup: each chart module draws its own SVG and escapes its own labels.
"""

from __future__ import annotations

import math

Ladder = tuple[tuple[float, str], ...]   # (scale, unit), largest first: one unit per axis
FLOP_UNITS: Ladder = ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"),
                      (1e6, "MFLOP"), (1e3, "kFLOP"), (1.0, "FLOP"))
BYTE_UNITS: Ladder = ((2.0**50, "PiB"), (2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"),
                      (2.0**10, "KiB"), (1.0, "B"))
RATE_UNITS: Ladder = ((1e6, "M tok/s"), (1e3, "k tok/s"), (1.0, "tok/s"))
SECOND_UNITS: Ladder = ((86400.0, "d"), (3600.0, "h"), (1.0, "s"), (1e-3, "ms"), (1e-6, "µs"),
                        (1e-9, "ns"))


def nice_ticks(top: float, intervals: int = 5, bottom: float = 0.0) -> list[float]:
    """`bottom`'s multiple of step at or below it, then each step to the first multiple ≥
    `top`; step 1, 2 or 5 × 10^k, the smallest that needs at most `intervals` intervals."""
    if not math.isfinite(top) or not math.isfinite(bottom) or top <= bottom:
        return [bottom, bottom + 1.0] if math.isfinite(bottom) and bottom > 0 else [0.0, 1.0]
    raw = (top - bottom) / intervals
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    first = math.floor(bottom / step * (1 + 1e-9)) if bottom > 0 else 0
    last = math.ceil(top / step * (1 - 1e-9))
    return [round(i * step, 12) for i in range(first, last + 1)]


def axis_ticks(top: float, units: Ladder, bottom: float = 0.0) -> list[tuple[float, str]]:
    """Nice ticks covering [`bottom`, `top`] in the one unit of `units` that `top` reads best
    in: (value in base units, label)."""
    scale, unit = next(((s, u) for s, u in units if top >= s), units[-1])
    return [(t * scale, f"{t:g} {unit}") for t in nice_ticks(top / scale, bottom=bottom / scale)]
