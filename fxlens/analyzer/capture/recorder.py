"""Capture by recording the eager run at dispatch level: the last link of the fallback chain.

Runs the model's forward once under a `TorchDispatchMode` and records every aten call with
its inputs, outputs, module and source line. This handles what tracing cannot: data-dependent
control flow, ``.item()``, MoE routing with data-dependent shapes. The price: the graph is the
path these example inputs took, nothing more.

It runs on fake tensors when it can; an op whose output depends on data (``.item()``,
``nonzero``) forces a rerun on small real tensors. Meta-device weights are then materialised
with random values, which is allowed only up to `REAL_RUN_LIMIT_BYTES`.

NB: tracing keeps module paths in ``nn_module_stack``; an eager run has none, so here (and only
here) the module path comes from global forward pre/post hooks.
Ops without a cost rule are decomposed on the fly when PyTorch has a decomposition for them.

Fake kernels stricter than the CPU kernels (`CpuFakeTensorMode`): torch 2.13's meta kernel of
``aten._grouped_mm`` copies the CUDA checks and accepts only bfloat16, while the CPU kernel
takes float32 and float16 too. `transformers` sends its MoE experts through
``torch._grouped_mm`` on CPU outside ``torch.compile``, so a float32 MoE failed on fake
tensors: torch logged an ERROR traceback ("Expected inputs of BF16 type") and we reran on real
tensors. Fake runs here (and the make_fx link) use `CpuFakeTensorMode`, which answers such
calls on CPU or meta tensors as the CPU kernel would (same shapes, the input dtype), so they
stay on fake tensors and torch stays quiet.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from fxlens.analyzer.capture.chatter import torch_chatter_to_debug_log
from fxlens.analyzer.capture.decompose import decomposition_table
from fxlens.analyzer.capture.flex_masks import traced_score_mod
from fxlens.analyzer.capture.fx_convert import innermost_user_frame, subgraphs, type_name
from fxlens.analyzer.core.aten import bind_args, spec_of
from fxlens.analyzer.core.errors import CaptureError
from fxlens.analyzer.core.graph import Node, NodeKind, TensorRef

REAL_RUN_LIMIT_BYTES = 2 * 2**30

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
        same storage); unseen tensors become inputs named "constant"."""
        if isinstance(value, torch.Tensor):
            ref = self._refs.get(id(value)) or self._views.get(_view_key(value))
            if ref is None:
                self._add_input(NodeKind.INPUT, "constant", value)
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
        if func.name() == "flex_attention" and len(args) > 3 and callable(args[3]) \
                and not isinstance(args[3], torch.fx.GraphModule):
            args = (*args[:3], traced_score_mod(args[3]), *args[4:])   # as export records it
        named = {f"arg{i}": self.ref(subgraphs(a)) for i, a in enumerate(args)
                 if not callable(a) or isinstance(a, torch.fx.GraphModule)}
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

    def _add_input(self, kind: NodeKind, name: str, tensor: torch.Tensor) -> None:
        node = Node(len(self.nodes), kind, name, {}, (spec_of(tensor),))
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


