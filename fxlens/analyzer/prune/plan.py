"""A pruning plan: the least important units across groups that reach a target share of the
parameters or forward FLOPs, and what the pruned graph costs.

Units are ranked across groups by their importance divided by their group's mean, or by their
calibrated damage as measured (each group keeps its most important unit, so no group
vanishes). The plan removes the k least important;
k is the smallest that reaches the target, found by bisection over exact re-costs of the
pruned graph (`fxlens.analyzer.prune.shrink`): cost never grows as units go, and the result is
exact by the rules' count, not a sum of per-unit estimates (which over-count where two groups
meet in one matmul). A target no removal reaches gives the plan that removes every candidate,
marked unmet, so the report says how far it got.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.sections import PruneAlignment
from fxlens.analyzer.prune.groups import Found
from fxlens.analyzer.prune.shrink import Shrunk
from fxlens.analyzer.prune.types import Removal

BASES = ("params", "flops")
_TARGET = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*(params|flops)?\s*$")


@dataclass(frozen=True)
class Target:
    text: str
    share: float            # of the basis to remove, 0…1
    basis: str              # "params" or "flops"


def parse_target(text: str) -> Target:
    """``30%`` (of the parameters), ``30%params`` or ``30%flops``."""
    match = _TARGET.match(text)
    if match is None or not 0 < float(match.group(1)) < 100:
        raise ValueError(f"{text!r}: give a share below 100 %, e.g. 30% (parameters) or "
                         "30%flops")
    return Target(text.strip(), float(match.group(1)) / 100, match.group(2) or "params")


@dataclass(frozen=True)
class Choice:
    removal: Removal
    shrunk: Shrunk
    met: bool
    units: int


def ranked_units(groups: Sequence[Found]) -> list[tuple[int, int]]:
    """(group root, unit) from least to most important across groups, each group's most
    important unit left out; data-free scores divided by their group's mean first (calibrated
    damages are on one scale already)."""
    scored = []
    for group in groups:
        values = group.importance or (1.0,) * group.units
        mean = 1.0 if group.comparable else statistics.fmean(values) or 1.0
        order = sorted(range(group.units), key=lambda u: (values[u], u))
        scored += [(values[u] / mean, group.root, u) for u in order[:-1]]
    return [(root, unit) for _, root, unit in sorted(scored)]


def value(shrunk: Shrunk, target: Target) -> int:
    """What `target` counts of a pruned graph."""
    return shrunk.params if target.basis == "params" else shrunk.report.totals.flops


def choose(groups: Sequence[Found], target: Target, before: int,
           evaluate: Callable[[Removal], Shrunk]) -> Choice:
    """The fewest least-important units whose removal reaches `target` of `before`."""
    units = ranked_units(groups)
    goal = before * (1 - target.share)

    def removal(k: int) -> Removal:
        out: dict[int, set[int]] = {}
        for root, unit in units[:k]:
            out.setdefault(root, set()).add(unit)
        return {root: frozenset(u) for root, u in out.items()}

    most = evaluate(removal(len(units)))
    if value(most, target) > goal:
        return Choice(removal(len(units)), most, False, len(units))
    lo, hi, best = 0, len(units), most
    while lo < hi:
        mid = (lo + hi) // 2
        shrunk = evaluate(removal(mid))
        if value(shrunk, target) <= goal:
            hi, best = mid, shrunk
        else:
            lo = mid + 1
    return Choice(removal(lo), best, True, lo)


def alignment(groups: Sequence[Found], removal: Removal, before: Graph, after: Graph,
              multiples: Sequence[int]) -> tuple[PruneAlignment, ...]:
    """Member dims the removal moves off the largest multiple (of `multiples`) they were on."""
    old = {p.name: p.spec.shape for p in before.params}
    new = {p.name: p.spec.shape for p in after.params}
    out: dict[tuple[str, int], PruneAlignment] = {}
    for group in groups:
        if not removal.get(group.root):
            continue
        for m in group.members:
            if m.param in group.buffers or m.param not in old or (m.param, m.dim) in out:
                continue
            a, b = old[m.param][m.dim], new[m.param][m.dim]
            lost = next((k for k in multiples if a % k == 0 and b % k), None)
            if lost is not None:
                out[(m.param, m.dim)] = PruneAlignment(group.root, m.param, m.dim, a, b, lost)
    return tuple(out.values())
