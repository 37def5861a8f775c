"""Whole residual blocks as prunable groups: found from the captured graph, removed from the
graph for costing, and swapped for an identity in the module.

A *block* is a module of a run of repeated ones (the children ``0 … N-1`` of one parent, one
type, at any depth: a decoder's layers, a ResNet stage's blocks) whose forward is a residual
update of its stream input: exactly one tensor leaves it, with the shape and dtype of a tensor
that enters it, and walking back from that output through ops of the same shape reaches a
residual add (`PruneKnowledge.residual_ops`) one of whose operands is that input, through
copies. Removing it makes the model compute ``x`` instead of ``block(x)``: for a pre-norm
block ``x + f(x)``, exactly the stream without ``f``. NB: a post-norm block (BERT's
``LN(x + f(x))``) or one with an activation after its add (ResNet's ``relu(x + f(x))``) loses
that op too; on a ResNet the stream is already ≥ 0 after the previous block's ReLU, so the two
agree, and for a post-norm layer the damage is what calibration measures. A block whose
shortcut is a projection (a downsampling ResNet block) changes its stream's shape or adds two
of its own tensors, so it is not a block here. Where a removable block holds removable blocks
(a stage of identity blocks), the inner ones are the groups.

Each block is a `Found` with one unit (its ``block`` path, every parameter of it as a member,
dim 0 whole) and a negative root, so a `Removal` carries blocks beside the finer groups. A
block and the finer groups inside it are exclusive: a removal that takes a block drops their
units (`exclusive`). Importance (data-free): the L2 norm of all the block's weights, the rule
a unit's members get (`fxlens.analyzer.prune.groups`); the plan compares a block with its own
run's mean, as a unit with its group's (`fxlens.analyzer.prune.plan.ranked_units`).

The module side: `Skipped` stands in for a removed block and returns its first argument (the
stream: ``hidden_states`` of every `transformers` layer, ``x`` of a torchvision block). In
the installed `transformers` (5.x) a decoder, encoder or GPT-2 layer returns the hidden state
tensor itself; where a block returned a tuple (4.x layers), `Skipped` returns a tuple as long
with the stream first and ``None`` for the rest (no attention weights, no cache). A saved
module keeps no `Skipped` where a cache addresses the block by its number (`drop_indexed`):
the block leaves its run and the model's config says the new depth.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.core.graph import Graph, NodeKind, TensorRef, map_refs
from fxlens.analyzer.core.sections import PruneMember
from fxlens.analyzer.prune.groups import Found
from fxlens.analyzer.prune.types import PruneKnowledge, Removal

MAX_WALK = 4096     # nodes walked back from a block's output looking for its residual add


@dataclass(frozen=True)
class BlockSite:
    """Where a block sits in the graph: the stream tensor in and out, the nodes it owns."""

    path: str
    root: int                      # its id in a `Removal` (negative)
    siblings: int                  # blocks in its run, removable or not
    run: str                       # the path of its run's first block
    stream_in: TensorRef
    stream_out: TensorRef
    nodes: frozenset[int]          # its op nodes and the parameter nodes only it reads
    params: frozenset[str]         # parameter and buffer names it holds


def within(name: str, path: str) -> bool:
    return name == path or name.startswith(path + ".")


def find_blocks(graph: Graph, knowledge: PruneKnowledge) -> list[BlockSite]:
    """The removable blocks of `graph`, innermost where they nest (module docstring)."""
    consumers: dict[int, set[int]] = defaultdict(set)
    for node in graph.nodes:
        for ref in node.input_refs():
            consumers[ref.node].add(node.id)
    sites = []
    for run in _runs(graph.module_types):
        for path in run:
            site = _site(graph, path, run, knowledge, consumers)
            if site is not None:
                sites.append(site)
    inner = [s for s in sites if not any(o is not s and within(o.path, s.path) for o in sites)]
    return [replace(s, root=-1 - i) for i, s in enumerate(inner)]


def _runs(module_types: Mapping[str, str]) -> list[list[str]]:
    """Every run of repeated blocks, nested ones included: two or more consecutive numbered
    children of one parent of one type (a decoder's layers; the blocks between the stem and
    the head of one ``nn.Sequential``)."""
    children: dict[str, dict[str, str]] = defaultdict(dict)
    for path in module_types:
        if path:
            parent, _, name = path.rpartition(".")
            children[parent][name] = path
    runs: list[list[str]] = []
    for kids in children.values():
        numbers = [int(name) for name in kids if name.isdigit()]
        run: list[str] = []
        for i in range(max(numbers, default=-2) + 2):
            kid = kids.get(str(i))
            if kid is not None and run and module_types[kid] == module_types[run[0]]:
                run.append(kid)
                continue
            if len(run) >= 2:
                runs.append(run)
            run = [kid] if kid is not None else []
    return runs


def _site(graph: Graph, path: str, run: Sequence[str], knowledge: PruneKnowledge,
          consumers: Mapping[int, set[int]]) -> BlockSite | None:
    inside = {n.id for n in graph.nodes if n.kind is NodeKind.CALL and within(n.module, path)}
    leaving = {ref for n in graph.nodes if n.id not in inside for ref in n.input_refs()
               if ref.node in inside} | {r for r in graph.outputs if r.node in inside}
    if not inside or len(leaving) != 1:
        return None
    out = next(iter(leaving))
    spec = graph.spec(out)
    entering = {ref for i in inside for ref in graph.nodes[i].input_refs()
                if ref.node not in inside
                and graph.nodes[ref.node].kind not in (NodeKind.PARAM, NodeKind.BUFFER)
                and (s := graph.spec(ref)) is not None and spec is not None
                and (s.shape, s.dtype) == (spec.shape, spec.dtype)}
    stream = _residual_input(graph, out, inside, entering, knowledge)
    if stream is None:
        return None
    owned = {n.id for n in graph.nodes if n.kind in (NodeKind.PARAM, NodeKind.BUFFER)
             and within(n.target, path) and consumers.get(n.id, set()) <= inside}
    names = frozenset(p.name for p in graph.params if within(p.name, path))
    return BlockSite(path, 0, len(run), run[0], stream, out, frozenset(inside | owned), names)


def _residual_input(graph: Graph, out: TensorRef, inside: set[int], entering: set[TensorRef],
                    knowledge: PruneKnowledge) -> TensorRef | None:
    """The entering tensor that a residual add on the output's same-shape path adds."""
    spec = graph.spec(out)
    todo, seen = [out.node], {out.node}
    while todo and len(seen) < MAX_WALK:
        node = graph.nodes[todo.pop()]
        operands = [_through_copies(graph, r, inside) for r in node.input_refs()]
        if node.packet in knowledge.residual_ops:
            hit = next((r for r in operands if r in entering), None)
            if hit is not None:
                return hit
        for ref in node.input_refs():
            s = graph.spec(ref)
            if (ref.node in inside and ref.node not in seen and s is not None
                    and spec is not None and s.shape == spec.shape):
                seen.add(ref.node)
                todo.append(ref.node)
    return None


