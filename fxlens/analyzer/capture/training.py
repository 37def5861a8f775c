"""`capture_training(module, inputs) -> TrainingGraph`: the joint forward+backward graph.

The training step is recorded at dispatch level on fake tensors, aot-autograd style: the
forward runs in train mode, then autograd's backward runs from the model's own loss when its
output has one (a ``transformers`` model given ``labels``, as `hf` presets of causal language
models are), else from a gradient of ones on every output that requires grad (the cheapest
stand-in for a loss: no loss op is added). Every
backward op is real — `mm` for weight and input gradients, `convolution_backward`,
`_scaled_dot_product_*_backward`, `threshold_backward`… — so backward FLOPs come from the
ops, not from a "2× forward" rule. Frozen parameters (requires_grad=False) get no
weight-gradient ops because autograd computes none.

Backward nodes are attributed to the module of their forward op (see `Recorder`).
Saved-for-backward tensors are those autograd packs during the forward (a
``saved_tensors_hooks`` pair that hands the same tensor back), and each parameter's final
``.grad`` is marked with the role "gradient", live to the end of the step.

Repeated blocks are recorded once on fake tensors (`step_blocks`): a block proven identical to
one recorded in full is a copy of its nodes, forward and backward, and the graph is the one a
full recording gives, node for node; where that cannot be shown, the step is recorded in full.

With an `Autocast` policy (``--precision autocast-bf16``) the weights keep their dtype and the
forward runs under ``torch.autocast`` (`fxlens.analyzer.capture.autocast`): the graph carries
autocast's casts and mixed dtypes, the backward the casts' backward, and each parameter's
gradient is in the parameter's dtype.

Attention with dropout is recorded as the fused kernel a GPU runs, not CPU's math path, which
saves the T×T probabilities (`fxlens.analyzer.capture.fused_attention`); with
``fused_attention=False`` the step is what a CPU runs.

Known limitations: ops whose output depends on data force a rerun on small real tensors, as
in inference capture; the optimizer step is not recorded but accounted from its policy
(`fxlens.analyzer.memory.training_state`).
"""

from __future__ import annotations

import contextlib
import logging
import traceback
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from fxlens.analyzer.capture.as_eager import libraries_as_eager
from fxlens.analyzer.capture.autocast import autocast_forward, autocast_kernels
from fxlens.analyzer.capture.chain import (
    Inputs,
    param_infos,
    plain_outputs,
    tied_names,
    with_buffer_values,
)
from fxlens.analyzer.capture.fake_runs import fake_then_real
from fxlens.analyzer.capture.fused_attention import fused_attention_kernels
from fxlens.analyzer.capture.fx_convert import type_name, user_frame
from fxlens.analyzer.capture.packed import packed_attention, packed_note
from fxlens.analyzer.capture.recorder import Recorder, module_tracking
from fxlens.analyzer.capture.step_blocks import StandIns
from fxlens.analyzer.capture.types import Autocast
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.errors import CaptureError
from fxlens.analyzer.core.graph import Graph, Node, TensorRef

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Recorded:
    nodes: list[Node]
    saved: list[TensorRef]
    roles: dict[TensorRef, str]          # each parameter's gradient
    outputs: list[TensorRef]             # what the forward returned


@dataclass(frozen=True)
class _Settings:
    dtype: str | None                  # weights and floating inputs cast to it
    fused_attention: bool
    autocast: Autocast | None
    packed: int = 0                    # attention within samples of this many tokens


@dataclass(frozen=True)
class TrainingGraph:
    graph: Graph
    saved: tuple[TensorRef, ...]       # tensors autograd saved for the backward, in order
    # What the forward returned (logits, a loss): the caller holds them through the backward,
    # as a training loop's ``out`` does. Not among `graph.outputs`: the step's liveness frees
    # them at their last use.
    outputs: tuple[TensorRef, ...] = ()


