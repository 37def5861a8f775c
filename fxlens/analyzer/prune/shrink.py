"""The graph a pruning would leave: every tensor re-shaped by the units removed, then costed by
the same rules as the original, so a plan's FLOPs are exact by the rules' own count.

Why re-cost the graph rather than scale each op: an op's cost is not linear in every width
(attention scales with heads × head size, a matmul with both of its widths, norms add per-row
terms), and the rules already know each formula; re-shaping the specs and costing again gives
what analysing the pruned module would give, without building or capturing it. Arguments that
state a size (a depthwise conv's ``groups``, a norm's ``normalized_shape``) are fixed by the
rules (`PruneKnowledge.resize_args`). A removed whole block is cut out of the graph, its
consumers reading its stream input (`fxlens.analyzer.prune.blocks.without_blocks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorSpec
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.prune.blocks import BlockSite, removed_sites, without_blocks
from fxlens.analyzer.prune.trace import Traced
from fxlens.analyzer.prune.types import Axes, Layout, PruneKnowledge, Removal


@dataclass(frozen=True)
class Shrunk:
    """A removal's graph and its costs."""

    graph: Graph
    report: Report
    params: int


def shrink(traced: Traced, removed: Removal, knowledge: PruneKnowledge) -> Graph:
    """`traced.graph` with every tensor re-shaped as if `removed` were pruned."""
    lengths: dict[Layout, int] = {}

    def length(layout: Layout) -> int:
        if layout not in lengths:
            lengths[layout] = _length(traced, layout, removed)
        return lengths[layout]

    specs: dict[tuple[int, int], TensorSpec | None] = {}
    nodes = []
    for node in traced.graph.nodes:
        outputs = tuple(_resized(spec, traced.axes.get((node.id, i)), length)
                        for i, spec in enumerate(node.outputs))
        specs.update({(node.id, i): s for i, s in enumerate(outputs)})
        nodes.append(dataclasses.replace(node, outputs=outputs,
                                         args=_args(node, traced.graph, specs, knowledge)))
    by_name = {n.target: n.outputs[0] for n in nodes
               if n.kind in (NodeKind.PARAM, NodeKind.BUFFER) and n.outputs}
    params = tuple(dataclasses.replace(p, spec=by_name.get(p.name) or p.spec)
                   for p in traced.graph.params)
    return dataclasses.replace(traced.graph, nodes=tuple(nodes), params=params)


def costed(traced: Traced, removed: Removal, knowledge: PruneKnowledge,
           registry: CostRegistry, sites: Mapping[int, BlockSite] | None = None) -> Shrunk:
    """The removal's graph (removed blocks' nodes gone, `sites` by root) and its costs."""
    graph = shrink(traced, removed, knowledge)
    graph = without_blocks(graph, removed_sites(sites or {}, removed))
    report = analyze(graph, registry)
    return Shrunk(graph, report, report.model.params)


def _length(traced: Traced, layout: Layout, removed: Removal) -> int:
    total = 0
    for atom in traced.spaces.resolve(layout):
        gone = removed.get(atom.space, frozenset())
        lost = sum(1 for u in gone if atom.start <= u < atom.start + atom.count)
        total += (atom.count - lost) * atom.width
    return total


def _resized(spec: TensorSpec | None, axes: Axes | None,
             length: Callable[[Layout], int]) -> TensorSpec | None:
    if spec is None or axes is None or len(axes) != len(spec.shape):
        return spec
    shape = tuple(length(a) for a in axes)
    if shape == spec.shape:
        return spec
    return dataclasses.replace(spec, shape=shape, stride=_strides(spec, shape))


def _strides(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides for `shape` in the original's dim order (a transposed view stays one)."""
    if len(spec.stride) != len(shape):
        return ()
    order = sorted(range(len(shape)), key=lambda d: (spec.stride[d], -d))
    strides, step = [0] * len(shape), 1
    for d in order:
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _args(node: Node, graph: Graph, specs: Mapping[tuple[int, int], TensorSpec | None],
          knowledge: PruneKnowledge) -> Mapping[str, object]:
    if node.kind is not NodeKind.CALL or knowledge.resize_args is None:
        return node.args
    refs = list(node.input_refs())
    before = [_shape(graph.spec(r)) for r in refs]
    after = [_shape(specs.get((r.node, r.index))) for r in refs]
    if before == after:
        return node.args
    return knowledge.resize_args(node, before, after)


def _shape(spec: TensorSpec | None) -> tuple[int, ...]:
    return spec.shape if spec is not None else ()

