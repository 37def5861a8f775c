"""Repeated blocks of the training step recorded once: a step whose cost grows with its forward.

Recording the step (`fxlens.analyzer.capture.training`) runs every op of the forward and of
the backward through fake tensors, and the backward is most of it (FlopCounterMode's
backward takes 1.0 of its 1.8 s on Llama-2-7B at 2,048 tokens). Here the block that a
repeated block is proven identical to is recorded in full, and the repeated block's forward
and backward are copies of its nodes, renamed; its backward is never run.

- **Groups** are guessed from structure (`blocks.guessed_repeats`: one container, one class,
  the same weight specs, requires_grad included); none where a module backward hook may
  run (it would see a stand-in's gradients). A group's first block runs as it is. If the
  second reads an input needing grad that the first read too (a decoder's encoder states,
  T5's position bias: gradients summed into one tensor from several blocks would be summed
  at other points), the group runs as it is; else the second is recorded in full between
  two identity functions (`_Mark`, no op of their own) that note the gradients coming into
  its outputs and going out to its inputs.
- **Members.** Each block after that runs its forward once inside one autograd function,
  `_StandIn`, with grad on as a block recorded in full runs (autograd's replay of a view
  after an in-place write into it is an op of the forward: DeepSeek-V3's keys assembled in
  two slices) and the inner graph thrown away, nothing of it saved for the step. Its forward
  nodes are recorded, compared, then dropped: one placeholder node stands for them, and one
  more for its backward, whose outputs are fresh gradients for the block's inputs.
- **Proof.** A member is a copy only if its forward recorded a full block's nodes op for op:
  the same targets; the same arguments by where they come from (the block's input *i*, its
  own op *k*, its own weight by relative name, or the same outside tensor); the same output
  specs, relative module paths and source lines; the same inputs and outputs requiring grad.
  Autograd builds the backward from those nodes alone, so the member's backward is the full
  block's up to renaming. A member that matches no full block of its group (another op on a
  flag, a path taken on data) is recorded in full itself, and later members may match it
  (sliding and global attention alternating). A group with `MAX_MISSES` such members runs
  as it is from then on.
- **Splice** (`StandIns.finish`, `step_splice.StepSplice`): each placeholder becomes a copy
  of its full block's nodes, the backward's being one contiguous run of nodes under its
  path; the copies read the member's inputs, weights and incoming gradients, and the
  member's weight gradients are the copy's.
- **Anything else that would differ from the full recording raises `Unstandable`**: a
  block reading an input needing grad that a marked or stood-in block read, an op that
  autograd runs for a stand-in or a mark (a gradient summed into a tensor that other code
  reads too: the recorder's `NotRecordable`), a block called twice (activation
  checkpointing runs it again), a full block whose backward is not one run of its own nodes,
  a gradient the placeholder made with another spec than the copy's, a reference the copy
  cannot map. The step is then recorded again without stand-ins
  (`training.capture_training`), so the graph is always the full recording's;
  `tests/analyzer/test_step_blocks.py` compares both on the zoo and on blocks that differ.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from fxlens.analyzer.capture.blocks import Group, forwards_replaced, guessed_repeats
from fxlens.analyzer.capture.blocks_splice import moved
from fxlens.analyzer.capture.recorder import Recorder
from fxlens.analyzer.capture.step_splice import (
    BACKWARD,
    FORWARD,
    BlockForward,
    FirstBlock,
    MemberBlock,
    Recorded,
    StepSplice,
    Unstandable,
    own_name,
    under,
)
from fxlens.analyzer.core.graph import Node, TensorRef, map_refs

log = logging.getLogger(__name__)

# A member that matches none of its group's blocks recorded in full is recorded in full too,
# and later members may match it (sliding and global attention layers alternating). A group
# with this many such members (a path chosen on data: MoE routing) is recorded in full from
# then on: each of them ran its forward twice.
MAX_MISSES = 3


class _Call:
    """A block's forward about to run: its arguments, tensor inputs and record so far."""

    def __init__(self, forward: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], recorder: Recorder, path: str) -> None:
        self.forward, self.args, self.kwargs = forward, args, kwargs
        self.tensors = [t for t in pytree.tree_leaves((args, kwargs))
                        if isinstance(t, torch.Tensor)]
        self.record = BlockForward(path, len(recorder.nodes), 0,
                               tuple(recorder.peek(t) for t in self.tensors),
                               tuple(i for i, t in enumerate(self.tensors) if t.requires_grad))
        self.sources = [self.record.inputs[i] for i in self.record.grad_inputs]