def capture_training(
    module: torch.nn.Module,
    inputs: Inputs,
    registry: CostRegistry,
    dtype: str | None = None,
    on_step: Callable[[str], None] = lambda _: None,
    stand_ins: bool = True,
    fused_attention: bool = True,
    autocast: Autocast | None = None,
    packed: int = 0,
) -> TrainingGraph:
    """Record one training step; `dtype` (e.g. "bfloat16") is the working precision of
    weights and activations, the model's own when None. With `stand_ins`, the backward of
    repeated blocks is copied from the first of each group (`step_blocks`); the graph is the
    same either way. With `fused_attention`, attention with dropout runs the fused kernel, as
    on a GPU (`fused_attention_kernels`); without, the math path a CPU takes. With
    `autocast`, the forward runs under ``torch.autocast`` in its dtype (`dtype` is then the
    weights' own, e.g. "float32"). With `packed`, causal self-attention runs within samples of
    that many tokens (`packed_attention`)."""
    settings = _Settings(dtype, fused_attention, autocast, packed)
    args, kwargs = (tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else ((), dict(inputs))
    on_step("recording the training step")
    with _train_mode(module):
        try:
            recorded, tensors = _record(module, args, kwargs, registry, settings, stand_ins)
            if recorded is None:    # the stand-ins would not give the full recording
                recorded, tensors = _record(module, args, kwargs, registry, settings, False)
        except CaptureError:
            raise
        except Exception as error:   # the model's own failure, on fake or real tensors
            raise CaptureError(_step_error(error, settings)) from error
    assert recorded is not None
    # NB: the recorder decomposed unknown ops as they ran; nothing is left to splice in.
    graph = Graph(
        nodes=with_buffer_values(recorded.nodes, module), params=param_infos(module),
        tied=tied_names(module),
        capture_method="joint forward+backward recorded at dispatch level",
        module_types={p: type_name(type(m)) for p, m in module.named_modules()},
        roles=recorded.roles, notes=(f"recorded on {tensors}", *_autocast_note(autocast),
                                     *_packed_notes(recorded.nodes, packed)),
    )
    return TrainingGraph(graph, tuple(dict.fromkeys(recorded.saved)),
                         tuple(dict.fromkeys(recorded.outputs)))


def _record(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
    registry: CostRegistry, settings: _Settings, stand_ins: bool,
) -> tuple[_Recorded | None, str]:
    """The step on fake tensors, else on small real ones (`fake_then_real`). With
    `stand_ins`, on fake tensors, repeated blocks are stood in for (`step_blocks`); None if
    they would not give the full recording, which the caller then records on fresh fake
    tensors, so nothing of the failed attempt (a parameter's ``.grad``, autograd's gradient
    accumulators) is reused. On real tensors every block runs: the path may follow each
    one's data."""
    def run(module: torch.nn.Module, state: dict[str, torch.Tensor], args: tuple[Any, ...],
            kwargs: dict[str, Any], fake_mode: FakeTensorMode | None) -> _Recorded | None:
        if not stand_ins or fake_mode is None:
            return _record_once(module, state, args, kwargs, registry, fake_mode, False,
                                settings)
        try:
            return _record_once(module, state, args, kwargs, registry, fake_mode, True,
                                settings)
        except (DataDependentOutputException, DynamicOutputShapeException):
            raise                    # the model's data decides: on to real tensors
        except Exception as error:   # the full recording says what is wrong, if anything
            log.info("recording the step with repeated blocks stood in failed (%s: %s); "
                     "recording every block", type(error).__name__, error)
            return None

    dtype = settings.dtype
    return fake_then_real(module, args, kwargs, run,
                          dtype=getattr(torch, dtype) if dtype else None)


def _record_once(
    module: torch.nn.Module, state: dict[str, torch.Tensor], args: tuple[Any, ...],
    kwargs: dict[str, Any], registry: CostRegistry, fake_mode: FakeTensorMode | None,
    stand_ins: bool, settings: _Settings,
) -> _Recorded:
    recorder = Recorder.for_run(module, state, args, kwargs, registry.knows)
    saved: list[TensorRef] = []
    # The hook is kept by the autograd nodes of the tensors the recorder keeps: held strongly,
    # the recorder would close a cycle through C++ that no garbage collection frees.
    recording = weakref.ref(recorder)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(recording().ref(tensor))   # type: ignore[union-attr]  # alive: recording
        return tensor

    blocks = StandIns(module, recorder, saved, state) if stand_ins else None
    installed = blocks.installed() if blocks is not None else contextlib.nullcontext()
    tensors = fake_mode if fake_mode is not None else contextlib.nullcontext()
    # The backward runs with fused attention and autocast's kernels too: a checkpointed block
    # recomputes its forward (under the autocast state it saved). Autocast itself is on for
    # the forward alone (`fxlens.analyzer.capture.autocast`).
    with (module_tracking(module, recorder.module_stack), tensors, recorder, installed,
          fused_attention_kernels(settings.fused_attention), packed_attention(settings.packed),
          autocast_kernels(settings.autocast), libraries_as_eager()):
        with (torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
              autocast_forward(settings.autocast)):
            out = torch.func.functional_call(module, state, args, kwargs)
        returned = [ref for t in pytree.tree_leaves(plain_outputs(out))
                    if isinstance(t, torch.Tensor) and (ref := recorder.peek(t)) is not None]
        outputs = _to_train(out)
        if not outputs:
            raise CaptureError("no output of the model requires grad: nothing to train "
                               "(are all parameters frozen?)")
        recorder.phase = "backward"
        torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])
    spliced = blocks.finish(returned) if blocks is not None else None
    if spliced is not None:
        nodes, saved, grads, returned = spliced
        return _Recorded(nodes, saved, {grads[n]: "gradient" for n in state if n in grads},
                         returned)
    return _Recorded(recorder.nodes, saved, {recorder.ref(t.grad): "gradient"
                                             for t in state.values() if t.grad is not None},
                     returned)


def _packed_notes(nodes: list[Node], packed: int) -> tuple[str, ...]:
    return (packed_note((n.target for n in nodes), packed),) if packed else ()


def _autocast_note(autocast: Autocast | None) -> tuple[str, ...]:
    if autocast is None:
        return ()
    lists = f", {autocast.source}" if autocast.source else ""
    return (f"forward under torch.autocast({autocast.dtype}){lists}",)


def _to_train(out: Any) -> list[torch.Tensor]:
    """What the backward starts from: the model's own loss when its output has one (a
    ``transformers`` model given ``labels``), else every output that requires grad."""
    plain = plain_outputs(out)
    loss = plain.get("loss") if isinstance(plain, dict) else None
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return [loss]
    return [t for t in pytree.tree_leaves(plain)
            if isinstance(t, torch.Tensor) and t.requires_grad]


def _step_error(error: Exception, settings: _Settings) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = user_frame([(f.filename, f.lineno or 0) for f in frames])
    dtype, autocast = settings.dtype, settings.autocast
    cast = (f" (recorded under torch.autocast({autocast.dtype}) with {dtype or 'its own'} "
            f"weights, the --precision policy)" if autocast is not None else
            f" (recorded with every weight cast to {dtype}, the --precision policy's working "
            f"dtype)" if dtype else "")
    return (f"could not record the training step{cast}: {type(error).__name__}: {error}"
            f"{f' at {where}' if where else ''}")


@contextlib.contextmanager
def _train_mode(module: torch.nn.Module) -> Iterator[None]:
    modes = {m: m.training for m in module.modules()}
    module.train()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.train(training)
