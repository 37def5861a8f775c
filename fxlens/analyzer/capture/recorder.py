"""Capture by recording the eager run at dispatch level: the last link of the fallback chain.

Runs the model's forward once under a `TorchDispatchMode` and records every aten call with
its inputs, outputs, module and source line. This handles what tracing cannot: data-dependent
control flow, ``.item()``, MoE routing with data-dependent shapes. The price: the graph is the
path these example inputs took, nothing more.

It runs on fake tensors when it can; an op whose output depends on data (``.item()``,
``nonzero``) forces a rerun on small real tensors (`fake_runs.fake_then_real`).

NB: tracing keeps module paths in ``nn_module_stack``; an eager run has none, so here (and only
here) the module path comes from global forward pre/post hooks.
Ops without a cost rule are decomposed on the fly when PyTorch has a decomposition for them.

Fake and real runs, and the fake mode they use: `fxlens.analyzer.capture.fake_runs`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fxlens.analyzer.capture.decompose import decomposition_table
from fxlens.analyzer.capture.flex_masks import as_exported
from fxlens.analyzer.capture.fx_convert import hop_arguments, innermost_user_frame, type_name
from fxlens.analyzer.core.aten import bind_args, known_value, spec_of
from fxlens.analyzer.core.errors import CaptureError
from fxlens.analyzer.core.graph import CONSTANT_INPUT, Node, NodeKind, TensorRef

log = logging.getLogger(__name__)
T = TypeVar("T")


Where = tuple[str, str, str]   # module path, module type, source line


# Not recorded: autograd asks fake tensors for their device through dispatch (when it makes a
# node, when it checks a gradient), a real tensor answers without one, and the query computes
# nothing. Recorded, they were 15,172 of the 23,541 nodes of hf:llama-2-7b's training step.
DEVICE_QUERY = torch.ops.prim.device.default
POISONED = TensorRef(-1)    # a tensor made by truncated nodes (`Recorder.truncate`)


class NotRecordable(Exception):
    """Autograd ran an op for a node whose backward must run none (see `Recorder`)."""


def input_names(module: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                ) -> dict[int, str]:
    """Each input tensor's name from ``forward``'s signature (``idx``, ``attention_mask``;
    ``past.0`` for the leaves of a container), by tensor id; empty when it does not bind."""
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {}
    names: dict[int, str] = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        parts = (value.items() if kind is inspect.Parameter.VAR_KEYWORD else
                 ((f"{name}{i}", v) for i, v in enumerate(value))
                 if kind is inspect.Parameter.VAR_POSITIONAL else ((name, value),))
        for label, part in parts:
            leaves = [t for t in pytree.tree_leaves(part) if isinstance(t, torch.Tensor)]
            for i, tensor in enumerate(leaves):
                names.setdefault(id(tensor), label if len(leaves) == 1 else f"{label}.{i}")
    return names


class Recorder(TorchDispatchMode):
    """Records aten calls into `nodes`; tensors are matched to producers by identity.

    `phase` tags the nodes ("forward", "backward"). Backward ops carry the module, type and
    source line of the forward op whose autograd node runs them: each forward op's autograd
    sequence number is noted when it runs, and the backward looks up the sequence number of
    the node the autograd engine is executing (gradient accumulation: the parameter's owner).

    For the stand-ins of the training step (`fxlens.analyzer.capture.step_blocks`): ops run
    while `quiet` are not recorded (`alias` names what they make); `placeholder` records one
    node made of given tensors; `mark` and `truncate` take back what was recorded since; an
    op that autograd runs for one of the `unrecordable` autograd nodes (by sequence number)
    raises `NotRecordable`.
    """

    def __init__(
        self,
        known: Callable[[str], bool],
        decompositions: Mapping[Any, Callable[..., Any]],
        inputs: Mapping[int, tuple[NodeKind, str, torch.Tensor]],
    ) -> None:
        super().__init__()
        self.nodes: list[Node] = []
        self.phase = "forward"
        self.module_stack: list[tuple[str, str]] = []
        self._known = known
        self._decompositions = decompositions
        self._refs: dict[int, TensorRef] = {}
        self._views: dict[tuple[Any, ...], TensorRef] = {}
        self._alive: list[torch.Tensor] = []   # keeps ids unique while we hold refs
        self._by_sequence_nr: dict[int, Where] = {}
        self._last_sequence_nr = torch._C._autograd._get_sequence_nr() - 1
        self._last_where: Where = ("", "", "")
        self._param_owner: dict[int, Where] = {}
        self._quiet = False
        self.unrecordable: set[int] = set()
        for kind, name, tensor in inputs.values():
            self._add_input(kind, name, tensor)
            if kind is NodeKind.PARAM:
                self._param_owner[id(tensor)] = (name.rpartition(".")[0], "", "")

    @classmethod
    def for_run(
        cls, module: torch.nn.Module, state: Mapping[str, torch.Tensor], args: tuple[Any, ...],
        kwargs: Mapping[str, Any], known: Callable[[str], bool],
    ) -> Recorder:
        """A recorder that knows `state` (the tensors the module will run with, by name) as
        parameters and buffers, and the tensors among `args` and `kwargs` as inputs."""
        buffers = {n for n, _ in module.named_buffers()}
        inputs = {id(t): (NodeKind.BUFFER if n in buffers else NodeKind.PARAM, n, t)
                  for n, t in state.items()}
        names = input_names(module, args, kwargs)
        for i, t in enumerate(pytree.tree_leaves((args, kwargs))):
            if isinstance(t, torch.Tensor):
                inputs.setdefault(id(t), (NodeKind.INPUT, names.get(id(t), f"input{i}"), t))
        return cls(known, decomposition_table(), inputs)

    # Higher-order ops (FlexAttention and its backward) are recorded as one node each.
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return self._higher_order(func, args, kwargs)
        if self._quiet or func is DEVICE_QUERY:
            return func(*args, **kwargs)
        decomposition = None if self._known(str(func)) else self._decompositions.get(func)
        if decomposition is not None:
            with self:
                return decomposition(*args, **kwargs)
        out = func(*args, **kwargs)
        self._record(func, args, kwargs, out)
        return out

    def ref(self, value: Any) -> Any:
        """The TensorRef of a tensor seen before (by identity, else by the same view of the
        same storage); unseen tensors become inputs named ``CONSTANT_INPUT``
        (their values kept where `known_value` keeps them)."""
        if isinstance(value, torch.Tensor):
            ref = self._refs.get(id(value)) or self._views.get(_view_key(value))
            if ref is None:
                self._add_input(NodeKind.INPUT, CONSTANT_INPUT, value, known_value(value))
                ref = self._refs[id(value)]
            return ref
        if isinstance(value, (list, tuple)):
            return type(value)(self.ref(v) for v in value)
        return value

    def peek(self, tensor: torch.Tensor) -> TensorRef | None:
        """The TensorRef of a tensor seen before, None for one never seen (nothing added)."""
        return self._refs.get(id(tensor)) or self._views.get(_view_key(tensor))

    def alias(self, tensor: torch.Tensor, original: torch.Tensor) -> None:
        """From now on `tensor` is read as `original` (a view made while `quiet`)."""
        ref = self.peek(original)
        if ref is not None:
            self._remember(tensor, ref)

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Ops run meanwhile are not recorded."""
        before, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = before

    def placeholder(self, target: str, args: Mapping[str, Any],
                    outputs: Sequence[torch.Tensor]) -> Node:
        """Record one node standing for ops not run (or truncated), which made `outputs`."""
        node = Node(len(self.nodes), NodeKind.CALL, target, args,
                    tuple(spec_of(o) for o in outputs), phase=self.phase)
        self.nodes.append(node)
        for index, o in enumerate(outputs):
            ref = TensorRef(node.id, index)
            self._remember(o, ref)
            if self._views.get(_view_key(o)) == POISONED:
                self._views[_view_key(o)] = ref
        return node

    def mark(self) -> tuple[int, int]:
        """Where the recording is, for `truncate`."""
        return len(self.nodes), len(self._alive)

    def truncate(self, mark: tuple[int, int], poison: bool) -> None:
        """Forget the nodes recorded since `mark`. The tensors they made are forgotten too,
        or with `poison` read as node -1 from now on (which no graph has)."""
        length, alive = mark
        del self.nodes[length:]
        for tensor in self._alive[alive:]:
            _forget(self._refs, id(tensor), length, poison)
            _forget(self._views, _view_key(tensor), length, poison)

    def _higher_order(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run a higher-order op below this mode and record it as ``higher_order.<name>``:
        its tensors by reference, its function arguments as the ops they run (`Subgraph`),
        as the export capture records it."""
        if kwargs:
            raise CaptureError(f"{func.name()}: keyword arguments of a higher-order op are "
                               "not recorded")
        out = func(*args)
        if self._quiet:
            return out
        named = {name: self.ref(value)
                 for name, value in hop_arguments(as_exported(func.name(), args)).items()}
        flat = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        module, module_type, source = self._where(args)
        node = Node(len(self.nodes), NodeKind.CALL, f"higher_order.{func.name()}", named,
                    tuple(spec_of(o) for o in flat), module=module, module_type=module_type,
                    source=source, phase=self.phase)
        self.nodes.append(node)
        for index, o in enumerate(flat):
            self._remember(o, TensorRef(node.id, index))
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if self.unrecordable and self.phase == "backward":
            self._check_recordable(func)
        bound = bind_args(func, args, kwargs, convert=self.ref)
        flat = out if isinstance(out, (list, tuple)) else (out,)
        outputs = tuple(spec_of(o) if isinstance(o, torch.Tensor) else None for o in flat)
        module, module_type, source = self._where(args)
        node = Node(len(self.nodes), NodeKind.CALL, str(func), bound, outputs, module=module,
                    module_type=module_type, source=source, phase=self.phase)
        self.nodes.append(node)
        for index, o in enumerate(flat):
            if isinstance(o, torch.Tensor):
                self._remember(o, TensorRef(node.id, index))

    def _check_recordable(self, func: Any) -> None:
        """Raise `NotRecordable` if autograd runs `func` for an `unrecordable` node."""
        node = torch._C._current_autograd_node()
        if node is not None and node._sequence_nr() in self.unrecordable:
            raise NotRecordable(f"autograd ran {func} for {node.name()}")

    def _where(self, args: tuple[Any, ...]) -> Where:
        if self.phase == "forward":
            module, module_type = self.module_stack[-1] if self.module_stack else ("", "")
            where = (module, module_type, innermost_user_frame())
            self._note_sequence_nrs(where, _needs_grad(args))
            return where
        node = torch._C._current_autograd_node()
        if node is None:
            return ("", "", "")
        variable = getattr(node, "variable", None)
        if variable is not None:
            return self._param_owner.get(id(variable), ("", "", ""))
        return self._by_sequence_nr.get(node._sequence_nr(), ("", "", ""))

    def _note_sequence_nrs(self, where: Where, makes_node: bool) -> None:
        """Attribute the autograd nodes made since the last recorded op. An op that needs grad
        made the newest one before it ran; the others were made by the op before, after it
        ran (``CopySlices``, when it wrote into a view), and are that op's."""
        newest = torch._C._autograd._get_sequence_nr() - 1
        previous = newest if makes_node else newest + 1
        for sequence_nr in range(self._last_sequence_nr + 1, previous):
            self._by_sequence_nr.setdefault(sequence_nr, self._last_where)
        if makes_node:
            self._by_sequence_nr.setdefault(newest, where)
        self._last_sequence_nr = max(self._last_sequence_nr, newest)
        self._last_where = where

    def _add_input(self, kind: NodeKind, name: str, tensor: torch.Tensor,
                   value: torch.Tensor | None = None) -> None:
        node = Node(len(self.nodes), kind, name, {}, (spec_of(tensor),), value=value)
        self.nodes.append(node)
        self._remember(tensor, TensorRef(node.id))

    def _remember(self, tensor: torch.Tensor, ref: TensorRef) -> None:
        self._refs[id(tensor)] = ref
        self._views.setdefault(_view_key(tensor), ref)
        self._alive.append(tensor)


def _needs_grad(args: tuple[Any, ...]) -> bool:
    """Whether an op on `args` makes an autograd node (grad mode on, a tensor needing grad)."""
    if not torch.is_grad_enabled():
        return False
    return any(v.requires_grad for value in args
               for v in (value if isinstance(value, (list, tuple)) else (value,))
               if isinstance(v, torch.Tensor))


def _forget(table: dict[Any, TensorRef], key: Any, length: int, poison: bool) -> None:
    ref = table.get(key)
    if ref is not None and ref.node >= length:
        if poison:
            table[key] = POISONED
        else:
            del table[key]


def _view_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Identifies the same view of the same storage across distinct tensor objects (autograd
    hands saved outputs back as new objects)."""
    try:
        storage = t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        storage = id(t)
    return (storage, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


@contextmanager
def module_tracking(
    root: torch.nn.Module, stack: list[tuple[str, str]], publish: bool = False
) -> Iterator[None]:
    """Keep `stack` at the (path, type) of the modules whose forward is running.

    With `publish`, also expose it as ``nn_module_stack`` in fx's preserved node meta, so
    nodes that make_fx creates meanwhile carry it (use inside ``preserve_node_meta()``).
    """
    paths = {id(m): (p, type_name(type(m))) for p, m in root.named_modules()}

    def changed() -> None:
        if publish:
            fx_traceback.current_meta["nn_module_stack"] = {p: (p, t) for p, t in stack}

    def push(module: torch.nn.Module, _args: Any) -> None:
        if id(module) in paths:
            stack.append(paths[id(module)])
            changed()

    def pop(module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if id(module) in paths and stack:
            stack.pop()
            changed()

    handles = [torch.nn.modules.module.register_module_forward_pre_hook(push),
               torch.nn.modules.module.register_module_forward_hook(pop)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
