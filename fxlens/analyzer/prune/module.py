"""The pruned module itself: a deep copy with every member's entries of the removed units
sliced out, and each module's size attributes fixed by the rules (``in_features``,
``out_channels``, head counts), so it runs as a smaller ordinary ``nn.Module``.

`probe` checks that a removal runs at all before a group is offered: a forward may fix a width
the graph cannot see (``x.split(C)`` with ``C`` read from the residual stream while the
projection it splits was pruned). A group whose one-unit removal does not run, or changes the
outputs' shapes, is blocked with the error, never offered.

Known limitations: the copy holds real weights (a meta-device model is probed on meta
tensors, which a data-dependent forward cannot run).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from fxlens.analyzer.prune.groups import Found, entry_index
from fxlens.analyzer.prune.types import PruneKnowledge


def pruned_module(module: nn.Module, groups: Sequence[Found],
                  removed: Mapping[int, frozenset[int]], knowledge: PruneKnowledge) -> nn.Module:
    """A deep copy of `module` with `removed` units (by group root) sliced out."""
    pruned = copy.deepcopy(module)
    drop: dict[tuple[str, int], set[int]] = defaultdict(set)
    for group in groups:
        units = sorted(removed.get(group.root, ()))
        for m in group.members:
            drop[(m.param, m.dim)].update(entry_index(m, units))
    tensors = {**dict(pruned.named_parameters(remove_duplicate=False)),
               **dict(pruned.named_buffers(remove_duplicate=False))}
    sliced: dict[int, torch.Tensor] = {}
    for name in sorted({name for name, _ in drop}):
        tensor = tensors[name]
        new = tensor.detach()
        for (param, dim), gone in drop.items():
            if param == name and gone:
                keep = [i for i in range(new.shape[dim]) if i not in gone]
                new = new.index_select(dim, torch.tensor(keep, device=new.device))
        sliced[id(tensor)] = new
    _assign(pruned, sliced)
    for child in pruned.modules():
        for attribute, value in knowledge.attribute_fixes(child).items():
            setattr(child, attribute, value)
    return pruned


def _assign(module: nn.Module, sliced: Mapping[int, torch.Tensor]) -> None:
    """Put each sliced tensor back under every name that held the original: one new
    parameter per original, so tied weights stay tied."""
    made: dict[int, nn.Parameter] = {}
    for owner in module.modules():
        for name, param in list(owner._parameters.items()):
            if param is not None and id(param) in sliced:
                if id(param) not in made:
                    made[id(param)] = nn.Parameter(sliced[id(param)].clone(),
                                                   requires_grad=param.requires_grad)
                owner._parameters[name] = made[id(param)]
        for name, buffer in list(owner._buffers.items()):
            if buffer is not None and id(buffer) in sliced:
                owner._buffers[name] = sliced[id(buffer)]


def run(module: nn.Module, inputs: Any) -> list[tuple[int, ...]]:
    """The shapes of every tensor a forward returns."""
    with torch.no_grad():
        out = module(**inputs) if isinstance(inputs, Mapping) else module(*inputs)
    return [tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def probe(build: Callable[[Mapping[int, frozenset[int]]], nn.Module], inputs: Any,
          shapes: Sequence[tuple[int, ...]], groups: Sequence[Found]) -> dict[int, str]:
    """The groups (by root) whose one-unit removal fails to run or changes the outputs'
    shapes, with why. All groups are tried at once first; only on failure one by one."""
    def fails(chosen: Sequence[Found]) -> str:
        removal = {g.root: frozenset({_least(g)}) for g in chosen}
        try:
            got = run(build(removal), inputs)
        except Exception as error:  # the user's forward: any error means "does not run"
            return f"the forward fails when pruned: {type(error).__name__}: {error}"[:200]
        return "" if got == list(shapes) else "the outputs change shape when pruned"

    if not groups or not fails(groups):
        return {}
    return {g.root: why for g in groups if (why := fails([g]))}


def _least(group: Found) -> int:
    values = group.importance or (0.0,) * group.units
    return min(range(group.units), key=lambda u: (values[u], u))
