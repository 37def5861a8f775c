"""Spaces of prunable units: a union-find whose links carry a ratio, and that can cut a space
into consecutive parts.

A space is a run of units that are removed together wherever they appear. Two axes that must
lose the same units (a residual add, a linear layer's input and the previous layer's output)
are *unified*: their spaces become one. A space can be coarser than another: a head of ``d``
channels, or a KV group of ``n_rep`` query heads; a finer space then hangs under the coarser
root with ``ratio`` of its units per root unit, so removing one root unit removes ``ratio``
units of it. A slice or a concat that cuts a space in the middle *refines* it: the root gets
consecutive parts, each a space of its own (a fused QKV projection's rows become Q, K and V).

A pinned space can never lose a unit; its reason says why. A conflict (axes that would need
units cut inside a unit, or widths that do not divide) pins the spaces involved, never guesses.

A layout may repeat one space (a grouped convolution's channels: the same space once per
convolution group), so one unit can cover a strided set of an axis's entries; joins are made
on the roots as they stand after the joins before them.

Known limitations: within one atom a unit maps to a contiguous run of entries (heads, KV
groups); a stride inside a unit (channels interleaved by a reshape) is pinned.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from fxlens.analyzer.prune.types import Atom, Layout, entries


class Spaces:
    """Every space of one graph; see the module docstring."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.ratio: list[int] = []       # own units per parent unit
        self.size: list[int] = []        # in own units
        self.parts: dict[int, list[int]] = {}
        self.pinned: dict[int, str] = {}

    def new(self, size: int, pinned: str | None = None) -> int:
        space = len(self.parent)
        self.parent.append(space)
        self.ratio.append(1)
        self.size.append(size)
        if pinned is not None:
            self.pinned[space] = pinned
        return space

    def fresh(self, size: int, pinned: str | None = None) -> Layout:
        return (Atom(self.new(size, pinned), 0, size, 1),) if size else ()

    def find(self, space: int) -> tuple[int, int]:
        """The root of `space` and how many of `space`'s units make one root unit."""
        path = []
        while self.parent[space] != space:
            path.append(space)
            space = self.parent[space]
        root, ratio = space, 1
        for node in reversed(path):           # compress: each points at the root directly
            ratio *= self.ratio[node]
            self.parent[node], self.ratio[node] = root, ratio
        return root, (self.ratio[path[0]] if path else 1)

    def reason(self, space: int) -> str | None:
        return self.pinned.get(self.find(space)[0])

    def resolve(self, layout: Layout) -> Layout:
        """`layout` on roots that have no parts, in root units."""
        out: list[Atom] = []
        todo = deque(layout)
        while todo:
            atom = todo.popleft()
            root, ratio = self.find(atom.space)
            if atom.start % ratio or atom.count % ratio:
                self.pinned.setdefault(root, "cut inside one unit")
                out.append(Atom(root, atom.start // ratio, -(-atom.count // ratio),
                                atom.width * ratio))
                continue
            atom = Atom(root, atom.start // ratio, atom.count // ratio, atom.width * ratio)
            if root not in self.parts:
                out.append(atom)
                continue
            todo.extendleft(reversed(self._over_parts(atom)))
        return tuple(out)

    def _over_parts(self, atom: Atom) -> list[Atom]:
        pieces, offset = [], 0
        for part in self.parts[atom.space]:
            lo, hi = max(atom.start, offset), min(atom.start + atom.count, offset + self.size[part])
            if lo < hi:
                pieces.append(Atom(part, lo - offset, hi - lo, atom.width))
            offset += self.size[part]
        return pieces

    def pin(self, layout: Layout, reason: str) -> None:
        for atom in self.resolve(layout):
            self.pinned.setdefault(atom.space, reason)

    def refine(self, layout: Layout, cuts: Sequence[int]) -> None:
        """Cut the spaces under `layout` so that every entry offset in `cuts` falls between
        two whole spaces."""
        offset = 0
        for atom in self.resolve(layout):
            inside = [c - offset for c in cuts if offset < c < offset + atom.entries]
            if inside:
                self._split(atom, inside)
            offset += atom.entries

    def _split(self, atom: Atom, inside: Sequence[int]) -> None:
        if any(c % atom.width for c in inside):
            self.pinned.setdefault(atom.space, "cut inside one unit")
            return
        cuts = {atom.start + c // atom.width for c in inside} | {atom.start,
                                                                 atom.start + atom.count}
        units = sorted(cuts - {0, self.size[atom.space]})
        bounds = [0, *units, self.size[atom.space]]
        reason = self.pinned.get(atom.space)
        self.parts[atom.space] = [self.new(hi - lo, reason)
                                  for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo]

    def unify(self, a: Layout, b: Layout) -> None:
        """Make two equally long axes lose the same units."""
        if entries(a) != entries(b):
            self.pin(a + b, "axes of different lengths meet")
            return
        for _ in range(8):                        # cuts found on one side cut the other
            ra, rb = self.resolve(a), self.resolve(b)
            cuts = sorted(set(_bounds(ra)) | set(_bounds(rb)))
            self.refine(a, cuts)
            self.refine(b, cuts)
            ra, rb = self.resolve(a), self.resolve(b)
            if _bounds(ra) == _bounds(rb):
                break
        else:
            self.pin(a + b, "axes that cannot be aligned")
            return
        for x, y in zip(ra, rb, strict=True):
            # an earlier join may have hung either side under another root (a layout that
            # repeats one space, as a grouped convolution's): join the current roots
            now_x, now_y = self.resolve((x,)), self.resolve((y,))
            if len(now_x) == len(now_y) == 1:
                self._join(now_x[0], now_y[0])
            else:
                self.pin(now_x + now_y, "axes that cannot be aligned")

    def _join(self, x: Atom, y: Atom) -> None:
        whole = (x.start == 0 and x.count == self.size[x.space]
                 and y.start == 0 and y.count == self.size[y.space])
        if not whole:                             # a unit cut by a conflict pinned before
            self.pinned.setdefault(x.space, "cut inside one unit")
            self.pinned.setdefault(y.space, "cut inside one unit")
        if x.space == y.space:
            if x.width != y.width:
                self.pinned.setdefault(x.space, "one space read at two granularities")
            return
        coarse, fine = (x, y) if x.width >= y.width else (y, x)
        if coarse.width % fine.width:
            self.pin((x, y), "unit widths that do not divide")
            return
        reason = self.pinned.get(coarse.space) or self.pinned.get(fine.space)
        self.parent[fine.space] = coarse.space
        self.ratio[fine.space] = coarse.width // fine.width
        if reason is not None:
            self.pinned[coarse.space] = reason


def _bounds(layout: Layout) -> list[int]:
    out, offset = [], 0
    for atom in layout:
        offset += atom.entries
        out.append(offset)
    return out


def cut(layout: Layout, start: int, end: int, spaces: Spaces) -> Layout:
    """Entries ``[start, end)`` of an axis (a slice): spaces refined at both ends."""
    spaces.refine(layout, [start, end])
    out, offset = [], 0
    for atom in spaces.resolve(layout):
        if start <= offset and offset + atom.entries <= end:
            out.append(atom)
        offset += atom.entries
    return tuple(out)


def widen(layout: Layout, factor: int) -> Layout:
    """Each entry repeated `factor` times, contiguously (a merge with an inner axis)."""
    return tuple(Atom(a.space, a.start, a.count, a.width * factor) for a in layout)


def coarsen(layout: Layout, factor: int, spaces: Spaces) -> Layout | None:
    """The outer axis of a split by `factor`: each unit becomes `factor` entries coarser; a
    space whose unit is finer than `factor` entries hangs under a new, coarser root. None when
    a run is not a whole number of `factor` entries."""
    out = []
    for atom in spaces.resolve(layout):
        if atom.width % factor == 0:
            out.append(Atom(atom.space, atom.start, atom.count, atom.width // factor))
            continue
        per = factor // atom.width if factor % atom.width == 0 else 0
        size = spaces.size[atom.space]
        if not per or atom.start % per or atom.count % per or size % per:
            return None
        root = spaces.new(size // per, spaces.pinned.get(atom.space))
        spaces.parent[atom.space], spaces.ratio[atom.space] = root, per
        out.append(Atom(root, atom.start // per, atom.count // per, 1))
    return tuple(out)
