"""`measure_memory(module, inputs)`: the live bytes of a real CPU run, to check `liveness` against.

A `TorchDispatchMode` sees every aten call that reaches the dispatcher (after autograd and
composite decompositions) and registers each output's untyped storage once, with a
``weakref.finalize`` on the storage object: PyTorch keeps one Python object per storage alive
as long as the storage is, so the finalizer runs exactly when the storage is released. Storages
that existed before the run (parameters, buffers, inputs) or that an op received as an input
(views, in-place and ``out=`` results, ``lift_fresh`` of a constant) are not new and are never
counted. The timeline has one entry per dispatched op: live bytes right after its outputs.

Inference (``train=False``) runs the forward under ``torch.no_grad()``. A training step
(``train=True``) runs on a deep copy of the module (the caller's weights stay untouched): the
forward, ``torch.autograd.backward`` of every floating output that requires grad with seeds of
ones, then one optimizer step (AdamW by default); gradients and the optimizer state created in
the step are counted and still live at the end. The seeds are made outside the measurement,
like the inputs. The module's train/eval mode is the caller's choice.

Small models only: this runs the real computation, on CPU, with real weights.

NB: what the allocator does below the dispatcher is invisible here as it is to the graph:
kernel workspaces, temporaries inside one aten kernel, allocator rounding and caching. So is a
tensor created outside any aten call (``torch.tensor([...])`` data before its ``lift_fresh``).
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from fxlens.analyzer.capture.as_eager import libraries_as_eager
from fxlens.analyzer.capture.fake_runs import fake_then_real

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class MeasuredMemory:
    """Live bytes of the storages a real run created, following their lifetimes."""

    peak_bytes: int
    peak_op: str                   # the op right after which the peak was reached
    end_bytes: int                 # still live when the run ended (outputs, grads, states)
    timeline: tuple[int, ...]      # after each dispatched op
    ops: tuple[str, ...]           # the op of each timeline entry
    allocated_bytes: int           # every new storage, summed
    storages: int                  # how many new storages


class StorageTracker(TorchDispatchMode):
    """Counts each new storage an op returns until the storage is released. A higher-order
    op (FlexAttention) is one fused kernel: its outputs are counted, not its inner ops."""

    supports_higher_order_operators = True

    def __init__(self, existing: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._existing = {_key(t) for t in existing}
        self._live: dict[int, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_op = ""
        self.allocated_bytes = 0
        self.storages = 0
        self.timeline: list[int] = []
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.observe(func, args, kwargs, out)
        return out

    def observe(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """Follow what one op call returned (`args` and `kwargs` what it was given)."""
        received = {_key(t) for t in _tensors((args, kwargs))}
        for tensor in _tensors(out):
            self._register(tensor, received)
        self.timeline.append(self.live_bytes)
        self.ops.append(str(func))
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_op = self.live_bytes, str(func)

    def _register(self, tensor: torch.Tensor, received: set[int]) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: no single storage
            return
        key, size = storage._cdata, storage.nbytes()
        if size == 0 or key in self._existing or key in received or key in self._live:
            return
        self._live[key] = size
        self.live_bytes += size
        self.allocated_bytes += size
        self.storages += 1
        finalizer = weakref.finalize(storage, self._release, key)
        finalizer.atexit = False

    def _release(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def result(self) -> MeasuredMemory:
        return MeasuredMemory(
            peak_bytes=self.peak_bytes, peak_op=self.peak_op, end_bytes=self.live_bytes,
            timeline=tuple(self.timeline), ops=tuple(self.ops),
            allocated_bytes=self.allocated_bytes, storages=self.storages,
        )


def _key(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return -1


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in nested containers, dicts, ``ModelOutput``s and dataclasses."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "__dataclass_fields__"):
            stack.extend(getattr(item, f) for f in item.__dataclass_fields__)


def _split(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    return tuple(inputs), {}


def default_optimizer(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params)


def measure_memory(
    module: torch.nn.Module,
    inputs: Any,
    train: bool = False,
    optimizer_factory: OptimizerFactory | None = None,
) -> MeasuredMemory:
    """Run `module` on `inputs` (a tuple of positional or a dict of keyword inputs) for real
    and follow the storages it creates; with `train`, a whole training step."""
    args, kwargs = _split(inputs)
    if not train:
        tracker = StorageTracker(_state(module, (args, kwargs)))
        with torch.no_grad(), tracker:
            out = module(*args, **kwargs)
        result = tracker.result()
        del out
        return result
    return _measure_step(copy.deepcopy(module), args, kwargs,
                         optimizer_factory or default_optimizer)


def _measure_step(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
    optimizer_factory: OptimizerFactory,
) -> MeasuredMemory:
    for param in module.parameters():
        param.grad = None
    optimizer = optimizer_factory([p for p in module.parameters() if p.requires_grad])
    tracker = StorageTracker(_state(module, (args, kwargs)))
    with torch.enable_grad(), tracker:
        out = module(*args, **kwargs)
    roots = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
    seeds = [torch.ones_like(t) for t in roots]
    with torch.enable_grad(), tracker:
        torch.autograd.backward(roots, seeds)
        optimizer.step()
    result = tracker.result()
    del out, roots, seeds
    return result


def _state(module: torch.nn.Module, inputs: Any) -> list[torch.Tensor]:
    leaves = [t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    return [*module.parameters(), *module.buffers(), *leaves]


def simulate_eager_memory(module: torch.nn.Module, inputs: Any) -> MeasuredMemory:
    """`measure_memory` of an inference forward, run on fake tensors: no weights, no compute.

    Fake tensors are freed when Python drops them, exactly as real ones, so this follows
    eager PyTorch's lifetimes, Python's own references included — what graph liveness cannot
    see. Falls back to a small real run where fake tensors cannot go (see
    `fxlens.analyzer.capture.fake_runs.fake_then_real`).
    """
    args, kwargs = _split(inputs)

    def run(real_or_fake: torch.nn.Module, state: dict[str, torch.Tensor],
            run_args: tuple[Any, ...], run_kwargs: dict[str, Any],
            fake_mode: FakeTensorMode | None) -> MeasuredMemory:
        tracker = _forward_tracker(state, run_args, run_kwargs)
        tensors = fake_mode if fake_mode is not None else contextlib.nullcontext()
        with tensors, torch.no_grad(), tracker, libraries_as_eager():
            out = torch.func.functional_call(real_or_fake, state, run_args, run_kwargs)
        result = tracker.result()
        del out
        return result

    return fake_then_real(module, args, kwargs, run)[0]


def _forward_tracker(state: dict[str, torch.Tensor], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> StorageTracker:
    """A tracker of a forward that runs with `state` on `args` and `kwargs`, all existing."""
    return StorageTracker([*state.values(), *_state(torch.nn.Module(), (args, kwargs))])


class EagerAlongside:
    """`simulate_eager_memory` riding along the capture's own fake forward (the proof of
    repeated blocks, `fxlens.analyzer.capture.blocks.find_repeats`): the same fake tensors
    in inference mode, so the same lifetimes, and one forward fewer. `result` stays None
    when that forward did not run to the end."""

    def __init__(self) -> None:
        self.result: MeasuredMemory | None = None
        self._tracker: StorageTracker | None = None

    def start(self, state: dict[str, torch.Tensor], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Callable[[Any, Any, Any, Any], None]:
        self._tracker = _forward_tracker(state, args, kwargs)
        return self._tracker.observe

    def finish(self) -> None:
        assert self._tracker is not None, "finish() after start()"
        self.result = self._tracker.result()
