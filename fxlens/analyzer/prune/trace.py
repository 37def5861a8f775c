"""Follow every tensor axis of a captured graph through its ops: which prunable spaces each
axis carries (`fxlens.analyzer.prune.spaces`), by the rules' axis rules.

The walk is one pass in graph order. Parameters and buffers start with a fresh space per
axis; model inputs, model outputs and anything an op without an axis rule touches are pinned
(never pruned), so an op the rules do not know can only make the analysis more careful, never
wrong. `Traced.axes` keeps every output's layouts, which `fxlens.analyzer.prune.shrink` reads
to re-shape the whole graph for a plan.

Reshapes (`_Call.reshape`) match old and new dims by products: a merge keeps the outer axis's
units, each widened by the inner size (the inner axis is pinned: a head's ``d``), unless the
outer axis is pinned (a batch), when the merged axis repeats the inner layout; a split is
periodic (the inverse of that repeat) or coarsens the outer axis's unit (``C → (H, d)``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef
from fxlens.analyzer.prune.spaces import Spaces, coarsen, cut, widen
from fxlens.analyzer.prune.types import Axes, Layout, PruneKnowledge, entries

log = logging.getLogger(__name__)

MAX_REPEAT = 4096    # a merged axis repeating an inner layout more often than this is pinned


@dataclass
class Traced:
    """The spaces of one graph and every output's layouts, by (node id, output index)."""

    graph: Graph
    spaces: Spaces
    axes: Mapping[tuple[int, int], Axes]


def trace(graph: Graph, knowledge: PruneKnowledge) -> Traced:
    spaces = Spaces()
    axes: dict[tuple[int, int], Axes] = {}
    first_node = {n.target: n.id for n in graph.nodes if n.kind in (NodeKind.PARAM,
                                                                    NodeKind.BUFFER)}
    for node in graph.nodes:
        if node.kind is NodeKind.CALL:
            _call(node, graph, axes, spaces, knowledge)
            continue
        spec = node.outputs[0] if node.outputs else None
        if spec is None:
            continue
        pinned = "model input" if node.kind is NodeKind.INPUT else None
        axes[(node.id, 0)] = tuple(spaces.fresh(n, pinned) for n in spec.shape)
        tied = graph.tied.get(node.target)
        if tied is not None and tied in first_node:
            for a, b in zip(axes[(node.id, 0)], axes[(first_node[tied], 0)], strict=True):
                spaces.unify(a, b)
    for ref in graph.outputs:
        for layout in axes.get((ref.node, ref.index), ()):
            spaces.pin(layout, "model output")
    return Traced(graph, spaces, axes)


def _call(node: Node, graph: Graph, axes: dict[tuple[int, int], Axes], spaces: Spaces,
          knowledge: PruneKnowledge) -> None:
    if node.packet in knowledge.ignored_ops:
        return
    rule = knowledge.axis_rules.get(node.packet)
    call = _Call(node, graph, axes, spaces)
    reason = f"{node.packet} has no pruning rule"
    if rule is not None:
        try:
            rule(call)
            reason = ""
        except Exception as error:  # a failed rule pins what it touches; logged, never fatal
            log.info("axis rule for %s failed on node %d: %s", node.packet, node.id, error)
            reason = f"{node.packet}'s pruning rule failed"
    missing = [i for i, spec in enumerate(node.outputs)
               if spec is not None and (node.id, i) not in axes]
    if reason or missing:
        reason = reason or f"{node.packet}'s pruning rule left an output out"
        for ref in node.input_refs():
            for layout in axes.get((ref.node, ref.index), ()):
                spaces.pin(layout, reason)
        for i, spec in enumerate(node.outputs):
            if spec is not None:
                axes[(node.id, i)] = tuple(spaces.fresh(n, reason) for n in spec.shape)


