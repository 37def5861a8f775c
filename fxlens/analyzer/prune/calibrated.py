"""Calibrated importance: the damage of removing each unit, measured by forwarding the
calibration batches through the model with that unit removed for real.

For every unit of every group (`groups.Found`), the module is pruned in place by that one unit
(`module.removed`: the same slicing as the saved module, attributes fixed, restored after), the
calibration batches are forwarded, and its outputs are compared with the unpruned model's by
the metric ``--quant-calibrate`` uses (`fxlens.analyzer.quant.calibrated`, chosen by its
``auto`` rule from one forward):

- ``kl``: the logit leaves' ``KL(softmax(z) ‖ softmax(ẑ))`` in nats, averaged over rows with
  the top 1 % capped (`quant.calibrated.softmax_damage`, its tail-capped mean);
- ``sqnr``: every floating output's relative error power ``Σ(y − ŷ)² / Σy²``, i.e.
  ``10^(−SQNR/10)`` (`quant.weights.sqnr_db`).

Both are damages in the same units across groups, so, unlike the data-free scores (which only
order units inside one group and are compared across groups after dividing by their group's
mean), the measured damages rank every unit of the model on one scale: `Found.comparable`.

Cost: one forward over the batches per unit. Above `MEASURE_UNITS` units in all, each group
measures a share of its units proportional to its size (at least 2, its data-free least and
most important among them) spread evenly over its data-free order, and the other units get
the damage interpolated linearly along that order between their measured neighbours
(`Damages.measured` says how many were measured). NB: one unit removed alone; a plan removes
many at once, whose damage is not the sum (it is measured once more for the plan's total:
`removal_damage`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from fxlens.analyzer.capture.chain import plain_outputs
from fxlens.analyzer.prune.groups import Found
from fxlens.analyzer.prune.module import removed
from fxlens.analyzer.prune.types import PruneKnowledge, Removal
from fxlens.analyzer.quant.calibrated import softmax_damage
from fxlens.analyzer.quant.weights import sqnr_db

MEASURE_UNITS = 256     # forwards over the calibration batches before units are interpolated

Inputs = tuple[Any, ...] | dict[str, Any]
METRIC_UNITS = {"kl": "KL of the outputs, nats", "sqnr": "relative output error power"}


@dataclass(frozen=True)
class CalibrationData:
    """The batches, where they came from, and the metric (quant's ``auto`` rule)."""

    batches: Sequence[Inputs]
    source: str                         # "calibration()" or "example inputs"
    metric: str                         # "kl" or "sqnr"
    logit_leaves: frozenset[int] = frozenset()   # output leaves read as logits (kl)


@dataclass(frozen=True)
class Damages:
    """Per group root, the damage of removing each unit alone (`metric`'s units)."""

    metric: str
    per_unit: Mapping[int, tuple[float, ...]]
    measured: int
    total: int


Outputs = list[list[torch.Tensor]]       # the floating output leaves, per batch


def forward(module: nn.Module, data: CalibrationData) -> Outputs:
    out = []
    with torch.no_grad():
        for batch in data.batches:
            value = module(**batch) if isinstance(batch, dict) else module(*batch)
            out.append([t.detach() for t in pytree.tree_leaves(plain_outputs(value))
                        if isinstance(t, torch.Tensor) and t.is_floating_point()])
    return out


def damage(reference: Outputs, outputs: Outputs, data: CalibrationData) -> float:
    """How far `outputs` moved from `reference`, by `data.metric` (module docstring)."""
    if data.metric == "kl":
        ref, got = _logits(reference, data.logit_leaves), _logits(outputs, data.logit_leaves)
        return softmax_damage(ref, got)[1]
    signal = torch.cat([t.flatten().double() for leaves in reference for t in leaves])
    noisy = torch.cat([t.flatten().double() for leaves in outputs for t in leaves])
    db = sqnr_db(signal, noisy)
    return 0.0 if math.isinf(db) else 10 ** (-db / 10)


def _logits(runs: Outputs, leaves: frozenset[int]) -> list[torch.Tensor]:
    return [t.float().reshape(-1, t.shape[-1]) for run in runs
            for i, t in enumerate(run) if i in leaves]


def unit_damages(module: nn.Module, groups: Sequence[Found], data: CalibrationData,
                 knowledge: PruneKnowledge, on_step: Callable[[str], None] = lambda _: None,
                 budget: int = MEASURE_UNITS) -> Damages:
    """Every unit's damage, measured or interpolated (module docstring)."""
    was_training = module.training
    module.eval()
    try:
        reference = forward(module, data)
        chosen = _chosen(groups, budget)
        count, done = sum(len(units) for units in chosen.values()), 0
        per_unit = {}
        for group in groups:
            measured = {}
            for unit in chosen[group.root]:
                done += 1
                on_step(f"calibrated importance {done}/{count}: removing one unit alone")
                with removed(module, groups, {group.root: frozenset({unit})}, knowledge):
                    measured[unit] = damage(reference, forward(module, data), data)
            per_unit[group.root] = _interpolated(_order(group), measured)
    finally:
        module.train(was_training)
    return Damages(data.metric, per_unit, count, sum(g.units for g in groups))


def removal_damage(module: nn.Module, groups: Sequence[Found], removal: Removal,
                   data: CalibrationData, knowledge: PruneKnowledge) -> float:
    """The damage of `removal` as a whole on the calibration batches."""
    was_training = module.training
    module.eval()
    try:
        reference = forward(module, data)
        with removed(module, groups, removal, knowledge):
            return damage(reference, forward(module, data), data)
    finally:
        module.train(was_training)


def _order(group: Found) -> list[int]:
    """The group's units by data-free importance, least first."""
    values = group.importance or (0.0,) * group.units
    return sorted(range(group.units), key=lambda u: (values[u], u))


def _chosen(groups: Sequence[Found], budget: int) -> dict[int, list[int]]:
    """The units to measure per group: all within `budget`, else a share spread evenly over
    each group's data-free order (its ends included)."""
    total = sum(g.units for g in groups)
    out = {}
    for group in groups:
        order = _order(group)
        k = group.units if total <= budget else min(group.units, max(
            2, round(budget * group.units / total)))
        ranks = sorted({round(i * (group.units - 1) / max(k - 1, 1)) for i in range(k)})
        out[group.root] = [order[r] for r in ranks]
    return out


def _interpolated(order: Sequence[int], measured: Mapping[int, float]) -> tuple[float, ...]:
    """Per unit: its measured damage, else the linear interpolation along `order` (ranks)
    between the nearest measured units on either side."""
    known = [(rank, measured[u]) for rank, u in enumerate(order) if u in measured]
    values = [0.0] * len(order)
    for rank, unit in enumerate(order):
        if unit in measured:
            values[unit] = measured[unit]
            continue
        below = max((k for k in known if k[0] < rank), default=known[0])
        above = min((k for k in known if k[0] > rank), default=known[-1])
        span = above[0] - below[0]
        share = (rank - below[0]) / span if span else 0.0
        values[unit] = below[1] + share * (above[1] - below[1])
    return tuple(values)
