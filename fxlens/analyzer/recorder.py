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
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch.utils._python_dispatch import TorchDispatchMode

from fxlens.analyzer.aten import bind_args, spec_of
from fxlens.analyzer.fx_convert import type_name, user_frame
from fxlens.analyzer.graph import Node, NodeKind, TensorRef

REAL_RUN_LIMIT_BYTES = 2 * 2**30


class Recorder(TorchDispatchMode):
    """Records aten calls into `nodes`; tensors are matched to producers by identity."""

    def __init__(
        self,
        known: Callable[[str], bool],
        decompositions: Mapping[Any, Callable[..., Any]],
        inputs: Mapping[int, tuple[NodeKind, str, torch.Tensor]],
    ) -> None:
        super().__init__()
        self.nodes: list[Node] = []
        self._known = known
        self._decompositions = decompositions
        self._refs: dict[int, TensorRef] = {}
        self._alive: list[torch.Tensor] = []   # keeps ids unique while we hold refs
        self.module_stack: list[tuple[str, str]] = []
        for kind, name, tensor in inputs.values():
            self._add_input(kind, name, tensor)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        decomposition = None if self._known(str(func)) else self._decompositions.get(func)
        if decomposition is not None:
            with self:
                return decomposition(*args, **kwargs)
        out = func(*args, **kwargs)
        self._record(func, args, kwargs, out)
        return out

    def ref(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in self._refs:
                self._add_input(NodeKind.INPUT, "constant", value)
            return self._refs[id(value)]
        if isinstance(value, (list, tuple)):
            return type(value)(self.ref(v) for v in value)
        return value

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        bound = bind_args(func, args, kwargs, convert=self.ref)
        flat = out if isinstance(out, (list, tuple)) else (out,)
        outputs = tuple(spec_of(o) if isinstance(o, torch.Tensor) else None for o in flat)
        module, module_type = self.module_stack[-1] if self.module_stack else ("", "")
        frames = [(f.filename, f.lineno or 0) for f in traceback.extract_stack()]
        node = Node(len(self.nodes), NodeKind.CALL, str(func), bound, outputs,
                    module=module, module_type=module_type, source=user_frame(frames))
        self.nodes.append(node)
        for index, o in enumerate(flat):
            if isinstance(o, torch.Tensor):
                self._remember(o, TensorRef(node.id, index))

    def _add_input(self, kind: NodeKind, name: str, tensor: torch.Tensor) -> None:
        node = Node(len(self.nodes), kind, name, {}, (spec_of(tensor),))
        self.nodes.append(node)
        self._remember(tensor, TensorRef(node.id))

    def _remember(self, tensor: torch.Tensor, ref: TensorRef) -> None:
        self._refs[id(tensor)] = ref
        self._alive.append(tensor)


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
    real = copy.deepcopy(module).to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
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
