"""Step 3 of `fxlens.analyzer.capture.blocks` (its docstring has the whole scheme): the traced
graph with every stand-in replaced by a copy of its representative's nodes, module paths and
parameters renamed to the member's, the markers removed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from fxlens.analyzer.capture.blocks import ENTER, EXIT, STAND_IN, Repeats, SpliceError
from fxlens.analyzer.core.graph import Node, NodeKind, TensorRef, map_refs


def splice(nodes: Sequence[Node], outputs: Sequence[TensorRef], repeats: Repeats,
           weights: set[str]) -> tuple[list[Node], tuple[TensorRef, ...]]:
    """The traced `nodes` with every stand-in replaced by a copy of its representative's
    nodes and the markers removed; `weights` are the model's parameter and buffer names."""
    enters = {n.args["block"]: n for n in nodes if n.target == ENTER}
    exits = {n.args["block"]: n for n in nodes if n.target == EXIT}
    for block, enter in enters.items():
        if block in exits:
            _check_no_outside_alias(nodes, enter, exits[block], repeats.groups[block].members[0])
    spliced: list[Node] = []
    moved: dict[int, int] = {}                      # old node id → new node id
    renamed: dict[tuple[int, int], TensorRef] = {}  # marker outputs → what they stand for
    weight_ids: dict[str, int] = {}

    def fix(ref: TensorRef) -> TensorRef:
        if (ref.node, ref.index) in renamed:
            return renamed[(ref.node, ref.index)]
        if ref.node not in moved:
            raise SpliceError(f"node {ref.node} is used before it is defined")
        return TensorRef(moved[ref.node], ref.index)

    for node in nodes:
        if node.target in (ENTER, EXIT):
            for i, ref in enumerate(node.args["xs"]):
                renamed[(node.id, i)] = fix(ref)
        elif node.target == STAND_IN:
            block = node.args["block"]
            if block not in enters or block not in exits:
                raise SpliceError(f"block {block}'s traced representative has no markers")
            group = repeats.groups[block]
            copy = _Copy(enters[block], exits[block], nodes, group.members[0],
                         group.members[node.args["member"]], [fix(r) for r in node.args["xs"]],
                         weights, weight_ids, fix)
            for i, ref in enumerate(copy.into(spliced)):
                renamed[(node.id, i)] = ref
        else:
            moved[node.id] = len(spliced)
            if node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
                weight_ids[node.target] = len(spliced)
            spliced.append(replace(node, id=len(spliced), args=map_refs(node.args, fix)))
    return spliced, tuple(fix(ref) for ref in outputs)


# Ops that return their input object itself when they change nothing (``x.to(x.dtype)``,
# ``contiguous()`` of a contiguous tensor): export then maps that *object* to the op's node,
# so whoever reads the same object later reads this node.
RETURNS_ITSELF = frozenset({
    "aten.to.dtype", "aten.to.device", "aten.to.dtype_layout", "aten.to.other",
    "aten.type_as.default", "aten.contiguous.default", "aten.flatten.using_ints",
})


def _check_no_outside_alias(nodes: Sequence[Node], enter: Node, exit: Node, path: str
                            ) -> None:
    """Refuse a representative that hands back, unchanged, an object others read after it.

    A full export re-points such an object to the node inside the first block (XLNet hands
    every layer the same position embedding, and each calls ``r.type(r.dtype)`` on it: the
    next layers read the first layer's ``to`` node). Traced between markers, the block works
    on the marker's copy instead, so its copies would read the original: another graph.
    The block's own weights (under `path`) are read by no one else: each copy reads its own."""
    inside = range(enter.id + 1, exit.id)
    for node in nodes[enter.id + 1:exit.id]:
        source = node.args.get("self")
        if node.target not in RETURNS_ITSELF or not isinstance(source, TensorRef) \
                or source.node in inside:
            continue
        original = enter.args["xs"][source.index] if source.node == enter.id else source
        if node.outputs[:1] != nodes[original.node].outputs[original.index:original.index + 1]:
            continue                          # it made a new tensor: nothing re-pointed
        if source.node != enter.id:
            if nodes[source.node].kind in (NodeKind.PARAM, NodeKind.BUFFER) \
                    and nodes[source.node].target.startswith(path + "."):
                continue
            raise SpliceError(f"{node.target} returns an outside tensor itself")
        if any(original in later.input_refs() for later in nodes[exit.id + 1:]):
            raise SpliceError(f"{node.target} returns an input itself that is read after "
                              "the block")


@dataclass
class _Copy:
    """The representative's nodes (strictly between its markers) as the member's."""

    enter: Node
    exit: Node
    nodes: Sequence[Node]
    source: str            # the representative's module path
    target: str            # the member's
    inputs: list[TensorRef]
    weights: set[str]
    weight_ids: Mapping[str, int]
    outside: Callable[[TensorRef], TensorRef]

    def into(self, spliced: list[Node]) -> list[TensorRef]:
        """Append the copy to `spliced`; the refs of the member's outputs."""
        self.copied: dict[int, int] = {}
        for node in self.nodes[self.enter.id + 1:self.exit.id]:
            if node.kind is not NodeKind.CALL or node.target in (ENTER, EXIT, STAND_IN):
                raise SpliceError(f"{node.target} inside the traced representative")
            self.copied[node.id] = len(spliced)
            spliced.append(replace(node, id=len(spliced), args=map_refs(node.args, self.ref),
                                   module=self._path(node.module)))
        return [self.ref(ref) for ref in self.exit.args["xs"]]

    def ref(self, ref: TensorRef) -> TensorRef:
        if ref.node in self.copied:
            return TensorRef(self.copied[ref.node], ref.index)
        if ref.node == self.enter.id:
            return self.inputs[ref.index]
        node = self.nodes[ref.node]
        if node.kind in (NodeKind.PARAM, NodeKind.BUFFER):
            name = self._path(node.target)
            if name not in self.weights or name not in self.weight_ids:
                raise SpliceError(f"{node.target} has no counterpart {name} in the graph")
            return TensorRef(self.weight_ids[name], ref.index)
        return self.outside(ref)

    def _path(self, path: str) -> str:
        return moved(path, self.source, self.target)


def moved(path: str, source: str, target: str) -> str:
    """`path` with its prefix `source` (a module path) replaced by `target`; as it is when it
    is not under `source`."""
    if path == source or path.startswith(source + "."):
        return target + path[len(source):]
    return path