def _through_copies(graph: Graph, ref: TensorRef, inside: set[int]) -> TensorRef:
    """`ref` traced back through single-input ops of the same spec inside the block."""
    for _ in range(4):
        node = graph.nodes[ref.node]
        refs = list(node.input_refs())
        if ref.node not in inside or len(refs) != 1 or graph.spec(refs[0]) != graph.spec(ref):
            break
        ref = refs[0]
    return ref


def block_groups(sites: Sequence[BlockSite], graph: Graph) -> list[Found]:
    """Each block as a one-unit group: every parameter of it a member, dim 0 whole."""
    specs = {p.name: p.spec for p in graph.params if not p.is_buffer}
    out = []
    for site in sites:
        members = tuple(PruneMember(name, 0, 0, specs[name].shape[0], 0, 1)
                        for name in sorted(site.params) if name in specs and specs[name].shape)
        if members:
            out.append(Found(site.root, 1, members, frozenset(), block=site.path,
                             siblings=site.siblings, run=site.run))
    return out


def without_blocks(graph: Graph, sites: Iterable[BlockSite]) -> Graph:
    """`graph` with each site's nodes gone and its output read as its stream input."""
    sites = list(sites)
    if not sites:
        return graph
    gone = frozenset().union(*(s.nodes for s in sites))
    names = frozenset().union(*(s.params for s in sites))
    redirect = {s.stream_out: s.stream_in for s in sites}
    kept = [n for n in graph.nodes if n.id not in gone]
    new_id = {n.id: i for i, n in enumerate(kept)}

    def moved(ref: TensorRef) -> TensorRef:
        while ref in redirect:
            ref = redirect[ref]
        return TensorRef(new_id[ref.node], ref.index)

    nodes = tuple(replace(n, id=new_id[n.id], args=map_refs(n.args, moved)) for n in kept)
    paths = [s.path for s in sites]
    return replace(
        graph, nodes=nodes, params=tuple(p for p in graph.params if p.name not in names),
        outputs=tuple(moved(r) for r in graph.outputs),
        roles={moved(r): role for r, role in graph.roles.items() if r.node not in gone},
        module_types={k: v for k, v in graph.module_types.items()
                      if not any(within(k, p) for p in paths)},
        tied={k: v for k, v in graph.tied.items() if k not in names and v not in names})


def removed_sites(sites: Mapping[int, BlockSite], removal: Removal) -> list[BlockSite]:
    return [sites[root] for root, units in removal.items() if root in sites and units]


