"""Coupled groups read off a traced graph, and their data-free importance per unit.

A group is one unpinned space (`fxlens.analyzer.prune.spaces`) that some parameter axis
carries, with at least two units: removing unit ``u`` removes, from every member, the entries
that unit covers. A pinned space that parameters carry is not a group; its reason is counted
(``blocked``) so the report says why those axes stay.

Importance (data-free): the L2 norm of every member's entries of one unit together (as
Torch-Pruning's group norm), or, where a batch norm scales the group, the sum of its ``|γ|``
over the unit (network slimming: a channel the norm scales to ~0 carries ~nothing). Units are
compared across groups after dividing by their group's mean, so a wide and a narrow group
compete on how each unit stands in its own group. Calibrated importance (removing a unit and
forwarding calibration batches, `fxlens.analyzer.prune.calibrated`) replaces it where there is
calibration data, and is comparable across groups as it is. A whole residual block
(`fxlens.analyzer.prune.blocks`) is a one-unit group whose members are all its parameters: its
data-free score is the L2 of all its weights (no |γ| rule: a block's norms scale its inner
channels, not its output).
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from fxlens.analyzer.core.graph import NodeKind
from fxlens.analyzer.core.sections import PruneMember
from fxlens.analyzer.prune.trace import Traced


@dataclass(frozen=True)
class Found:
    """One group as the engine uses it: its space, members and per-unit importance."""

    root: int
    units: int
    members: tuple[PruneMember, ...]
    buffers: frozenset[str]
    conv: bool = False                 # a member has more than two dims (a conv weight)
    importance: tuple[float, ...] = ()
    basis: str = "none"
    comparable: bool = False           # importance on one scale across groups (calibrated)
    # a whole residual block (`fxlens.analyzer.prune.blocks`): its path, the blocks of its
    # run and the run's first block, and how it returns (0: a tensor, n: an n-tuple)
    block: str = ""
    siblings: int = 0
    run: str = ""
    returns: int = 0


def find_groups(traced: Traced) -> tuple[list[Found], dict[str, int]]:
    """The groups of a traced graph, and the reasons (with counts) of pinned ones."""
    spaces = traced.spaces
    members: dict[int, list[PruneMember]] = defaultdict(list)
    buffers: dict[int, set[str]] = defaultdict(set)
    conv: set[int] = set()
    blocked: dict[int, str] = {}
    for node in traced.graph.nodes:
        if node.kind not in (NodeKind.PARAM, NodeKind.BUFFER) or (node.id, 0) not in traced.axes:
            continue
        for dim, layout in enumerate(traced.axes[(node.id, 0)]):
            offset = 0
            for atom in spaces.resolve(layout):
                reason = spaces.pinned.get(atom.space)
                if reason is not None and node.kind is NodeKind.PARAM and atom.entries > 1:
                    blocked[atom.space] = reason
                elif reason is None:
                    members[atom.space].append(PruneMember(node.target, dim, offset, atom.width,
                                                           atom.start, atom.count))
                    if node.kind is NodeKind.BUFFER:
                        buffers[atom.space].add(node.target)
                    if len(traced.axes[(node.id, 0)]) > 2:
                        conv.add(atom.space)
                offset += atom.entries
    found = [Found(root, spaces.size[root], tuple(ms), frozenset(buffers[root]), root in conv)
             for root, ms in members.items()
             if spaces.size[root] >= 2 and any(m.param not in buffers[root] for m in ms)]
    reasons: dict[str, int] = defaultdict(int)
    for reason in blocked.values():
        reasons[reason] += 1
    return found, dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))


def entry_index(member: PruneMember, units: Sequence[int]) -> list[int]:
    """The entries of `member`'s dim that `units` (of its group) cover, in order."""
    return [member.start + (u - member.first_unit) * member.width + i
            for u in units if member.first_unit <= u < member.first_unit + member.units
            for i in range(member.width)]


def data_free(group: Found, tensors: Mapping[str, torch.Tensor],
              scale_params: frozenset[str] = frozenset()) -> tuple[tuple[float, ...], str]:
    """Per unit: ``|γ|`` summed where a batch norm scales the group, else the L2 norm of all
    members' entries of the unit; "none" (all ones) where weights are not real."""
    real = {m.param: tensors[m.param] for m in group.members
            if m.param in tensors and not tensors[m.param].is_meta}
    if len(real) < len({m.param for m in group.members}):
        return (1.0,) * group.units, "none"
    scales = [m for m in group.members if m.param in scale_params]
    chosen, basis = (scales, "|γ| of the batch norm") if scales else (
        [m for m in group.members if m.param not in group.buffers], "L2 of the weights")
    squares = torch.zeros(group.units, dtype=torch.float64)
    for m in chosen:
        w = real[m.param].detach().double().movedim(m.dim, 0)
        rows = w[m.start:m.start + m.units * m.width].reshape(m.units, -1)
        part = rows.abs().sum(1) if scales else rows.pow(2).sum(1)
        squares[m.first_unit:m.first_unit + m.units] += part
    values = squares if scales else squares.sqrt()
    return tuple(float(v) for v in values), basis


def with_importance(groups: Sequence[Found], tensors: Mapping[str, torch.Tensor],
                    scale_params: frozenset[str]) -> list[Found]:
    out = []
    for group in groups:
        values, basis = data_free(group, tensors, frozenset() if group.block else scale_params)
        out.append(dataclasses.replace(group, importance=values, basis=basis))
    return out


def describe(group: Found) -> tuple[str, str, str]:
    """(kind, unit, name) of a group in words, from its members' widths and paths."""
    if group.block:
        return "block", "the whole block", group.block
    params = [m for m in group.members if m.param not in group.buffers]
    widths = sorted({m.width for m in params})
    if widths == [1]:
        kind, unit = ("channels", "1 channel") if group.conv else ("neurons", "1 neuron")
    elif len(widths) == 1:
        kind, unit = "heads", f"1 head = {widths[0]} rows"
    else:
        kind = "kv groups"
        unit = f"1 KV group = {widths[-1] // widths[0]} query heads ({widths[-1]} rows)"
    owners = list(dict.fromkeys(m.param.rpartition(".")[0] for m in params))
    name = os.path.commonprefix([o + "." for o in owners]).rpartition(".")[0]
    if not name:
        name = (f"{owners[0]} → {owners[-1]}" if len(owners) <= 3 else
                f"{owners[0]} … {owners[-1]} ({len(owners)} modules)")
    return kind, unit, name
