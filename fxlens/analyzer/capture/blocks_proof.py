"""Step 1 of `fxlens.analyzer.capture.blocks` (its docstring has the whole scheme): the
fingerprint of every candidate block's forward, taken at dispatch level on fake tensors —
what each aten call reads (a block's own input, an earlier call's output, its own weight by
relative name, an outside tensor by identity), its other arguments' values, its outputs'
specs and source line — and the groups of blocks whose fingerprints are equal.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fxlens.analyzer.capture.fx_convert import innermost_user_frame

CONSTANTS = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout,
             torch.memory_format)

Leaf = tuple[Any, ...]   # where a tensor comes from, or a constant, as a hashable tuple
Observe = Callable[[Any, Any, Any, Any], None]   # (op, args, kwargs, what it returned)



@dataclass(frozen=True)
class Group:
    """Blocks proven identical: `members[0]` is traced, the others are copies of it.
    A guessed group (`guessed_repeats`) learns what it returns when its first block is
    traced."""

    members: tuple[str, ...]      # module paths, in call order
    returns: Any = None           # the pytree spec of what forward returns
    leaves: tuple[Leaf, ...] | None = None   # ("tensor", shape, stride, dtype) or constants

    @property
    def tensors(self) -> list[Leaf]:
        return [leaf for leaf in self.leaves or () if leaf[0] == "tensor"]



class _Identities:
    """A label per live tensor object, without keeping any alive (the same forward may
    measure eager memory): a dead tensor's id reused by a new one is not the old tensor."""

    def __init__(self) -> None:
        self._labels: dict[int, tuple[weakref.ref[torch.Tensor], Leaf]] = {}

    def get(self, tensor: torch.Tensor) -> Leaf | None:
        entry = self._labels.get(id(tensor))
        return entry[1] if entry is not None and entry[0]() is tensor else None

    def set(self, tensor: torch.Tensor, label: Leaf) -> None:
        self._labels[id(tensor)] = (weakref.ref(tensor), label)


@dataclass
class _Call:
    """One block's forward while it runs: its fingerprint so far."""

    path: str
    local: _Identities = field(default_factory=_Identities)   # ("in", i) / ("op", k, j)
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    valid: bool = True


