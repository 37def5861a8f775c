"""The splice of `fxlens.analyzer.capture.step_blocks` (its docstring has the whole scheme):
the recorded step's nodes, renumbered, with each member's forward and backward placeholder
replaced by a copy of its first block's nodes that reads the member's inputs, weights and
incoming gradients; and the records both sides share (a block's forward as recorded, a
group's first block, a member).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxlens.analyzer.capture.blocks_splice import moved
from fxlens.analyzer.core.graph import Node, NodeKind, TensorRef, map_refs

FORWARD = "fxlens_blocks.forward_stand_in"
BACKWARD = "fxlens_blocks.backward_stand_in"


class Unstandable(Exception):
    """The step recorded with stand-ins would not be the full recording: record it without."""


@dataclass
class BlockForward:
    """One block's forward as recorded."""

    path: str
    start: int                                  # its first node
    end: int                                    # one past its last
    inputs: tuple[TensorRef | None, ...]        # its tensor inputs, in pytree order
    grad_inputs: tuple[int, ...]                # which of them require grad


@dataclass
class FirstBlock:
    """A block of a group recorded in full between marks: its forward, and the gradients its
    marks saw; later blocks that match it are its copies."""

    forward: BlockForward
    key: list[Any]
    returned: tuple[Any, ...]                   # what it returned, by where it comes from
    outputs: tuple[TensorRef, ...]              # its tensor outputs
    output_grads: tuple[bool, ...]              # which of them require grad
    saved: tuple[TensorRef, ...] = ()           # what autograd saved during its forward
    grads_in: dict[int, TensorRef | None] = field(default_factory=dict)   # of its outputs
    grads_out: dict[int, TensorRef | None] = field(default_factory=dict)  # of its inputs


@dataclass
class MemberBlock:
    forward: BlockForward
    first: FirstBlock
    saved_at: int                               # where its saved tensors go in the list
    grad_specs: tuple[tuple[Any, ...], ...]     # (shape, stride, dtype, device) per grad input


@dataclass(frozen=True)
class Recorded:
    """What the splice reads of a recording with stand-ins: its nodes, its members, the
    model's state and each weight's node by name, and the node a tensor was recorded as."""

    nodes: Sequence[Node]
    members: Sequence[MemberBlock]
    state: Mapping[str, torch.Tensor]
    weights: Mapping[str, TensorRef | None]
    peek: Callable[[torch.Tensor], TensorRef | None]


