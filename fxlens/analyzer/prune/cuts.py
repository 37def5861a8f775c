"""The plan's cut and its aligned neighbours: which removal the plan takes when the exact one
moves a GEMM width off the boundary the device's fast kernels need.

`aligned_cuts` rounds each group's removal so its kept units are a whole number of aligned
steps (`fxlens.analyzer.prune.savings.aligned_step`): first down (fewer units removed), then
up (more); each group still removes its least important units first. `pick` takes, with a
device, the nearest aligned cut that meets the target and is faster by the roofline than the
exact one; otherwise the exact cut, offering the nearest aligned one beside it. Without a
device nothing is claimed about time, so the exact cut stays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.sections import PruneCut
from fxlens.analyzer.prune.groups import Found
from fxlens.analyzer.prune.shrink import Shrunk
from fxlens.analyzer.prune.types import Removal

EXACT = "exact"


@dataclass(frozen=True)
class Cut:
    how: str
    removal: Removal
    shrunk: Shrunk
    met: bool
    forward_s: float | None
    misaligned: int

    @property
    def units(self) -> int:
        return sum(len(u) for u in self.removal.values())

    def to_section(self) -> PruneCut:
        return PruneCut(self.how, self.units, self.shrunk.params,
                        self.shrunk.report.totals.flops, self.met, self.misaligned,
                        self.forward_s)


def group_order(group: Found) -> list[int]:
    """The group's units, least important first (as `ranked_units` orders them)."""
    values = group.importance or (1.0,) * group.units
    return sorted(range(group.units), key=lambda u: (values[u], u))


def aligned_cuts(groups: Sequence[Found], removal: Removal, steps: Mapping[int, int]
                 ) -> list[tuple[str, Removal]]:
    """The removal rounded to aligned steps, down then up; those that differ from it."""
    out: list[tuple[str, Removal]] = []
    for how, up in (("aligned, rounded down", False), ("aligned, rounded up", True)):
        rounded: dict[int, frozenset[int]] = {}
        for group in groups:
            gone, step = len(removal.get(group.root, ())), steps.get(group.root, 1)
            if not gone:
                continue
            kept = group.units - gone
            if step > 1 and kept % step:
                kept = max(step, kept // step * step) if up else -(-kept // step) * step
            if kept < group.units:
                rounded[group.root] = frozenset(group_order(group)[:group.units - kept])
        if rounded != dict(removal) and (how, rounded) not in out:
            out.append((how, rounded))
    return out


def pick(exact: Cut, aligned: Sequence[Cut]) -> tuple[Cut, Cut | None]:
    """(the cut taken, the one offered beside it) — see the module docstring."""
    met = [c for c in aligned if c.met]
    if exact.met and exact.forward_s is not None:
        faster = [c for c in met if c.forward_s is not None and c.forward_s < exact.forward_s]
        if faster:
            return faster[0], exact
    offered = (met or list(aligned))[:1]
    return exact, offered[0] if offered else None


def measured(how: str, removal: Removal, evaluate: Callable[[Removal], Shrunk],
             met: Callable[[Shrunk], bool], forward_s: Callable[[Shrunk], float | None],
             misaligned: Callable[[Shrunk], int], shrunk: Shrunk | None = None) -> Cut:
    shrunk = shrunk if shrunk is not None else evaluate(removal)
    return Cut(how, removal, shrunk, met(shrunk), forward_s(shrunk), misaligned(shrunk))