class _Call:
    """`fxlens.analyzer.prune.types.AxisCall` over the walk's state."""

    def __init__(self, node: Node, graph: Graph, axes: dict[tuple[int, int], Axes],
                 spaces: Spaces) -> None:
        self.node, self._graph, self._axes, self._spaces = node, graph, axes, spaces

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.node.args.get(name, default)
        return default if value is None else value

    def shape(self, name: str) -> tuple[int, ...] | None:
        ref = self.node.args.get(name)
        spec = self._graph.spec(ref) if isinstance(ref, TensorRef) else None
        return spec.shape if spec is not None else None

    def out_shape(self, index: int = 0) -> tuple[int, ...]:
        spec = self.node.outputs[index]
        assert spec is not None
        return spec.shape

    def axes(self, name: str) -> Axes | None:
        ref = self.node.args.get(name)
        return self._axes.get((ref.node, ref.index)) if isinstance(ref, TensorRef) else None

    def axes_list(self, name: str) -> list[Axes]:
        refs = self.node.args.get(name) or []
        return [self._axes[(r.node, r.index)] for r in refs if isinstance(r, TensorRef)]

    def output(self, axes: Axes, index: int = 0) -> None:
        spec = self.node.outputs[index]
        if spec is None:
            return
        if tuple(entries(a) for a in axes) != spec.shape:
            raise ValueError(f"output {index}: layouts for {[entries(a) for a in axes]}, "
                             f"shape {spec.shape}")
        self._axes[(self.node.id, index)] = axes

    def unify(self, a: Layout, b: Layout) -> None:
        self._spaces.unify(a, b)

    def fresh(self, size: int, pinned: str | None = None) -> Layout:
        return self._spaces.fresh(size, pinned)

    def pin(self, layout: Layout, reason: str) -> None:
        self._spaces.pin(layout, reason)

    def cut(self, layout: Layout, start: int, end: int) -> Layout:
        return cut(layout, start, end, self._spaces)

    def widen(self, layout: Layout, factor: int) -> Layout:
        return widen(layout, factor)

    def broadcast(self, shape: Sequence[int], *operands: Axes | None) -> Axes:
        """The output axes of a broadcasting op: each output dim unifies the operands' dims
        of the same (non-1) size, right-aligned."""
        out: list[Layout] = []
        for i, size in enumerate(shape):
            back = len(shape) - i
            same = [o[len(o) - back] for o in operands
                    if o is not None and len(o) >= back and entries(o[len(o) - back]) == size]
            for other in same[1:]:
                self.unify(same[0], other)
            out.append(same[0] if same else self.fresh(size, "broadcast"))
        return tuple(out)

    def reshape(self, axes: Axes, shape: Sequence[int], new_shape: Sequence[int]) -> Axes:
        """The axes after a view/reshape from `shape` to `new_shape` (see the module
        docstring)."""
        old = [i for i, n in enumerate(shape) if n != 1]
        new = [j for j, n in enumerate(new_shape) if n != 1]
        out: list[Layout | None] = [None] * len(new_shape)
        i = j = 0
        while i < len(old) and j < len(new):
            group_old, group_new = [old[i]], [new[j]]
            i, j = i + 1, j + 1
            while math.prod(shape[k] for k in group_old) != math.prod(
                    new_shape[k] for k in group_new):
                if math.prod(shape[k] for k in group_old) < math.prod(
                        new_shape[k] for k in group_new):
                    group_old.append(old[i])
                    i += 1
                else:
                    group_new.append(new[j])
                    j += 1
            merged = self._merge([axes[k] for k in group_old])
            for k, layout in zip(group_new, self._split(merged, [new_shape[k] for k in
                                                                  group_new]), strict=True):
                out[k] = layout
        return tuple(layout if layout is not None else self.fresh(n, "size 1")
                     for layout, n in zip(out, new_shape, strict=True))

    def _merge(self, layouts: Sequence[Layout]) -> Layout:
        result = layouts[0]
        for inner in layouts[1:]:
            outer_pinned, inner_pinned = self._all_pinned(result), self._all_pinned(inner)
            if outer_pinned and inner_pinned:
                result = self.fresh(entries(result) * entries(inner), "merged pinned axes")
            elif outer_pinned and entries(result) <= MAX_REPEAT:
                result = inner * entries(result)
            else:
                self.pin(inner, "merged inside a wider axis")
                if outer_pinned:
                    self.pin(result, "merged inside a wider axis")
                result = widen(result, entries(inner))
        return result

    def _split(self, layout: Layout, sizes: Sequence[int]) -> list[Layout]:
        if len(sizes) == 1:
            return [layout]
        rest = math.prod(sizes[1:])
        resolved = self._spaces.resolve(layout)
        period = len(resolved) // sizes[0] if len(resolved) % sizes[0] == 0 else 0
        chunk = resolved[:period]
        if period and resolved == chunk * sizes[0] and entries(chunk) == rest:
            return [self.fresh(sizes[0], "repeated"), *self._split(chunk, sizes[1:])]
        outer = coarsen(layout, rest, self._spaces)
        if outer is None:
            self.pin(layout, "reshaped across units")
            outer = self.fresh(sizes[0], "reshaped across units")
        return [outer, *(self.fresh(n, "inside a unit") for n in sizes[1:])]

    def _all_pinned(self, layout: Layout) -> bool:
        return all(self._spaces.reason(a.space) is not None for a in layout)