class StandIns:
    """Stand-ins for the repeated blocks of one recording of the step (module docstring)."""

    def __init__(self, module: torch.nn.Module, recorder: Recorder, saved: list[TensorRef],
                 state: Mapping[str, torch.Tensor]) -> None:
        self._recorder = recorder
        self._saved = saved
        self._state = state
        # Each weight's node, before any op writes into it (BatchNorm's statistics in train
        # mode): a copy reads the member's weights as its own forward would have found them.
        self._weights = {name: recorder.peek(tensor) for name, tensor in state.items()}
        self._groups: tuple[Group, ...] = (() if _backward_hooks(module)
                                            else guessed_repeats(module).groups)
        self._blocks = dict(module.named_modules())
        self._firsts: dict[int, list[FirstBlock]] = {}    # each group's blocks recorded in full
        self._members: list[MemberBlock] = []
        self._misses: Counter[int] = Counter()        # members of a group that differed
        self._observed: set[int] = set()              # groups whose first block has run
        self._broken: set[int] = set()
        self._called: set[str] = set()
        self._stood_sources: set[TensorRef] = set()  # inputs needing grad, of firsts and members
        self._plain_sources: set[TensorRef] = set()  # and of the blocks that ran as they are
        self._open = False

    def installed(self) -> contextlib.AbstractContextManager[None]:
        """Every grouped block's ``forward`` wrapped (an instance attribute), put back after."""
        wrappers = {path: self._wrapper(g, path)
                    for g, group in enumerate(self._groups) for path in group.members}
        return forwards_replaced(self._blocks, wrappers)

    def _wrapper(self, group: int, path: str
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return lambda forward: functools.partial(self._run, group, path, forward)

    # --- the forward -----------------------------------------------------------------------

    def _run(self, group: int, path: str, forward: Callable[..., Any], *args: Any,
             **kwargs: Any) -> Any:
        if self._open:                        # nested in a block: one of its ops
            return forward(*args, **kwargs)
        if path in self._called:
            raise Unstandable(f"{path} ran twice (recomputed by activation checkpointing?)")
        self._called.add(path)
        self._open = True
        try:
            call = _Call(forward, args, kwargs, self._recorder, path)
            if any(s in self._stood_sources for s in call.sources):
                raise Unstandable(f"{path} reads an input needing grad that a block stood "
                                  "in for or marked reads too")
            if group not in self._observed:      # a group's first block runs as it is
                self._observed.add(group)
            elif group not in self._broken:
                if None in call.sources or any(s in self._plain_sources for s in call.sources):
                    self._broken.add(group)
                elif self._firsts.get(group):
                    return self._member(group, call)
                else:
                    return self._first(group, call)
            return self._plain(call)
        finally:
            self._open = False

    def _plain(self, call: _Call) -> Any:
        self._plain_sources.update(s for s in call.sources if s is not None)
        return call.forward(*call.args, **call.kwargs)

    def _first(self, group: int, call: _Call) -> Any:
        tensors, record = call.tensors, call.record
        self._stood_sources.update(s for s in call.sources if s is not None)
        grads_out: dict[int, TensorRef | None] = {}
        marked = self._mark(grads_out, [tensors[i] for i in record.grad_inputs], inputs=True)
        args, kwargs = _replace_leaves((call.args, call.kwargs), dict(zip(
            (id(tensors[i]) for i in record.grad_inputs), marked, strict=True)))
        saved_at = len(self._saved)
        out = call.forward(*args, **kwargs)
        record.end = len(self._recorder.nodes)
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        refs = [self._recorder.peek(t) for t in outputs]
        if None in refs:
            self._broken.add(group)
            return out
        first = FirstBlock(
            record, self._key(record), self._returned(record, out),
            tuple(r for r in refs if r is not None), tuple(t.requires_grad for t in outputs),
            tuple(self._saved[saved_at:]), grads_out=grads_out)
        self._firsts.setdefault(group, []).append(first)
        needing = [t for t in outputs if t.requires_grad]
        marked = self._mark(first.grads_in, needing, inputs=False)
        return _replace_leaves(out, dict(zip(map(id, needing), marked, strict=True)))

    def _mark(self, seen: dict[int, TensorRef | None], tensors: list[torch.Tensor],
              inputs: bool) -> list[torch.Tensor]:
        if not tensors:
            return []
        with self._recorder.quiet():
            marked = list(_Mark.apply(self, seen, inputs, *tensors))
        for tensor, mark in zip(tensors, marked, strict=True):
            self._recorder.alias(mark, tensor)
        return marked

    def _member(self, group: int, call: _Call) -> Any:
        tensors, record = call.tensors, call.record
        firsts = [f for f in self._firsts[group] if f.forward.grad_inputs == record.grad_inputs]
        if not firsts:               # no full block has this one's inputs needing grad
            return self._first(group, call)
        mark = self._recorder.mark()
        grad_tensors = [tensors[i] for i in record.grad_inputs]
        box: dict[str, Any] = {}
        output_grads = firsts[0].output_grads
        made = _StandIn.apply(self, len(self._members), box, call.forward, call.args,
                              call.kwargs, output_grads, *grad_tensors)
        record.end = len(self._recorder.nodes)
        key, returned = self._key(record), self._returned(record, box["out"])
        # Outputs need grad only through the inputs handed to the stand-in: a block that
        # reads none needing grad but has weights that do is recorded in full.
        needs = tuple(t.requires_grad for t in made)
        first = next((f for f in firsts if f.key == key and f.returned == returned
                      and f.output_grads == output_grads == needs), None)
        if first is None:
            self._recorder.truncate(mark, poison=False)      # and recorded in full
            self._misses[group] += 1
            if self._misses[group] >= MAX_MISSES:
                self._broken.add(group)
                return self._plain(call)
            return self._first(group, call)
        self._recorder.truncate(mark, poison=True)           # a copy of the first's instead
        self._recorder.placeholder(FORWARD, {"inputs": list(record.inputs),
                                             "member": len(self._members)}, made)
        self._stood_sources.update(s for s in call.sources if s is not None)
        self._members.append(MemberBlock(record, first, len(self._saved), tuple(
            (tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in grad_tensors)))
        return _replace_leaves(box["out"], dict(zip(
            (id(t) for t in box["outputs"]), made, strict=True)))

    def _relative(self, record: BlockForward) -> Callable[[TensorRef], Any]:
        """Where a ref in `record`'s nodes comes from, as its fingerprint says it."""
        nodes, path = self._recorder.nodes, record.path
        inputs: dict[TensorRef, int] = {}
        for i, ref in enumerate(record.inputs):
            if ref is not None:
                inputs.setdefault(ref, i)

        def where(ref: TensorRef) -> Any:
            if record.start <= ref.node < record.end:
                return ("op", ref.node - record.start, ref.index)
            if ref in inputs:
                return ("in", inputs[ref])
            own = own_name(nodes[ref.node], path)
            return ("own", own) if own is not None else ("outside", ref)
        return where

    def _key(self, record: BlockForward) -> list[Any]:
        """The block's forward, as the proof compares it."""
        where = self._relative(record)
        return [(n.kind, n.target, map_refs(n.args, where), n.outputs,
                 moved(n.module, record.path, "<block>"), n.module_type, n.source)
                for n in self._recorder.nodes[record.start:record.end]]

    def _returned(self, record: BlockForward, out: Any) -> tuple[Any, ...]:
        where = self._relative(record)
        leaves, spec = pytree.tree_flatten(out)
        made: list[tuple[Any, ...]] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                ref = self._recorder.peek(leaf)
                made.append(("tensor", where(ref) if ref is not None else None))
            else:
                made.append(("value", type(leaf), leaf if _plain(leaf) else id(leaf)))
        return (spec, tuple(made))

    # --- the backward ----------------------------------------------------------------------

    def placeholder(self, member: int, grads: Sequence[torch.Tensor | None]
                    ) -> list[torch.Tensor]:
        """The member's backward: one node making fresh gradients for its inputs."""
        refs = [self._recorder.peek(g) if g is not None else None for g in grads]
        if any(r is None for r, g in zip(refs, grads, strict=True) if g is not None):
            raise Unstandable("a gradient reaching a stand-in was never recorded")
        with self._recorder.quiet():
            made = [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                    for shape, stride, dtype, device in self._members[member].grad_specs]
        self._recorder.placeholder(BACKWARD, {"grads": refs, "member": member}, made)
        return made

    # --- the splice ------------------------------------------------------------------------

    def finish(self, outputs: Sequence[TensorRef] = ()
               ) -> tuple[list[Node], list[TensorRef], dict[str, TensorRef],
                          list[TensorRef]] | None:
        """The recorded nodes with every placeholder replaced by a copy of its first block's
        nodes, the saved tensors, the gradient of every weight that has one, by name, and
        `outputs` (recorded refs) as refs of those nodes; None where no block was stood in
        for (the recording is the full one)."""
        recorder = self._recorder
        if not self._members:
            return None
        grads = {name: recorder.peek(t.grad) for name, t in self._state.items()
                 if t.grad is not None}
        recorded = Recorded(recorder.nodes, self._members, self._state, self._weights,
                            recorder.peek)
        splice = StepSplice(recorded, {m.first.forward.path: self._region(m.first)
                                       for m in self._members})
        for node in recorder.nodes:
            splice.add(node)
        saved = [splice.fix(ref) for ref in self._saved]
        for member in reversed(self._members):
            saved[member.saved_at:member.saved_at] = splice.saved[member.forward.path]
        for name, ref in grads.items():
            if ref is None:
                raise Unstandable(f"{name}'s gradient was never recorded")
            splice.grads.setdefault(name, splice.fix(ref))
        log.info("the step's backward of %d repeated blocks is copied from the first block of "
                 "their group", len(self._members))
        return splice.out, saved, splice.grads, [splice.fix(ref) for ref in outputs]

    def _region(self, first: FirstBlock) -> range:
        """The first block's backward: one contiguous run of nodes under its path."""
        path = first.forward.path
        inside = [n.id for n in self._recorder.nodes
                  if n.phase == "backward" and under(n.module, path) is not None]
        if not inside or inside[-1] - inside[0] + 1 != len(inside):
            raise Unstandable(f"{path}'s backward is not one run of its own nodes")
        return range(inside[0], inside[-1] + 1)


class _Mark(torch.autograd.Function):
    """Identity on tensors, noting the gradients that pass back through it. On a block's
    inputs it returns views, so a block that writes into its input fails and the step is
    recorded in full (the caller would read what it wrote); on its outputs it returns
    aliases that are not views, which the caller may write into (ResNet's ``hidden_state +=
    residual``), as it may into what a full block returns."""

    @staticmethod
    def forward(ctx: Any, stand_ins: StandIns, seen: dict[int, TensorRef | None],
                inputs: bool, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.stand_ins, ctx.seen = weakref.ref(stand_ins), seen   # weak: see `_StandIn`
        ctx.set_materialize_grads(False)
        stand_ins._recorder.unrecordable.add(ctx._sequence_nr())
        return tuple(t.view_as(t) if inputs else t.detach() for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        recorder = ctx.stand_ins()._recorder
        for i, grad in enumerate(grads):
            ctx.seen[i] = recorder.peek(grad) if grad is not None else None
        return (None, None, None, *grads)


class _StandIn(torch.autograd.Function):
    """A member's forward, its own graph discarded; its backward is a placeholder.

    A context holds the stand-ins weakly: they hold the recording's tensors, whose autograd
    nodes hold the contexts, a cycle through C++ that the garbage collector cannot see (it
    kept every recorded step of a process alive, its graph, fake tensors and recorder)."""

    @staticmethod
    def forward(ctx: Any, stand_ins: StandIns, member: int, box: dict[str, Any],
                forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                output_grads: tuple[bool, ...], *grad_tensors: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        ctx.stand_ins, ctx.member = weakref.ref(stand_ins), member
        ctx.set_materialize_grads(False)
        stand_ins._recorder.unrecordable.add(ctx._sequence_nr())
        # grad on, as a block recorded in full runs (module docstring); what the discarded
        # inner graph saves is not the step's
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_same, _same):
            out = box["out"] = forward(*args, **kwargs)
        outputs = box["outputs"] = [t for t in pytree.tree_leaves(out)
                                    if isinstance(t, torch.Tensor)]
        if len(outputs) == len(output_grads):
            ctx.mark_non_differentiable(*(t for t, g in zip(outputs, output_grads, strict=True)
                                          if not g))
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        return (None,) * 7 + tuple(ctx.stand_ins().placeholder(ctx.member, grads))


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _backward_hooks(module: torch.nn.Module) -> bool:
    """Whether a module backward hook may run: it would see a stand-in's gradients, at
    another point of the backward than the full recording's."""
    from torch.nn.modules import module as modules

    return bool(modules._global_backward_hooks or modules._global_backward_pre_hooks) or any(
        m._backward_hooks or m._backward_pre_hooks for m in module.modules())


def _replace_leaves(value: Any, by_id: Mapping[int, torch.Tensor]) -> Any:
    if not by_id:
        return value
    leaves, spec = pytree.tree_flatten(value)
    return pytree.tree_unflatten([by_id.get(id(leaf), leaf) for leaf in leaves], spec)


def _plain(value: Any) -> bool:
    return isinstance(value, (type(None), bool, int, float, str, torch.dtype, torch.device))