def exclusive(groups: Sequence[Found], removal: Removal) -> Removal:
    """`removal` without the units of finer groups that lie inside a removed block."""
    gone = [g.block for g in groups if g.block and removal.get(g.root)]
    if not gone:
        return removal
    inside = {g.root for g in groups if not g.block and all(
        any(within(m.param, b) for b in gone) for m in g.members if m.param not in g.buffers)}
    return {root: units for root, units in removal.items() if root not in inside}


class Skipped(nn.Module):
    """A removed residual block: returns its stream input (the first argument) unchanged.
    `indexed`: the block held a ``layer_idx`` (a cache addresses it by its number)."""

    def __init__(self, was: str, stream_arg: str, returns: int = 0,
                 attributes: Mapping[str, Any] | None = None, indexed: bool = False) -> None:
        super().__init__()
        self.was, self.stream_arg, self.returns = was, stream_arg, returns
        self.indexed = indexed
        for name, value in (attributes or {}).items():
            setattr(self, name, value)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else kwargs[self.stream_arg]
        return (x, *([None] * (self.returns - 1))) if self.returns else x

    def extra_repr(self) -> str:
        return f"removed {self.was}"


def skipped(block: nn.Module, returns: int = 0) -> Skipped:
    """The stand-in for `block`; its plain attributes (a layer index, an attention type)
    kept, as a parent may read them."""
    params = list(inspect.signature(block.forward).parameters)
    plain = {k: v for k, v in vars(block).items() if not k.startswith("_") and k != "training"
             and isinstance(v, (str, int, float, bool, type(None)))}
    indexed = any(isinstance(getattr(m, "layer_idx", None), int) for m in block.modules())
    return Skipped(type(block).__name__, params[0] if params else "x", returns, plain, indexed)


def drop_indexed(module: nn.Module) -> None:
    """Take every removed block a cache addresses by number out of its run for good: the
    blocks after it renumbered (``layer_idx``), the config of the stack that holds the run
    told the new depth (``num_hidden_layers`` and every per-layer list, e.g.
    ``layer_types``; an encoder-decoder's other stack keeps its own). A `Skipped` left in
    place would leave its cache layer empty, and `transformers` reads the cached length from
    layer 0: decoding with a cache after removing the first layer restarts positions."""
    for path, run in list(module.named_modules()):
        if not isinstance(run, (nn.ModuleList, nn.Sequential)):
            continue
        blocks = list(run)
        kept = [i for i, b in enumerate(blocks) if not (isinstance(b, Skipped) and b.indexed)]
        if len(kept) == len(blocks):
            continue
        for new, old in enumerate(kept):
            for m in blocks[old].modules():
                if getattr(m, "layer_idx", None) == old:
                    m.layer_idx = new        # type: ignore[assignment]  # a plain int
        run._modules = type(run._modules)((str(n), blocks[o]) for n, o in enumerate(kept))
        config = _stack_config(module, path)
        if config is None or config.num_hidden_layers != len(blocks):
            continue
        config.num_hidden_layers = len(kept)
        for key, value in vars(config).items():
            if isinstance(value, list) and len(value) == len(blocks):
                setattr(config, key, [value[o] for o in kept])


def _stack_config(module: nn.Module, path: str) -> Any:
    """The config of the nearest module above `path` that has one counting its layers."""
    parts = path.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        owner = module.get_submodule(".".join(parts[:depth]))
        config = getattr(owner, "config", None)
        if isinstance(getattr(config, "num_hidden_layers", None), int):
            return config
    return None


def swap(module: nn.Module, groups: Sequence[Found], removal: Removal
         ) -> list[tuple[nn.Module, str, nn.Module]]:
    """Put a `Skipped` in place of every removed block; (parent, name, block) to put back."""
    undo = []
    for group in groups:
        if group.block and removal.get(group.root):
            parent_path, _, name = group.block.rpartition(".")
            parent = module.get_submodule(parent_path)
            block = parent.get_submodule(name)
            undo.append((parent, name, block))
            setattr(parent, name, skipped(block, group.returns))
    return undo


def block_returns(module: nn.Module, inputs: Any, paths: Sequence[str]) -> dict[str, int]:
    """How each block returns: 0 for a tensor, n for an n-tuple (one forward, hooked)."""
    seen: dict[str, int] = {}

    def hook(path: str) -> Any:
        def record(_module: nn.Module, _args: Any, out: Any) -> None:   # None: output kept
            seen.setdefault(path, len(out) if isinstance(out, tuple) else 0)
        return record

    handles = [module.get_submodule(p).register_forward_hook(hook(p)) for p in paths]
    try:
        with torch.no_grad():
            module(**inputs) if isinstance(inputs, Mapping) else module(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen
