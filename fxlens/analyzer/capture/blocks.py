"""Repeated blocks traced once: `torch.export` cost that grows with unique structure, not depth.

An 80-layer decoder is one or a few distinct blocks repeated. ``torch.export`` traces every
op of every layer through proxies and fake tensors, which is most of an inference capture's
time (10 of 20 s on llama-3-70b). Here the layers that are proven identical to an earlier
one are not traced: the earlier one's nodes are copied into their place, so the graph is the
one a full export gives, node for node (`tests/analyzer/test_blocks.py` compares both on the
zoo).

1. **Proof** (`find_repeats`; the fingerprints in `blocks_proof`): one forward on fake tensors
   at dispatch level, the mechanism FlopCounterMode uses, with every child of a
   ``ModuleList``/``Sequential`` that has a sibling of its class and submodules of its own
   wrapped (`candidates`). Each such block's fingerprint is its class, its parameter and buffer
   specs, its inputs (specs, structure, constants), and every aten call of its ``forward`` in
   order: the op, each tensor argument by *where it comes from* (the block's own input *i*, an
   earlier call's output, its own parameter by relative name, or one outside tensor by
   identity), every other argument's value, the outputs' specs and the user's source line. Two
   blocks with equal fingerprints run the same Python path on the same kinds of values, so they
   trace to the same nodes up to renaming. Never assumed from the class name: DeepSeek's first
   dense layers call other ops, a block reading another outside tensor (a flag picking another
   mask) differs; each becomes its own group. What a block is *given* is mapped, not compared:
   Gemma's sliding and global layers run the same code on the mask their caller hands each, so
   they are one group and every copy reads its own mask. A block that writes to anything but its
   own fresh tensors, is called twice, or returns something other than fresh tensors and
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
3. **Splice** (`blocks_splice.splice`): each stand-in is replaced by a copy of its
   representative's nodes, module paths renamed (``layers.0.`` → ``layers.5.``), the
   representative's inputs mapped to the member's, its parameters to the member's by relative
   name; the markers vanish. Anything unexpected (a lifted constant inside the block, a missing
   parameter, a marker out of place) raises `SpliceError` and the caller exports the whole model
   instead.

Only ``forward`` is wrapped, by an instance attribute removed afterwards (the model is left
as it was); hooks and ``__call__`` wrappers run and are traced for every member as usual.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.utils._pytree as pytree

from fxlens.analyzer.capture.blocks_proof import (
    Fingerprints,
    Group,
    Observe,
    made_leaves,
    standable,
    weights_of,
)
from fxlens.analyzer.capture.chatter import torch_chatter_to_debug_log
from fxlens.analyzer.capture.fake_runs import CpuFakeTensorMode, fake_cpu, module_state
from fxlens.analyzer.core.aten import dtype_name
from fxlens.analyzer.core.graph import TensorSpec

log = logging.getLogger(__name__)

CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)
NAMESPACE = "fxlens_blocks"
ENTER, EXIT, STAND_IN = (f"{NAMESPACE}.{op}.default" for op in ("enter", "exit", "stand_in"))


class SpliceError(Exception):
    """The traced graph is not what the proof expected: export the whole model instead."""


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
        tracker = Fingerprints({id(t): n for n, t in state.items()}, observe)
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
        key = (path.rpartition(".")[0], type(block), weights_of(block))
        by_key.setdefault(key, []).append(path)
    return Repeats(tuple(Group(tuple(paths)) for paths in by_key.values() if len(paths) > 1))


def _groups(tracker: Fingerprints) -> Repeats:
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
                spec, made = made_leaves(out)
                if not standable(made) or not any(leaf[0] == "tensor" for leaf in made):
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