class Fingerprints(TorchDispatchMode):
    """Fingerprints every wrapped block's forward (see the module docstring)."""

    def __init__(self, names: Mapping[int, str], observe: Observe | None = None) -> None:
        super().__init__()
        self._names = names                         # id(parameter or buffer) → qualified name
        self._observe = observe                     # an `Alongside`'s, called on every op
        self._outside = _Identities()               # ("outside", n): the n-th one seen
        self._seen = 0
        self.open: _Call | None = None
        self.keys: dict[str, tuple[Any, ...]] = {}
        self.outputs: dict[str, Group] = {}
        self.invalid: set[str] = set()
        self.order: list[str] = []

    # Higher-order ops (FlexAttention) come through here too, rather than failing the forward
    # (which left dynamo unable to export the model afterwards): a block that runs one is not
    # fingerprinted, so it is traced in full.
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            if self.open is not None:
                self.open.valid = False
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if self._observe is not None:
            self._observe(func, args, kwargs, out)
        call = self.open
        if call is None or not call.valid:
            return out
        written = _written(func, args, kwargs)
        leaves, spec = _flat(args, kwargs)
        where = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                origin = self._origin(call, leaf)
                if id(leaf) in written and origin[0] != "op":
                    call.valid = False          # writes to its input, a weight or the outside
                where.append(origin)
            else:
                where.append(_constant(leaf))
        outs = [t for t in _flat((out,), {})[0] if isinstance(t, torch.Tensor)]
        call.ops.append((str(func), spec, tuple(where), tuple(_spec(t) for t in outs),
                         innermost_user_frame()))
        for j, tensor in enumerate(outs):
            if call.local.get(tensor) is None:
                call.local.set(tensor, ("op", len(call.ops) - 1, j))
        return out

    def _origin(self, call: _Call, tensor: torch.Tensor) -> Leaf:
        local = call.local.get(tensor)
        if local is not None:
            return local
        name = self._names.get(id(tensor))
        if name is not None and name.startswith(call.path + "."):
            return ("own", name[len(call.path) + 1:])
        outside = self._outside.get(tensor)
        if outside is None:
            self._seen += 1
            outside = ("outside", self._seen)
            self._outside.set(tensor, outside)
        return outside

    def wrap(self, path: str, module: torch.nn.Module,
             forward: Callable[..., Any]) -> Callable[..., Any]:
        """`forward` fingerprinted as block `path`'s."""
        def fingerprinted(*args: Any, **kwargs: Any) -> Any:
            if self.open is not None:               # nested in another block: part of its ops
                return forward(*args, **kwargs)
            if path in self.keys or path in self.invalid:
                self.invalid.add(path)              # called twice: not one block
                self.keys.pop(path, None)
                return forward(*args, **kwargs)
            call = self.open = _Call(path)
            try:
                inputs = self._inputs(call, args, kwargs)
                out = forward(*args, **kwargs)
            finally:
                self.open = None
            self._close(call, module, inputs, out)
            return out
        return fingerprinted

    def _inputs(self, call: _Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Leaf:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        key = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                call.local.set(leaf, ("in", i))
                key.append(("tensor", _spec(leaf)))
            else:
                key.append(_constant(leaf))
        return (spec, tuple(key))

    def _close(self, call: _Call, module: torch.nn.Module, inputs: Leaf, out: Any) -> None:
        spec, made = made_leaves(out)
        returned = [call.local.get(leaf) or ("outside",) if isinstance(leaf, torch.Tensor)
                    else _constant(leaf) for leaf in pytree.tree_leaves(out)]
        # a stand-in returns only fresh tensors and constants
        call.valid &= standable(made) and all(r[0] in ("op", "constant") for r in returned)
        if not call.valid:
            self.invalid.add(call.path)
            return
        self.keys[call.path] = (type(module), weights_of(module), inputs, tuple(call.ops), spec,
                                tuple(returned))
        self.outputs[call.path] = Group((call.path,), spec, made)
        self.order.append(call.path)


def made_leaves(out: Any) -> tuple[Any, tuple[Leaf, ...]]:
    """What a block returned: its pytree spec, and each leaf as ("tensor", shape, stride,
    dtype) or as a constant, which is what a stand-in makes again."""
    leaves, spec = pytree.tree_flatten(out)
    return spec, tuple(("tensor", tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype)
                       if isinstance(leaf, torch.Tensor) else _constant(leaf) for leaf in leaves)


def standable(made: tuple[Leaf, ...]) -> bool:
    return bool(made) and not any(leaf[0] == "object" for leaf in made)


def weights_of(module: torch.nn.Module) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    return tuple((name, _spec(t)) for name, t in
                 (*module.named_parameters(), *module.named_buffers()))


def _spec(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.storage_offset(), t.requires_grad)


def _constant(value: Any) -> Leaf:
    if isinstance(value, CONSTANTS):
        return ("constant", value)
    return ("object", id(value))     # the same object for two blocks, or no proof


def _flat(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], Leaf]:
    """An aten call's arguments as leaves and a hashable structure: what ``tree_flatten``
    gives, for the only containers aten arguments have (lists and tuples), at a fraction of
    its cost on every op of a forward."""
    leaves: list[Any] = []
    shape: list[Any] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            inner, structure = _flat(value, {})
            leaves.extend(inner)
            shape.append(structure)
        else:
            leaves.append(value)
            shape.append(None)
    return leaves, (tuple(shape), tuple(kwargs))


def _written(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> set[int]:
    """Ids of the tensors `func` writes to (in-place and ``out=`` arguments)."""
    written: set[int] = set()
    for i, name in _writable(func):
        value = args[i] if i < len(args) else kwargs.get(name)
        written.update(id(t) for t in _flat((value,), {})[0] if isinstance(t, torch.Tensor))
    return written


@functools.cache
def _writable(func: Any) -> tuple[tuple[int, str], ...]:
    """Positions and names of the arguments `func`'s schema says it writes to."""
    return tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


