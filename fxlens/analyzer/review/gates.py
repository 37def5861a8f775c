"""Merge gates on a `ReportDiff`: ``--fail-on "flops:+2%,peak_memory:+5%,params:+0"``.

A gate is ``METRIC:THRESHOLD`` over one of `fxlens.analyzer.review.diff.TOTAL_METRICS`:

- ``+N%`` trips when the metric grew by more than N % of the old value (from an old value of 0,
  any growth trips);
- ``+N`` trips when it grew by more than N in base units (FLOPs, parameters, bytes, seconds);
  N may carry a suffix: k, M, G, T (10³…), KiB, MiB, GiB, TiB (2¹⁰…), or ms, us for time.

``+0`` therefore allows no growth at all; a negative threshold (``-5%``) demands a decrease.
A gate over a metric that either report lacks (``step_peak`` without a training section,
``time`` without a roofline section) is an error, not a pass; so is a figure that is not a
finite number (NaN compares false, so it would pass every gate), an empty spec (``""``, which
would gate nothing) and a threshold no float can hold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.review.diff import TOTAL_METRICS, Delta, ReportDiff

_SUFFIXES = {
    "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40, "B": 1.0,
    "s": 1.0, "ms": 1e-3, "us": 1e-6,
}
_GATE = re.compile(r"^\s*(?P<metric>[a-z_]+)\s*:\s*(?P<sign>[+-]?)(?P<number>\d+(?:\.\d+)?)"
                   r"\s*(?P<unit>%|[A-Za-z]*)\s*$")


@dataclass(frozen=True)
class Gate:
    metric: str
    threshold: float            # percent when `relative`, else base units
    relative: bool
    text: str                   # as the user wrote it

    def trips(self, delta: Delta) -> bool:
        if not self.relative:
            return delta.change > self.threshold
        if not delta.old:
            return delta.change > 0 if self.threshold >= 0 else delta.change >= 0
        return 100 * delta.change / abs(delta.old) > self.threshold


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    delta: Delta
    tripped: bool

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate.text, "metric": self.gate.metric,
                "threshold": self.gate.threshold, "relative": self.gate.relative,
                "old": self.delta.old, "new": self.delta.new, "change": self.delta.change,
                "tripped": self.tripped}


def parse_gates(spec: str) -> tuple[Gate, ...]:
    """``"flops:+2%,params:+0"`` → gates; a malformed item is a `ReportError` naming it."""
    gates = []
    for item in (part for part in spec.split(",") if part.strip()):
        gates.append(parse_gate(item))
    if not gates:
        raise ReportError(f"--fail-on {spec!r}: no gate given; e.g. \"flops:+2%,params:+0\"")
    return tuple(gates)


def parse_gate(item: str) -> Gate:
    match = _GATE.match(item)
    if match is None:
        raise ReportError(f"--fail-on: cannot read {item.strip()!r}; expected METRIC:+N% or "
                          f"METRIC:+N, e.g. flops:+2% or params:+0")
    metric, unit = match["metric"], match["unit"]
    if metric not in TOTAL_METRICS:
        raise ReportError(f"--fail-on: unknown metric {metric!r}; known: "
                          f"{', '.join(TOTAL_METRICS)}")
    if unit != "%" and unit not in _SUFFIXES:
        raise ReportError(f"--fail-on: unknown unit {unit!r} in {item.strip()!r}; known: %, "
                          f"{', '.join(u for u in _SUFFIXES if u)}")
    value = float(match["number"]) * (-1 if match["sign"] == "-" else 1)
    if not math.isfinite(value * _SUFFIXES.get(unit, 1.0)) or len(match["number"]) > 30:
        raise ReportError(f"--fail-on: the threshold of {match['metric']} is out of range")
    if unit == "%":
        return Gate(metric, value, relative=True, text=item.strip())
    return Gate(metric, value * _SUFFIXES[unit], relative=False, text=item.strip())


def check_gates(diff: ReportDiff, gates: Iterable[Gate]) -> tuple[GateResult, ...]:
    """Evaluate every gate; a metric missing from either report is a `ReportError`."""
    results = []
    for gate in gates:
        delta = diff.totals.get(gate.metric, Delta(None, None))
        if not delta.present:
            side = "baseline (old)" if delta.old is None else "new"
            raise ReportError(f"--fail-on {gate.text}: the {side} report has no "
                              f"{gate.metric} figure; {_hint(gate.metric)}")
        if not all(_finite(x) for x in (delta.old, delta.new)):
            raise ReportError(f"--fail-on {gate.text}: the {gate.metric} figure is not a "
                              f"finite number (old {delta.old}, new {delta.new}); a gate "
                              f"never passes on a figure it cannot compare")
        results.append(GateResult(gate, delta, gate.trips(delta)))
    return tuple(results)


def _finite(value: float | None) -> bool:
    try:
        return value is not None and math.isfinite(value)
    except OverflowError:   # an int too large for a float
        return False


def _hint(metric: str) -> str:
    return {
        "peak_memory": "it comes from the memory section (written since fxlens 0.1)",
        "step_peak": "it comes from the training section (analyze with --train)",
        "time": "it comes from a roofline estimate (analyze with --device)",
    }.get(metric, "regenerate the report with this fxlens version")
