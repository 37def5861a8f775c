"""Repeated blocks traced once: `torch.export` cost that grows with unique structure, not depth.

An 80-layer decoder is one or a few distinct blocks repeated. ``torch.export`` traces every
op of every layer through proxies and fake tensors, which is most of an inference capture's
time (10 of 20 s on llama-3-70b). Here the layers that are proven identical to an earlier
one are not traced: the earlier one's nodes are copied into their place, so the graph is the
one a full export gives, node for node (`tests/analyzer/test_blocks.py` compares both on the
zoo).

1. **Proof** (`find_repeats`): one forward on fake tensors at dispatch level, the mechanism
   FlopCounterMode uses, with every child of a ``ModuleList``/``Sequential`` that has a
   sibling of its class and submodules of its own wrapped (`candidates`). Each such block's
   fingerprint is its class, its parameter and buffer specs, its inputs (specs, structure,
   constants), and every aten call of its ``forward`` in order: the op, each tensor argument
   by *where it comes from* (the block's own input *i*, an earlier call's output, its own
   parameter by relative name, or one outside tensor by identity), every other argument's
   value, the outputs' specs and the user's source line. Two blocks with equal fingerprints
   run the same Python path on the same kinds of values, so they trace to the same nodes up
   to renaming. Never assumed from the class name: DeepSeek's first dense layers call other
   ops, a block reading another outside tensor (a flag picking another mask) differs; each
   becomes its own group. What a block is *given* is mapped, not compared: Gemma's sliding
   and global layers run the same code on the mask their caller hands each, so they are one
   group and every copy reads its own mask. A block that writes to anything but its own
   fresh tensors, is called twice, or returns something other than fresh tensors and
   constants is traced like any other module. The eager memory simulation rides along this
   forward (`Alongside`), so the model runs on fake tensors once for both.
2. **Trace** (`standing_in`): the first block of each group is traced with two marker ops
   around its ``forward`` (``fxlens_blocks.enter`` on its tensor inputs, ``.exit`` on its
   tensor outputs) that delimit its nodes and name its inputs; every other member's
   ``forward`` becomes one ``fxlens_blocks.stand_in`` node, taking that member's tensor inputs
   and returning fake tensors with the outputs' specs. The trace may also start before the
   proof ends, on groups guessed from structure (`guessed_repeats`): each guessed group
   learns its outputs' specs from its first block, and the caller keeps that trace only if
   the proof's groups, outputs included, are the same.
3. **Splice** (`splice`): each stand-in is replaced by a copy of its representative's nodes,
   module paths renamed (``layers.0.`` → ``layers.5.``), the representative's inputs mapped
   to the member's, its parameters to the member's by relative name; the markers vanish.
   Anything unexpected (a lifted constant inside the block, a missing parameter, a marker
   out of place) raises `SpliceError` and the caller exports the whole model instead.

Only ``forward`` is wrapped, by an instance attribute removed afterwards (the model is left
as it was); hooks and ``__call__`` wrappers run and are traced for every member as usual.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fxlens.analyzer.capture.chatter import torch_chatter_to_debug_log
from fxlens.analyzer.capture.fake_runs import CpuFakeTensorMode, fake_cpu, module_state
from fxlens.analyzer.capture.fx_convert import innermost_user_frame
from fxlens.analyzer.core.aten import dtype_name
from fxlens.analyzer.core.graph import Node, NodeKind, TensorRef, TensorSpec, map_refs

log = logging.getLogger(__name__)

CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)
CONSTANTS = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout,
             torch.memory_format)
NAMESPACE = "fxlens_blocks"
ENTER, EXIT, STAND_IN = (f"{NAMESPACE}.{op}.default" for op in ("enter", "exit", "stand_in"))


Leaf = tuple[Any, ...]   # where a tensor comes from, or a constant, as a hashable tuple
Observe = Callable[[Any, Any, Any, Any], None]   # (op, args, kwargs, what it returned)


class SpliceError(Exception):
    """The traced graph is not what the proof expected: export the whole model instead."""


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


# --- 1. the proof ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Repeats:
    groups: tuple[Group, ...] = ()
    outputs: tuple[tuple[tuple[int, ...], str], ...] = ()   # the model's tensor outputs

    def check_outputs(self, specs: Sequence[TensorSpec | None]) -> None:
        """The spliced graph returns what the proof's forward returned: a block with a Python
        side effect that reaches the model's outputs (a cache object it appends to) returns
        fewer tensors when stood in for."""
        got = tuple((s.shape, s.dtype) if s is not None else None for s in specs)
        if got != self.outputs:
            raise SpliceError(f"the model returns {len(got)} tensors with blocks stood in "
                              f"for, {len(self.outputs)} when run")

    @property
    def copies(self) -> int:
        return sum(len(g.members) - 1 for g in self.groups)


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


class _Fingerprints(TorchDispatchMode):
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
        spec, made = _made(out)
        returned = [call.local.get(leaf) or ("outside",) if isinstance(leaf, torch.Tensor)
                    else _constant(leaf) for leaf in pytree.tree_leaves(out)]
        # a stand-in returns only fresh tensors and constants
        call.valid &= _standable(made) and all(r[0] in ("op", "constant") for r in returned)
        if not call.valid:
            self.invalid.add(call.path)
            return
        self.keys[call.path] = (type(module), _weights(module), inputs, tuple(call.ops), spec,
                                tuple(returned))
        self.outputs[call.path] = Group((call.path,), spec, made)
        self.order.append(call.path)


def _made(out: Any) -> tuple[Any, tuple[Leaf, ...]]:
    """What a block returned: its pytree spec, and each leaf as ("tensor", shape, stride,
    dtype) or as a constant, which is what a stand-in makes again."""
    leaves, spec = pytree.tree_flatten(out)
    return spec, tuple(("tensor", tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype)
                       if isinstance(leaf, torch.Tensor) else _constant(leaf) for leaf in leaves)


def _standable(made: tuple[Leaf, ...]) -> bool:
    return bool(made) and not any(leaf[0] == "object" for leaf in made)


def _weights(module: torch.nn.Module) -> tuple[tuple[str, tuple[Any, ...]], ...]:
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


def candidates(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Children of containers that have a sibling of their own class and are made of modules
    themselves, by path. A lone layer (a ``Linear`` in a ``Sequential``) is one op or two:
    standing in for it costs export as much as tracing it, so it is traced."""
    found: dict[str, torch.nn.Module] = {}
    for path, container in module.named_modules():
        if not isinstance(container, CONTAINERS):
            continue
        children = list(container.named_children())
        classes = Counter(type(child) for _, child in children)
        for name, child in children:
            if classes[type(child)] > 1 and next(child.children(), None) is not None:
                found[f"{path}.{name}" if path else name] = child
    return found


