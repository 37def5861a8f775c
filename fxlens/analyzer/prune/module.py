"""The pruned module itself: every member's entries of the removed units sliced out, and each
module's size attributes fixed by the rules (``in_features``, ``out_channels``, head counts),
so it runs as a smaller ordinary ``nn.Module``; a removed residual block is replaced by a
`fxlens.analyzer.prune.blocks.Skipped` that returns its stream input (in the saved copy, a
block a cache addresses by number, a `transformers` layer, is taken out of its run instead:
`blocks.drop_indexed`).

`pruned_module` does it to a deep copy, for good; `removed` does it to the module itself for
the length of a ``with`` block and puts every tensor and attribute back after (no copy: the
calibrated importance forwards the model once per unit, `fxlens.analyzer.prune.calibrated`).

`save` writes it with ``torch.save``; a class or function of a model file fxlens loaded (under
its own module name while loading) is written by the file's name, so ``torch.load`` finds it
where the model file is importable, as for any pickled module.

`probe` checks that a removal runs at all before a group is offered: a forward may fix a width
the graph cannot see (``x.split(C)`` with ``C`` read from the residual stream while the
projection it splits was pruned). A group whose one-unit removal does not run, or changes the
outputs' shapes, is blocked with the error, never offered.

Known limitations: the copy holds real weights (a meta-device model is probed on meta
tensors, which a data-dependent forward cannot run).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import pickle
import types
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from fxlens.analyzer.capture.fx_convert import USER_MODULE_PREFIX
from fxlens.analyzer.prune.blocks import drop_indexed, exclusive, swap
from fxlens.analyzer.prune.groups import Found, entry_index
from fxlens.analyzer.prune.types import PruneKnowledge, Removal

_Undo = list[tuple[Any, str, str, Any]]    # (owner, "param" | "buffer" | "attr", name, old)


def pruned_module(module: nn.Module, groups: Sequence[Found], removal: Removal,
                  knowledge: PruneKnowledge) -> nn.Module:
    """A deep copy of `module` with `removal` (units by group root) sliced out."""
    pruned = copy.deepcopy(module)
    _apply(pruned, groups, removal, knowledge)
    drop_indexed(pruned)
    return pruned


@contextlib.contextmanager
def removed(module: nn.Module, groups: Sequence[Found], removal: Removal,
            knowledge: PruneKnowledge) -> Iterator[nn.Module]:
    """`module` itself with `removal` sliced out inside the block, restored after."""
    undo = _apply(module, groups, removal, knowledge)
    try:
        yield module
    finally:
        for owner, kind, name, old in reversed(undo):
            if kind == "param":
                owner._parameters[name] = old
            elif kind == "buffer":
                owner._buffers[name] = old
            else:
                setattr(owner, name, old)


def _apply(module: nn.Module, groups: Sequence[Found], removal: Removal,
           knowledge: PruneKnowledge) -> _Undo:
    """Slice the finer groups, fix sizes, then put identities in place of removed blocks
    (a block and the groups inside it are exclusive: `blocks.exclusive`)."""
    removal = exclusive(groups, removal)
    undo = _assign(module, _sliced(module, groups, removal))
    for child in module.modules():
        for attribute, value in knowledge.attribute_fixes(child).items():
            undo.append((child, "attr", attribute, getattr(child, attribute, None)))
            setattr(child, attribute, value)
    undo += [(parent, "attr", name, block) for parent, name, block
             in swap(module, groups, removal)]
    return undo


def _sliced(module: nn.Module, groups: Sequence[Found], removal: Removal
            ) -> dict[int, torch.Tensor]:
    """The sliced tensor of every member, by the original tensor's id."""
    drop: dict[tuple[str, int], set[int]] = defaultdict(set)
    for group in groups:
        if group.block:
            continue
        units = sorted(removal.get(group.root, ()))
        for m in group.members:
            drop[(m.param, m.dim)].update(entry_index(m, units))
    tensors = {**dict(module.named_parameters(remove_duplicate=False)),
               **dict(module.named_buffers(remove_duplicate=False))}
    sliced: dict[int, torch.Tensor] = {}
    for name in sorted({name for (name, _), gone in drop.items() if gone}):
        tensor = tensors[name]
        new = tensor.detach()
        for (param, dim), gone in drop.items():
            if param == name and gone:
                keep = [i for i in range(new.shape[dim]) if i not in gone]
                new = new.index_select(dim, torch.tensor(keep, device=new.device))
        sliced[id(tensor)] = new
    return sliced