def materialise(module: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of a meta-device module with random weights, for a real run."""
    size = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    if size > REAL_RUN_LIMIT_BYTES:
        raise MemoryError(
            f"the model needs a real run but its weights take {size / 2**30:.1f} GiB "
            f"(limit {REAL_RUN_LIMIT_BYTES / 2**30:.0f} GiB); try smaller sizes with --set"
        )
    return random_weights(module, "cpu")


def random_weights(module: torch.nn.Module, device: str) -> torch.nn.Module:
    """A copy of a meta-device module on `device`, floating weights drawn from N(0, 0.02²)
    with a fixed seed, other parameters and buffers zero.
    NB: buffers computed at construction (rotary tables, position ids) are zeros too: values
    change the numbers, not which kernels run or their shapes."""
    real = copy.deepcopy(module).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in real.parameters():
            if p.is_floating_point():
                p.normal_(0.0, 0.02, generator=generator)
            else:
                p.zero_()
        for b in real.buffers():
            b.zero_()
    return real


def real_like(value: Any) -> Any:
    """Meta tensors become small real ones (zeros for integers, so ids stay in range)."""
    if isinstance(value, torch.Tensor) and value.is_meta:
        if value.is_floating_point():
            return torch.randn(value.shape, dtype=value.dtype,
                               generator=torch.Generator().manual_seed(0))
        return torch.zeros(value.shape, dtype=value.dtype)
    return value


class CpuFakeTensorMode(FakeTensorMode):
    """A `FakeTensorMode` whose fake kernels accept what the CPU kernels accept (see the
    module docstring); every other op is the parent's, higher-order ops (FlexAttention)
    included: their fake implementations are looked up by the mode's exact type, so each is
    registered for this one too when a mode is made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for hop in list(getattr(torch._ops, "_higher_order_ops", {}).values()):
            table = getattr(hop, "python_key_table", {})
            if FakeTensorMode in table and CpuFakeTensorMode not in table:
                table[CpuFakeTensorMode] = table[FakeTensorMode]

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default and _cpu_not_bf16(args):
            return self._grouped_mm_any_dtype(func, types, args, kwargs)
        return super().dispatch(func, types, args, kwargs)

    def _grouped_mm_any_dtype(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """The meta kernel's answer for bfloat16 copies, handed back in the CPU kernel's dtype
        (``out_dtype`` when given, else the inputs')."""
        dtype = kwargs.get("out_dtype") or args[0].dtype
        as_bf16 = pytree.tree_map_only(
            torch.Tensor, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t,
            (args, {k: v for k, v in kwargs.items() if k != "out_dtype"}))
        out = super().dispatch(func, types, *as_bf16)
        assert isinstance(out, torch.Tensor)
        return out.to(dtype).contiguous()


def _cpu_not_bf16(args: Any) -> bool:
    a, b = args[0], args[1]
    return (a.device.type in ("cpu", "meta") and a.dtype in (torch.float32, torch.float16)
            and b.dtype == a.dtype)


Run = Callable[
    [torch.nn.Module, dict[str, torch.Tensor], tuple[Any, ...], dict[str, Any], Any], T
]


def fake_then_real(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], run: Run[T],
    dtype: torch.dtype | None = None,
) -> tuple[T, str]:
    """`run(module, state, args, kwargs, fake_mode)` on fake tensors; if that fails (an op
    needs real values, or a fake kernel refuses what the real one accepts), once more on
    small real tensors (the weights as `own_state`: nothing the run does reaches the module).
    Floating-point weights and inputs are cast to `dtype` when given.
    What torch logs about a failing fake run goes to the debug log
    (`fxlens.analyzer.capture.chatter`). Returns the result and which tensors it ran on."""
    try:
        with torch_chatter_to_debug_log():
            with CpuFakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
                state, fake_args, fake_kwargs = pytree.tree_map_only(
                    torch.Tensor, lambda t: fake_cpu(t, fake_mode, dtype),
                    (module_state(module), args, kwargs))
            return run(module, state, fake_args, fake_kwargs, fake_mode), "fake tensors"
    except Exception as error:  # the real run below fails the same way if it is the model's
        log.info("recording on fake tensors failed (%s); rerunning on real tensors", error)
    real = materialise(module) if on_meta(module) else module
    state, real_args, real_kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: cast_leaf(real_like(t), dtype),
        (own_state(real), args, kwargs))
    return (run(real, state, real_args, real_kwargs, None),
            "real tensors: the graph follows these inputs' branches")


def fake_cpu(
    t: torch.Tensor, fake_mode: FakeTensorMode, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A fake tensor like `t` (cast to `dtype` if floating); meta tensors become fake *CPU*
    tensors, so kernels are chosen as on a device (on meta, SDPA takes its math fallback)."""
    if not t.is_meta:
        return cast_leaf(fake_mode.from_tensor(t), dtype)
    with fake_mode:
        fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return cast_leaf(fake.requires_grad_(t.requires_grad and t.is_floating_point()), dtype)


def cast_leaf(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`t` in `dtype` when it is floating point, still a leaf with its requires_grad."""
    if dtype is None or not t.is_floating_point() or t.dtype == dtype:
        return t
    return t.detach().to(dtype).requires_grad_(t.requires_grad)


def own_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by qualified name, as tensors a run may change without changing
    the module: each parameter a new leaf on its storage (a backward fills its ``.grad``, not
    the parameter's), each buffer a copy (train mode updates BatchNorm's statistics)."""
    params = {n: p.detach().requires_grad_(p.requires_grad)
              for n, p in module.named_parameters()}
    return {**params, **{n: b.clone() for n, b in module.named_buffers()}}


def module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by qualified name."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def on_meta(module: torch.nn.Module) -> bool:
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))
