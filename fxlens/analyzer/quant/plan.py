"""A per-layer precision plan: cheapest format everywhere, sensitive layers climb the ladder.

Every layer starts at the plan's cheapest format (``ladder[0]``), or higher where its own
structural risks say so (`PlanLayer.min_rung`: the first 8-bit rung for a first or last
layer). A layer is raised one rung at a time, greediest first by noise removed per extra
byte, while its predicted SQNR is below `keep_below_db` and the raise fits in the budget (if
one is given). With `fill_budget` (the ``auto`` plan) any layer is raised while the budget
has room: the least error that fits.
The plan's predicted model-output SQNR assumes the layers' errors are independent and add:
``SQNR = −10·log10(Σ 10^(−SQNR_i/10))``. NB: additivity holds for small, uncorrelated errors
(first-order); a 16-bit layer counts as no error.

Memory: quantized layers at their format's bytes (scales included); every other parameter
and buffer as stored. Compression ratio = original bytes ÷ planned bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.sections import QuantPlan


@dataclass(frozen=True)
class PlanLayer:
    name: str
    bytes_by_format: Mapping[str, int]
    sqnr_db_by_format: Mapping[str, float]       # predicted output SQNR; absent: no error
    min_rung: int = 0                            # its risks keep it at least this high


@dataclass(frozen=True)
class Plan:
    name: str
    activations: str
    precision: Mapping[str, str]
    weight_bytes: int
    original_bytes: int
    budget_bytes: int | None
    fits: bool | None
    predicted_output_sqnr_db: float
    basis: str

    @property
    def compression_ratio(self) -> float:
        return self.original_bytes / max(self.weight_bytes, 1)

    def to_section(self) -> QuantPlan:
        return QuantPlan(name=self.name, activations=self.activations,
                         weight_bytes=self.weight_bytes, original_bytes=self.original_bytes,
                         compression_ratio=round(self.compression_ratio, 4),
                         budget_bytes=self.budget_bytes, fits=self.fits,
                         predicted_output_sqnr_db=_finite(self.predicted_output_sqnr_db),
                         basis=self.basis, precision=dict(self.precision))


def _finite(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None


def _noise(layer: PlanLayer, fmt: str) -> float:
    db = layer.sqnr_db_by_format.get(fmt)
    return 0.0 if db is None or math.isinf(db) else 10 ** (-db / 10)


def make_plan(name: str, activations: str, ladder: Sequence[str], layers: Sequence[PlanLayer],
              other_bytes: int, original_bytes: int, budget_bytes: int | None,
              keep_below_db: float, basis: str, fill_budget: bool = False) -> Plan:
    rung = {layer.name: min(layer.min_rung, len(ladder) - 1) for layer in layers}

    def total() -> int:
        return other_bytes + sum(p.bytes_by_format[ladder[rung[p.name]]] for p in layers)

    while True:
        best: tuple[float, PlanLayer] | None = None
        used = total()
        for layer in layers:
            if rung[layer.name] + 1 >= len(ladder):
                continue
            here, up = ladder[rung[layer.name]], ladder[rung[layer.name] + 1]
            extra = layer.bytes_by_format[up] - layer.bytes_by_format[here]
            gain = _noise(layer, here) - _noise(layer, up)
            below = layer.sqnr_db_by_format.get(here, math.inf) < keep_below_db
            room = budget_bytes is None or used + extra <= budget_bytes
            allowed = room and (below or (fill_budget and budget_bytes is not None))
            if gain > 0 and allowed and (best is None or gain / max(extra, 1) > best[0]):
                best = (gain / max(extra, 1), layer)
        if best is None:
            break
        rung[best[1].name] += 1
    precision = {p.name: ladder[rung[p.name]] for p in layers}
    noise = sum(_noise(p, precision[p.name]) for p in layers)
    used = total()
    return Plan(name=name, activations=activations, precision=precision, weight_bytes=used,
                original_bytes=original_bytes, budget_bytes=budget_bytes,
                fits=None if budget_bytes is None else used <= budget_bytes,
                predicted_output_sqnr_db=math.inf if noise == 0 else -10 * math.log10(noise),
                basis=basis)
