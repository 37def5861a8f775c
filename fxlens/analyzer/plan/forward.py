"""Tensor parallelism in a forward graph: the split `fxlens.analyzer.plan.structure` finds in
a training step's forward (Megatron's column/row pairs, the LM head vocab-parallel), read on
a plain forward — what serving shards (`fxlens.serve_pass`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from fxlens.analyzer.core.graph import Graph, repeated_blocks
from fxlens.analyzer.plan.structure import unit_of_nodes
from fxlens.analyzer.plan.tensor_split import handed_on, split_unit
from fxlens.analyzer.plan.types import ParallelKnowledge


@dataclass(frozen=True)
class ForwardSplit:
    """Tensor-parallel roles in a forward graph (serving, `fxlens.serve_pass`): the nodes
    that run on 1/t of the features, and the row-parallel GEMMs whose outputs are
    all-reduced (`reduce_bytes`: each one's payload, by node; a MoE layer's experts' the
    tokens' combined hidden states, `tensor_split.split_unit`)."""

    split_nodes: frozenset[int]
    reduce_bytes: Mapping[int, int]


def forward_split(graph: Graph, knowledge: ParallelKnowledge) -> ForwardSplit:
    """Megatron's split of every unit of a forward graph, as `read_facts` finds it in a
    training step's forward: column/row pairs, the LM head vocab-parallel."""
    blocks = repeated_blocks(graph.module_types)
    members: defaultdict[str, set[int]] = defaultdict(set)
    for node_id, unit in unit_of_nodes(graph, blocks).items():
        if graph.nodes[node_id].phase == "forward":
            members[unit].add(node_id)
    split_nodes: set[int] = set()
    reduce_bytes: dict[int, int] = {}
    handed = handed_on(graph, members)
    for name, scope in members.items():
        split = split_unit(graph, scope, name == "post", knowledge, handed[name])
        split_nodes |= split.split_nodes
        reduce_bytes |= split.payloads
    return ForwardSplit(frozenset(split_nodes), reduce_bytes)