class Alongside(Protocol):
    """Another observer of the proof's fake forward (the eager memory simulation), so the
    model runs once for both: `start` gives what to call with each op call (function,
    arguments, keyword arguments, what it returned) from the proof's own dispatch mode (a
    second mode would cost each op a second trip through Python dispatch); `finish` is
    called if the forward completed."""

    def start(self, state: dict[str, torch.Tensor], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Observe: ...

    def finish(self) -> None: ...


def find_repeats(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 alongside: Alongside | None = None) -> Repeats:
    """Groups of blocks proven identical by one forward on fake tensors (no weights, no
    compute, inference mode); none when no container holds two blocks of a class or when the
    forward cannot run on fake tensors."""
    blocks = candidates(module)
    if len(blocks) < 2:
        return Repeats()
    try:
        with torch_chatter_to_debug_log(), CpuFakeTensorMode(allow_non_fake_inputs=True) as mode:
            state, fake_args, fake_kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: fake_cpu(t, mode), (module_state(module), args, kwargs))
        observe = (alongside.start(state, fake_args, fake_kwargs) if alongside is not None
                   else None)
        tracker = _Fingerprints({id(t): n for n, t in state.items()}, observe)
        wrappers = {p: functools.partial(tracker.wrap, p, m) for p, m in blocks.items()}
        with contextlib.ExitStack() as stack:
            for context in (torch_chatter_to_debug_log(), mode, torch.no_grad(),
                            forwards_replaced(blocks, wrappers), tracker):
                stack.enter_context(context)
            out = torch.func.functional_call(module, state, fake_args, fake_kwargs)
    except Exception as error:  # the export below reports what is wrong with the model
        log.info("no repeated blocks: the fingerprinting forward failed (%s)", error)
        return Repeats()
    if alongside is not None:
        alongside.finish()
    returned = tuple((tuple(t.shape), dtype_name(t.dtype)) for t in pytree.tree_leaves(out)
                     if isinstance(t, torch.Tensor))
    return replace(_groups(tracker), outputs=returned)


def guessed_repeats(module: torch.nn.Module) -> Repeats:
    """The groups the proof most likely finds, from structure alone: candidates of one
    container with the same class and weight specs, in container order. Only a guess, made
    so that the trace can start before the proof ends (`fxlens.analyzer.capture.chain`): a
    trace made with it is used only when the proof's groups turn out to be exactly these."""
    by_key: dict[tuple[Any, ...], list[str]] = {}
    for path, block in candidates(module).items():
        key = (path.rpartition(".")[0], type(block), _weights(block))
        by_key.setdefault(key, []).append(path)
    return Repeats(tuple(Group(tuple(paths)) for paths in by_key.values() if len(paths) > 1))


def _groups(tracker: _Fingerprints) -> Repeats:
    by_key: dict[tuple[str, tuple[Any, ...]], list[str]] = {}
    for path in tracker.order:
        if path in tracker.keys:
            container = path.rpartition(".")[0]
            by_key.setdefault((container, tracker.keys[path]), []).append(path)
    return Repeats(tuple(Group(tuple(paths), tracker.outputs[paths[0]].returns,
                               tracker.outputs[paths[0]].leaves)
                         for paths in by_key.values() if len(paths) > 1))