class StepSplice:
    """The recorded nodes, renumbered, with each placeholder replaced by a copy."""

    def __init__(self, recorded: Recorded, regions: Mapping[str, range]) -> None:
        self.recorded = recorded
        self.nodes = recorded.nodes
        self.regions = regions
        self.out: list[Node] = []
        self.new_id: dict[int, int] = {}                   # recorded node → spliced node
        self.renamed: dict[TensorRef, TensorRef] = {}      # a placeholder's outputs
        self.forwards: dict[str, dict[int, int]] = {}      # member → first's node → its copy
        self.saved: dict[str, list[TensorRef]] = {}        # member → what autograd saved
        self.grads: dict[str, TensorRef] = {}              # members' weight gradients

    def fix(self, ref: TensorRef) -> TensorRef:
        if ref in self.renamed:
            return self.renamed[ref]
        if ref.node not in self.new_id:
            raise Unstandable(f"node {ref.node} is read before it is made, or was dropped")
        return TensorRef(self.new_id[ref.node], ref.index)

    def add(self, node: Node) -> None:
        if node.target == FORWARD:
            self._forward(node)
        elif node.target == BACKWARD:
            self._backward(node)
        else:
            self.new_id[node.id] = len(self.out)
            self.out.append(renumbered(node, len(self.out), self.fix, node.module))

    def _forward(self, node: Node) -> None:
        member = self.recorded.members[node.args["member"]]
        first, target = member.first, member.forward.path
        copied = self.forwards[target] = {}

        def ref(r: TensorRef) -> TensorRef:
            return self._member_ref(r, member, copied)

        self._copy(range(first.forward.start, first.forward.end), copied, ref,
                   first.forward.path, target)
        for i, output in enumerate(first.outputs):
            self.renamed[TensorRef(node.id, i)] = ref(output)
        self.saved[target] = [ref(r) for r in first.saved]

    def _backward(self, node: Node) -> None:
        member = self.recorded.members[node.args["member"]]
        first, target = member.first, member.forward.path
        forward = self.forwards[target]
        needing = [i for i, grad in enumerate(first.output_grads) if grad]
        incoming = {r: node.args["grads"][needing[j]] for j, r in first.grads_in.items()
                    if r is not None}
        copied: dict[int, int] = {}
        region = self.regions[first.forward.path]

        def ref(r: TensorRef) -> TensorRef:
            if r.node in copied:
                return TensorRef(copied[r.node], r.index)
            if r in incoming:
                grad = incoming[r]
                if grad is None:
                    raise Unstandable(f"{target} got no gradient where the first block got one")
                return self.fix(grad)
            if self.nodes[r.node].phase == "backward":
                raise Unstandable(f"{first.forward.path}'s backward reads node {r.node} "
                                  "from outside it")
            return self._member_ref(r, member, forward)

        self._copy(region, copied, ref, first.forward.path, target)
        for i in range(len(first.forward.grad_inputs)):
            grad = first.grads_out.get(i)
            if grad is None:
                raise Unstandable(f"{first.forward.path} passed no gradient to input {i}")
            made = ref(grad)
            if self.out[made.node].outputs[made.index] != node.outputs[i]:
                raise Unstandable(f"{target}'s input gradient {i} has another spec than the "
                                  "first block's")
            self.renamed[TensorRef(node.id, i)] = made
        for name, tensor in self.recorded.state.items():
            own = under(name, first.forward.path)
            if own is None or tensor.grad is None:
                continue
            grad = self.recorded.peek(tensor.grad)
            if grad is None or grad.node not in copied:
                raise Unstandable(f"{name}'s gradient is not made in its block's backward")
            self.grads[target + own] = TensorRef(copied[grad.node], grad.index)

    def _member_ref(self, r: TensorRef, member: MemberBlock, forward: Mapping[int, int]
                    ) -> TensorRef:
        """A ref the first block's nodes read, as the member's: the copy of a forward node
        (`forward`: the first's node → its copy), the member's input in the same place, the
        member's own weight of the same name, or the same outside tensor."""
        first = member.first
        if r.node in forward:
            return TensorRef(forward[r.node], r.index)
        if first.forward.start <= r.node < first.forward.end:
            raise Unstandable(f"{first.forward.path}'s node {r.node} has no copy")
        for i, source in enumerate(first.forward.inputs):
            if source == r:
                mapped = member.forward.inputs[i]
                if mapped is None:
                    raise Unstandable(f"{member.forward.path} reads an input never seen")
                return self.fix(mapped)
        own = own_name(self.nodes[r.node], first.forward.path)
        if own is None:
            return self.fix(r)
        weight = self.recorded.weights.get(f"{member.forward.path}.{own}")
        if weight is None:
            raise Unstandable(f"{member.forward.path}.{own} is not a recorded weight")
        return self.fix(weight)

    def _copy(self, nodes: range, copied: dict[int, int],
              ref: Callable[[TensorRef], TensorRef], source: str, target: str) -> None:
        for i in nodes:
            node = self.nodes[i]
            if node.target in (FORWARD, BACKWARD):
                raise Unstandable(f"a stand-in inside {source}")
            copied[i] = len(self.out)
            self.out.append(renumbered(node, len(self.out), ref,
                                        moved(node.module, source, target)))


def renumbered(node: Node, id: int, ref: Callable[[TensorRef], TensorRef], module: str
                ) -> Node:
    """`node` as node `id` of `module`, its refs through `ref`. The splice makes one per node
    of the step: mapping only what aten arguments hold (tensors, lists of them) and building
    the node directly took the 7B step's splice from 0.39 to 0.21 s against `map_refs` and
    `dataclasses.replace`."""
    args = {}
    for name, value in node.args.items():
        kind = type(value)
        if kind is TensorRef:
            value = ref(value)
        elif kind is list or kind is tuple:
            value = map_refs(value, ref)
        args[name] = value
    return Node(id, node.kind, node.target, args, node.outputs, module, node.module_type,
                node.source, node.phase, node.value)


def own_name(node: Node, path: str) -> str | None:
    """A weight's name relative to block `path`, None if it is not the block's own."""
    if node.kind not in (NodeKind.PARAM, NodeKind.BUFFER):
        return None
    suffix = under(node.target, path)
    return suffix[1:] if suffix else None


def under(name: str, path: str) -> str | None:
    """What follows `path` in `name` ("" for `path` itself), None if `name` is not under it."""
    if name == path or name.startswith(path + "."):
        return name[len(path):]
    return None