def _assign(module: nn.Module, sliced: Mapping[int, torch.Tensor]) -> _Undo:
    """Put each sliced tensor under every name that held the original: one new parameter per
    original, so tied weights stay tied."""
    made: dict[int, nn.Parameter] = {}
    undo: _Undo = []
    for owner in module.modules():
        for name, param in list(owner._parameters.items()):
            if param is not None and id(param) in sliced:
                if id(param) not in made:
                    made[id(param)] = nn.Parameter(sliced[id(param)].clone(),
                                                   requires_grad=param.requires_grad)
                undo.append((owner, "param", name, param))
                owner._parameters[name] = made[id(param)]
        for name, buffer in list(owner._buffers.items()):
            if buffer is not None and id(buffer) in sliced:
                undo.append((owner, "buffer", name, buffer))
                owner._buffers[name] = sliced[id(buffer)]
    return undo


def save(module: nn.Module, path: Path) -> None:
    """``torch.save(module, path)``, a model file's classes named by the file (docstring)."""
    torch.save(module, path, pickle_module=_PICKLING)


class _ModuleByName:
    """Pickles as ``importlib.import_module(name)``."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _ModuleByName):
            return importlib.import_module, (obj.name,)
        module = getattr(obj, "__module__", None)
        if (isinstance(obj, (type, types.FunctionType)) and isinstance(module, str)
                and module.startswith(USER_MODULE_PREFIX) and "." not in obj.__qualname__):
            return getattr, (_ModuleByName(module.removeprefix(USER_MODULE_PREFIX)),
                             obj.__qualname__)
        return NotImplemented


_PICKLING = types.ModuleType("fxlens_pickling")
_PICKLING.__dict__.update({k: v for k, v in vars(pickle).items() if not k.startswith("__")})
_PICKLING.Pickler = _Pickler  # type: ignore[attr-defined]


def run(module: nn.Module, inputs: Any) -> list[tuple[int, ...]]:
    """The shapes of every tensor a forward returns."""
    with torch.no_grad():
        out = module(**inputs) if isinstance(inputs, Mapping) else module(*inputs)
    return [tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def probe(module: nn.Module, groups: Sequence[Found], inputs: Any,
          shapes: Sequence[tuple[int, ...]], knowledge: PruneKnowledge) -> dict[int, str]:
    """The groups (by root) whose one-unit removal fails to run or changes the outputs'
    shapes, with why. The finer groups are tried at once, then the blocks at once; only on
    failure one by one."""
    def fails(chosen: Sequence[Found]) -> str:
        removal = {g.root: frozenset({_least(g)}) for g in chosen}
        try:
            with removed(module, groups, removal, knowledge):
                got = run(module, inputs)
        except Exception as error:  # the user's forward: any error means "does not run"
            return f"the forward fails when pruned: {type(error).__name__}: {error}"[:200]
        return "" if got == list(shapes) else "the outputs change shape when pruned"

    failed: dict[int, str] = {}
    for batch in ([g for g in groups if not g.block], [g for g in groups if g.block]):
        if batch and fails(batch):     # blocks apart: a removed block hides its inner groups
            failed.update({g.root: why for g in batch if (why := fails([g]))})
    return failed


def _least(group: Found) -> int:
    values = group.importance or (0.0,) * group.units
    return min(range(group.units), key=lambda u: (values[u], u))
