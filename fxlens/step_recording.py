"""The run's training step, recorded as `analyze --train` records it: the weights cast to the
precision's working dtype (none for a model mixing dtypes on purpose without --precision),
the precision's autocast (CUDA's op lists when the analysis targets a GPU, CPU's otherwise),
the attention kernels of that device, the loss ``--loss-dtype`` asks for, the multi-token
prediction depths of ``--mtp``, the LoRA adapters of ``--lora`` and the packed samples of
``--packed``. The pipeline
records the model so, and the pruning pass its pruned modules, so that both steps compare."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torch import nn

from fxlens import checks
from fxlens.analyzer.capture import hf_loss
from fxlens.analyzer.capture.lora import lora_attached, nf4_note
from fxlens.analyzer.capture.mtp import mtp_attached, untrained_note
from fxlens.analyzer.capture.training import TrainingGraph, capture_training
from fxlens.analyzer.capture.types import Autocast
from fxlens.analyzer.core.errors import LoadError
from fxlens.rules.autocast import cpu_autocast, cuda_autocast
from fxlens.rules.training import CASTABLE_DTYPES, Precision

if TYPE_CHECKING:
    from fxlens.pipeline import Context


def record_training_step(ctx: Context, module: nn.Module,
                         on_step: Callable[[str], None] = lambda _: None) -> TrainingGraph:
    """`module`'s training step on the run's inputs, recorded as the run records its own:
    weights cast to the precision's working dtype, its autocast, the attention kernels of the
    device it targets (the pruning pass records its pruned modules so)."""
    precision, cast = step_cast(ctx)
    on_gpu = ctx.targets_gpu()
    with _loss(ctx, module), _mtp(ctx, module), _lora(ctx, module):
        step = capture_training(module, ctx.loaded.step_inputs, ctx.registry, cast, on_step,
                                fused_attention=on_gpu, autocast=_autocast(precision, on_gpu),
                                packed=ctx.options.packed)
    notes = [untrained_note(module, ctx.options.mtp)]
    if ctx.options.lora_base == "nf4":
        notes.append(nf4_note(module))
    kept = tuple(n for n in notes if n is not None)
    if not kept:
        return step
    return replace(step, graph=replace(step.graph, notes=(*step.graph.notes, *kept)))


def _mtp(ctx: Context, module: nn.Module) -> AbstractContextManager[Any]:
    """The multi-token prediction depths ``--mtp`` trains beside the model's loss, attached
    for the recording only (`fxlens.analyzer.capture.mtp`)."""
    if not ctx.options.mtp:
        return nullcontext()
    inputs = ctx.loaded.step_inputs
    if not (isinstance(inputs, Mapping) and {"input_ids", "labels"} <= set(inputs)):
        raise LoadError("--mtp: the step must train a causal LM on input_ids and labels (an "
                        "hf: preset, or a model file whose inputs are a dict with both)")
    return mtp_attached(module, ctx.options.mtp, ctx.options.mtp_shared)


def _lora(ctx: Context, module: nn.Module) -> AbstractContextManager[Any]:
    """The LoRA adapters ``--lora`` fine-tunes on the frozen model (the MTP depths' layers
    included), attached for the recording only (`fxlens.analyzer.capture.lora`)."""
    if not ctx.options.lora:
        return nullcontext()
    return lora_attached(module, ctx.options.lora, ctx.options.lora_targets or None,
                         ctx.options.lora_base)


def _loss(ctx: Context, module: nn.Module) -> AbstractContextManager[None]:
    """The loss the step records: the model's own, or (``--loss-dtype logits``) transformers'
    causal-LM loss in the logits' dtype (`fxlens.analyzer.capture.hf_loss`)."""
    if ctx.options.loss_dtype != "logits":
        return nullcontext()
    inputs = ctx.loaded.step_inputs
    if not (hf_loss.supports(module) and isinstance(inputs, Mapping) and "labels" in inputs):
        raise LoadError("--loss-dtype logits: only a transformers causal LM trained on labels "
                        "(an hf: preset) takes transformers' loss; this model computes its own")
    return hf_loss.logits_dtype_loss(module)


def step_cast(ctx: Context) -> tuple[Precision, str | None]:
    """The run's precision and the dtype its step casts the weights to (None: a model mixing
    dtypes on purpose, with no --precision, is recorded as it is)."""
    options, module = ctx.options, ctx.loaded.module
    precision = checks.precision_of(options.precision, module)
    working = precision.spec.weight_dtype
    floating = {p.dtype for p in module.parameters() if p.is_floating_point()}
    if options.precision is None and len(floating) > 1:
        return precision, None
    return precision, working if working in CASTABLE_DTYPES else "bfloat16"


def _autocast(precision: Precision, on_gpu: bool) -> Autocast | None:
    """The autocast a precision records its step under: CUDA's op lists where the analysis
    targets a GPU (the default), CPU's as they are where it targets a CPU."""
    dtype = precision.spec.autocast_dtype
    if dtype is None:
        return None
    return cuda_autocast(dtype) if on_gpu else cpu_autocast(dtype)
