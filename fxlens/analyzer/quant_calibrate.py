"""Calibrated quantization sensitivity: real forwards on real inputs.

`calibrate` runs the model (eval mode, no grad) on each calibration batch once for the
reference: per layer the input activation range and outlier channels, the output max/std, and
the model's outputs. Then, per layer and per format, only that layer's weight is fake-quantized
(and with ``activations`` its input too) and the model-output SQNR over all batches is
``10·log10(Σy² / Σ(y − ŷ)²)`` on every floating-point output leaf.

Activation statistics come from forward hooks on the layer modules. NB: the design keeps module
attribution of the *graph* off hooks (``nn_module_stack``); here hooks see real tensors of a real
run, which is what they are for. Input channels are the last dim (linear) or dim 1 (conv).
NB: activations are fake-quantized with a dynamic per-tensor scale (per batch), the scale a
static calibration would pick for that batch; embeddings' integer inputs are left alone.

Cost: ``layers × formats + 1`` forwards per batch; progress goes to `on_step`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from fxlens.analyzer.capture import plain_outputs
from fxlens.analyzer.quant import OUTLIER_RATIO, Layer, NumberFormatLike, QuantKnowledge, sqnr_db

Inputs = tuple[Any, ...] | dict[str, Any]


@dataclass(frozen=True)
class ActivationStats:
    """One layer's input (and output) activations over the calibration batches."""

    input_absmax: float
    input_max_over_std: float
    outlier_channels: int            # input channels whose max|x| > OUTLIER_RATIO × median
    outlier_channel_share: float
    output_max_over_std: float


@dataclass(frozen=True)
class Calibration:
    batches: int
    activations: Mapping[str, ActivationStats]
    output_sqnr_db: Mapping[str, Mapping[str, float]]     # layer → format → dB


def run_model(module: torch.nn.Module, inputs: Inputs) -> torch.Tensor:
    """One forward; every floating-point output leaf, flattened and concatenated."""
    with torch.no_grad():
        out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    leaves = [t.detach().float().flatten() for t in pytree.tree_leaves(plain_outputs(out))
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return torch.cat(leaves) if leaves else torch.zeros(0)


def calibrate(module: torch.nn.Module, layers: Sequence[Layer], batches: Iterable[Inputs],
              knowledge: QuantKnowledge, activations: bool = False,
              on_step: Callable[[str], None] = lambda _: None) -> Calibration:
    batches = list(batches)
    was_training = module.training
    module.eval()
    try:
        on_step("calibration: reference forwards")
        reference, stats = _reference(module, layers, batches)
        scores: dict[str, dict[str, float]] = {}
        total = len(layers) * len(knowledge.formats)
        for i, layer in enumerate(layers):
            scores[layer.name] = {}
            for j, (name, fmt) in enumerate(knowledge.formats.items()):
                on_step(f"calibration {_bar(i * len(knowledge.formats) + j, total)} "
                        f"{layer.name or '(root)'} at {name}")
                act = (knowledge.activation_format(fmt) if activations
                       and layer.module_type not in knowledge.embedding_types else None)
                outputs = _quantized_run(module, layer, fmt, act, batches)
                scores[layer.name][name] = sqnr_db(reference, outputs)
    finally:
        module.train(was_training)
    return Calibration(len(batches), stats, scores)


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def _quantized_run(module: torch.nn.Module, layer: Layer, fmt: NumberFormatLike,
                   act: NumberFormatLike | None, batches: Sequence[Inputs]) -> torch.Tensor:
    weight = layer.weight
    original = weight.data
    handle = None
    if act is not None:
        def quantize_input(_: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            first = args[0]
            if isinstance(first, torch.Tensor) and first.is_floating_point():
                return (act.fake_quantize(first.reshape(1, -1), 0).reshape(first.shape),
                        *args[1:])
            return args
        handle = layer.module.register_forward_pre_hook(quantize_input)
    try:
        weight.data = fmt.fake_quantize(original, layer.axis)
        return torch.cat([run_model(module, b) for b in batches])
    finally:
        weight.data = original
        if handle is not None:
            handle.remove()


def _reference(module: torch.nn.Module, layers: Sequence[Layer], batches: Sequence[Inputs]
               ) -> tuple[torch.Tensor, dict[str, ActivationStats]]:
    sums: dict[str, dict[str, Any]] = {layer.name: {} for layer in layers}
    handles = [layer.module.register_forward_hook(_recorder(sums[layer.name], layer))
               for layer in layers]
    try:
        outputs = torch.cat([run_model(module, b) for b in batches])
    finally:
        for handle in handles:
            handle.remove()
    return outputs, {name: _stats(s) for name, s in sums.items() if s}


def _recorder(acc: dict[str, Any], layer: Layer) -> Callable[..., None]:
    channel_dim = 1 if "Conv" in layer.module_type and layer.module_type != "Conv1D" else -1

    def hook(_: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 1:
            x = x.detach().float()
            channels = x.movedim(channel_dim, 0).reshape(x.shape[channel_dim], -1).abs()
            prev = acc.get("channel_absmax")
            current = channels.amax(dim=1)
            acc["channel_absmax"] = current if prev is None else torch.maximum(prev, current)
            _moments(acc, "in", x)
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            _moments(acc, "out", output.detach().float())
    return hook


def _moments(acc: dict[str, Any], key: str, x: torch.Tensor) -> None:
    n, s, s2, m = acc.get(key, (0, 0.0, 0.0, 0.0))
    acc[key] = (n + x.numel(), s + float(x.sum()), s2 + float((x * x).sum()),
                max(m, float(x.abs().max())) if x.numel() else m)


def _ratio(moments: tuple[int, float, float, float] | None) -> tuple[float, float]:
    """(absmax, absmax / std) from accumulated moments."""
    if not moments or moments[0] == 0:
        return 0.0, 0.0
    n, s, s2, m = moments
    std = math.sqrt(max(s2 / n - (s / n) ** 2, 1e-30))
    return m, m / std


def _stats(acc: Mapping[str, Any]) -> ActivationStats:
    absmax, ratio = _ratio(acc.get("in"))
    _, out_ratio = _ratio(acc.get("out"))
    channels = acc.get("channel_absmax")
    outliers, share = 0, 0.0
    if channels is not None and channels.numel():
        flags = channels > OUTLIER_RATIO * channels.median().clamp(min=1e-30)
        outliers, share = int(flags.sum()), float(flags.float().mean())
    return ActivationStats(absmax, ratio, outliers, share, out_ratio)