@contextlib.contextmanager
def forwards_replaced(
    blocks: Mapping[str, torch.nn.Module],
    wrappers: Mapping[str, Callable[[Callable[..., Any]], Callable[..., Any]]],
) -> Iterator[None]:
    """Each block's ``forward`` replaced by ``wrappers[path](forward)`` (an instance
    attribute), put back as it was afterwards."""
    saved: list[tuple[torch.nn.Module, Any]] = []
    try:
        for path, wrap in wrappers.items():
            module = blocks[path]
            saved.append((module, module.__dict__.get("forward")))
            module.forward = wrap(module.forward)
        yield
    finally:
        for module, before in saved:
            if before is None:
                del module.forward
            else:
                module.forward = before


# --- 2. the trace ----------------------------------------------------------------------------

_LIBRARY = torch.library.Library(NAMESPACE, "DEF")
_LIBRARY.define("enter(Tensor[] xs, int block) -> Tensor[]")
_LIBRARY.define("exit(Tensor[] xs, int block) -> Tensor[]")
_LIBRARY.define("stand_in(Tensor[] xs, int block, int member) -> Tensor[]")
_STAND_IN_OUTPUTS: dict[int, Group] = {}     # block → its group, while `standing_in` runs
_STAND_IN_DEVICES: dict[tuple[int, int], torch.device] = {}   # (block, member) → its weights'


def _like(xs: Sequence[torch.Tensor], block: int) -> list[torch.Tensor]:
    return [x.new_empty_strided(x.shape, x.stride()) for x in xs]


def _stand_in_outputs(xs: Sequence[torch.Tensor], block: int, member: int
                      ) -> list[torch.Tensor]:
    # NB: the proof ran on fake CPU tensors, so the outputs' device is not in the fingerprint:
    # a block's outputs live where its weights do (its first input may be CPU positions).
    device = _STAND_IN_DEVICES.get((block, member), xs[0].device)
    return [torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for _, shape, stride, dtype in _STAND_IN_OUTPUTS[block].tensors]


torch.library.register_fake(f"{NAMESPACE}::enter", _like, lib=_LIBRARY)
torch.library.register_fake(f"{NAMESPACE}::exit", _like, lib=_LIBRARY)
torch.library.register_fake(f"{NAMESPACE}::stand_in", _stand_in_outputs, lib=_LIBRARY)


@contextlib.contextmanager
def standing_in(module: torch.nn.Module, repeats: Repeats) -> Iterator[list[Group]]:
    """While tracing: each group's first block between markers, the others stand-ins. Yields
    a list filled on the way out with the groups as traced: a guessed group with what its
    first block returned."""
    blocks = dict(module.named_modules())
    ops = getattr(torch.ops, NAMESPACE)
    wrappers: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {}
    for block, group in enumerate(repeats.groups):
        if group.leaves is not None and not group.tensors:
            continue
        _STAND_IN_OUTPUTS[block] = group
        wrappers[group.members[0]] = _between_markers(ops, block)
        for member in range(1, len(group.members)):
            wrappers[group.members[member]] = _stand_in(ops, block, member)
            weight = next(itertools.chain(blocks[group.members[member]].parameters(),
                                          blocks[group.members[member]].buffers()), None)
            if weight is not None:
                _STAND_IN_DEVICES[(block, member)] = weight.device
    traced: list[Group] = []
    try:
        with forwards_replaced(blocks, wrappers):
            yield traced
        traced += [_STAND_IN_OUTPUTS.get(block, group)
                   for block, group in enumerate(repeats.groups)]
    finally:
        _STAND_IN_OUTPUTS.clear()
        _STAND_IN_DEVICES.clear()


def _between_markers(ops: Any, block: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        def traced(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = _through(ops.enter, (args, kwargs), block)
            out = forward(*args, **kwargs)
            group = _STAND_IN_OUTPUTS[block]
            if group.leaves is None:                 # a guess: learn what the block returns
                spec, made = _made(out)
                if not _standable(made) or not any(leaf[0] == "tensor" for leaf in made):
                    raise SpliceError(f"{group.members[0]} returns nothing a stand-in makes")
                _STAND_IN_OUTPUTS[block] = replace(group, returns=spec, leaves=made)
            return _through(ops.exit, out, block)
        return traced
    return wrap


def _stand_in(ops: Any, block: int, member: int
              ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        def stand_in(*args: Any, **kwargs: Any) -> Any:
            group = _STAND_IN_OUTPUTS[block]
            if group.leaves is None:
                raise SpliceError(f"{group.members[member]} runs before {group.members[0]}")
            inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if not inputs:
                raise SpliceError("a repeated block without tensor inputs")
            made = iter(ops.stand_in(inputs, block, member))
            leaves = [next(made) if leaf[0] == "tensor" else leaf[1] for leaf in group.leaves]
            return pytree.tree_unflatten(leaves, group.returns)
        return stand_in
    return wrap


def _through(op: Any, value: Any, block: int) -> Any:
    """`value` with its tensor leaves replaced by `op`'s outputs on them."""
    leaves, spec = pytree.tree_flatten(value)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not tensors:
        return value
    made = iter(op(tensors, block))
    return pytree.tree_unflatten(
        [next(made) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)


# --- 3. the splice ---------------------------------------------------------------------------

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

