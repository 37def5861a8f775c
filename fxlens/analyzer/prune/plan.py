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

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.graph import Graph, dtype_bytes
from fxlens.analyzer.core.sections import PruneAlignment
from fxlens.analyzer.prune.blocks import exclusive
from fxlens.analyzer.prune.groups import Found
from fxlens.analyzer.prune.shrink import Shrunk
from fxlens.analyzer.prune.types import Removal

BASES = ("params", "flops")
_TARGET = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*(params|flops)?\s*(blocks|units)?\s*$")


@dataclass(frozen=True)
class Target:
    text: str
    share: float            # of the basis to remove, 0…1
    basis: str              # "params" or "flops"
    only: str = ""          # "blocks": whole blocks only; "units": no whole block; "": both


def parse_target(text: str) -> Target:
    """``30%`` (of the parameters), ``30%params`` or ``30%flops``, optionally followed by
    ``blocks`` (remove whole blocks only) or ``units`` (channels, heads and neurons only)."""
    match = _TARGET.match(text)
    if match is None or not 0 < float(match.group(1)) < 100:
        raise ValueError(f"{text!r}: give a share below 100 %, e.g. 30% (parameters), "
                         "30%flops, or 30%flops blocks (whole blocks only)")
    return Target(text.strip(), float(match.group(1)) / 100, match.group(2) or "params",
                  match.group(3) or "")


def candidates(groups: Sequence[Found], target: Target) -> list[Found]:
    """The groups `target` lets the plan remove from."""
    if not target.only:
        return list(groups)
    return [g for g in groups if bool(g.block) == (target.only == "blocks")]


@dataclass(frozen=True)
class Choice:
    removal: Removal
    shrunk: Shrunk
    met: bool
    units: int


def ranked_units(groups: Sequence[Found], saving: Mapping[int, float] | None = None
                 ) -> list[tuple[int, int]]:
    """(group root, unit) from least to most important across groups, each group's most
    important unit left out. Data-free scores are divided by their group's mean. Calibrated
    damages are on one scale already, and where `saving` gives what one unit of each group
    saves of the target's basis (params or FLOPs), each is divided by it: the damage per
    parameter (or FLOP) removed, the greedy order for reaching a share at least damage (a
    KV group or a whole block saves many times what a neuron does); a unit that saves none
    comes last.

    Whole blocks (one unit each) are ranked within their run as a group's units are: divided
    by the run's mean, the most important left out where every block of the run could go (so
    a run never vanishes). Data-free, every block comes after every finer unit: a block's
    weight norm against its run's says which block matters least, not that removing one costs
    less than a unit (bench/prune_ranking.py: the char LM's data-free plan at 20 % took a block
    and lost 0.20–0.21 of accuracy where units lost 0.03–0.05). Ties (a model without real
    weights scores every unit 1) go to the unit furthest from its group's end, so each group
    loses the same share rather than the first group all but one unit; blocks of a run that
    tie go deepest first, its last block last (removing a decoder's deeper layers, its final
    one aside, costs least: Gromov et al. 2024, "The Unreasonable Ineffectiveness of the
    Deeper Layers"; Men et al. 2024, ShortGPT)."""
    def per_saved(group: Found, score: float) -> float:
        if not group.comparable or saving is None or group.root not in saving:
            return score
        saved = saving[group.root]
        return score / saved if saved > 0 else math.inf

    scored: list[tuple[int, float, float, int, int, int]] = []
    runs: dict[str, list[Found]] = {}
    for group in groups:
        if group.block:
            runs.setdefault(group.run, []).append(group)
            continue
        values = group.importance or (1.0,) * group.units
        mean = 1.0 if group.comparable else statistics.fmean(values) or 1.0
        order = sorted(range(group.units), key=lambda u: (values[u], u))
        scored += [(0, per_saved(group, values[u] / mean), i / group.units, 0, group.root, u)
                   for i, u in enumerate(order[:-1])]
    for run in runs.values():
        score = {g.root: (g.importance or (1.0,))[0] for g in run}
        mean = 1.0 if run[0].comparable else statistics.fmean(score.values()) or 1.0
        blocks = sorted(run, key=lambda g: (score[g.root], *_depth_first(g)))
        kept = blocks[:-1] if len(run) >= run[0].siblings else blocks
        tier = 0 if run[0].comparable else 1
        scored += [(tier, per_saved(g, score[g.root] / mean), i / len(run), 1, g.root, 0)
                   for i, g in enumerate(kept)]
    return [(root, unit) for *_, root, unit in sorted(scored)]    # ties: finer units first


def _depth_first(block: Found) -> tuple[int, int]:
    """A tied block's order: the deepest first, the run's last block after every other."""
    index = int(block.block.rpartition(".")[2]) - int(block.run.rpartition(".")[2])
    return (1, 0) if index == block.siblings - 1 else (0, -index)


def value(shrunk: Shrunk, target: Target) -> int:
    """What `target` counts of a pruned graph."""
    return shrunk.params if target.basis == "params" else shrunk.report.totals.flops


def choose(groups: Sequence[Found], target: Target, before: int,
           evaluate: Callable[[Removal], Shrunk], saving: Mapping[int, float] | None = None
           ) -> Choice:
    """The fewest least-important units whose removal reaches `target` of `before`
    (`saving`: what one unit of each group saves, as `ranked_units` takes it)."""
    units = ranked_units(groups, saving)
    goal = before * (1 - target.share)

    def removal(k: int) -> Removal:
        out: dict[int, set[int]] = {}
        for root, unit in units[:k]:
            out.setdefault(root, set()).add(unit)
        return exclusive(groups, {root: frozenset(u) for root, u in out.items()})

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
              multiples: Sequence[int], aligned_bytes: int = 16) -> tuple[PruneAlignment, ...]:
    """Member dims the removal moves off the largest multiple (of `multiples`) they were on;
    `penalised` where a 16- or 8-bit dim leaves the `aligned_bytes` row the matmul rules rate
    as misaligned (the only boundary the device model prices: `savings.aligned_step`)."""
    old = {p.name: p.spec for p in before.params}
    new = {p.name: p.spec.shape for p in after.params}
    out: dict[tuple[str, int], PruneAlignment] = {}
    for group in groups:
        if not removal.get(group.root) or group.block:
            continue
        for m in group.members:
            if (m.param in group.buffers or m.param not in old or m.param not in new
                    or (m.param, m.dim) in out):
                continue
            a, b = old[m.param].shape[m.dim], new[m.param][m.dim]
            lost = next((k for k in multiples if a % k == 0 and b % k), None)
            if lost is not None:
                size = dtype_bytes(old[m.param].dtype)
                row = int(aligned_bytes // size) if size <= 2 else 0
                out[(m.param, m.dim)] = PruneAlignment(
                    group.root, m.param, m.dim, a, b, lost,
                    penalised=bool(row) and a % row == 0 and b % row != 0)
    return tuple(sorted(out.values(), key=lambda x: not x.penalised))
