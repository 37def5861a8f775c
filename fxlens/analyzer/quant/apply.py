"""`quantized(assignments)`: a module run with some layers' weights (and optionally their input
activations) fake-quantized, restored afterwards whatever happens.

One place swaps weights, so a layer measured alone (`fxlens.analyzer.quant.calibrated`) and a
whole model quantized for the task's own evaluation (`fxlens.analyzer.quant.task`) run the
same quantization: `Layer.quantize` (BatchNorms folded first, as deployment does) and, for
activations, the layer's first floating input rounded per tensor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxlens.analyzer.quant.types import NumberFormatLike
from fxlens.analyzer.quant.weights import Layer


@dataclass(frozen=True)
class Assignment:
    """One layer at one weight format; `activations`: its inputs' format, None to keep them."""

    layer: Layer
    weights: NumberFormatLike
    activations: NumberFormatLike | None = None


@contextlib.contextmanager
def quantized(assignments: Sequence[Assignment]) -> Iterator[None]:
    """While inside: every assigned layer's weight quantized, its inputs too where asked."""
    originals = [(a.layer.weight, a.layer.weight.data) for a in assignments]
    handles = []
    try:
        for a in assignments:
            quantized_weight = a.layer.quantize(a.weights)
            a.layer.weight.data = quantized_weight
            if a.activations is not None:
                handles.append(a.layer.module.register_forward_pre_hook(
                    _input_quantizer(a.activations)))
        yield
    finally:
        for weight, original in originals:
            weight.data = original
        for handle in handles:
            handle.remove()


def _input_quantizer(fmt: NumberFormatLike) -> Any:
    def quantize_input(_: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.is_floating_point():
            return (fmt.fake_quantize(first.reshape(1, -1), 0).reshape(first.shape), *args[1:])
        return args
    return quantize_input
