"""FP8 base weights under LoRA (``--lora R --lora-base fp8``): the frozen linear weights held in
FP8 alone, as Transformer Engine's ``fp8_model_init`` holds them (MLPerf Training's Llama 2 70B
LoRA submissions, NVIDIA's v4.0 to v5.0), 1 B a weight where an FP8 recipe otherwise keeps the
bf16 weight and its FP8 copy (2 + 1 B).

Every linear layer but the output head holds its weight as a frozen ``float8_e4m3fn``
parameter, and each use (the forward, and the backward's input gradient, which saves the FP8
weight, not the cast) reads it cast to the layer input's dtype (one pass: 1 B read, 2 B
written per weight); under ``--precision fp8`` the plan runs the GEMM at the FP8 rate, the
weight found through the cast. NB: Transformer Engine's FP8 GEMM reads the FP8 weight itself,
so the cast is a pass it does not make: 3 B per weight and use, +3 % on the step of MLPerf's
Llama 2 70B LoRA on 8 H100s (``dp=2,tp=4,sp``), where the weights' 32 GiB less per GPU is
what makes the layout fit.

`fp8_weights(layers)` swaps the weights for the length of a ``with`` block and puts them back.
NB: a model that casts activations to a layer's weight dtype (T5's ``wo``) casts them to FP8
here, where Transformer Engine's ``Float8Tensor`` answers bf16; such a model cannot record
with ``--lora-base fp8``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn


class _MatMulFP8(torch.autograd.Function):
    """``x @ W.T + b`` on the FP8 weight cast to x's dtype, saving the FP8 weight (1 B a
    weight), not the cast, for the input gradient's own cast."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, stored: torch.Tensor, bias: torch.Tensor | None,
                stored_in_out: bool) -> torch.Tensor:
        ctx.save_for_backward(stored)
        ctx.stored_in_out = stored_in_out
        return F.linear(x, _cast(stored, x.dtype, stored_in_out), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (stored,) = ctx.saved_tensors
        return grad @ _cast(stored, grad.dtype, ctx.stored_in_out), None, None, None


def _cast(stored: torch.Tensor, dtype: torch.dtype, stored_in_out: bool) -> torch.Tensor:
    weight = stored.to(dtype)
    return weight.t() if stored_in_out else weight      # GPT-2's Conv1D: (in, out)


def _forward(layer: nn.Module, stored_in_out: bool, x: torch.Tensor) -> torch.Tensor:
    stored = cast(torch.Tensor, layer.weight)     # the run's stand-in for the parameter
    bias = layer.bias if isinstance(layer.bias, torch.Tensor) else None
    return _MatMulFP8.apply(x, stored, bias, stored_in_out)


@contextlib.contextmanager
def fp8_weights(layers: list[tuple[nn.Module, bool]]) -> Iterator[None]:
    """`layers` (each with whether its weight is stored (in, out), as GPT-2's ``Conv1D``)
    holding frozen FP8 weights inside the ``with`` block."""
    kept = []
    for layer, stored_in_out in layers:
        weight = layer.get_parameter("weight")
        stored = torch.empty(weight.shape, dtype=FP8, device=weight.device)
        layer.weight = nn.Parameter(stored, requires_grad=False)
        layer.forward = functools.partial(_forward, layer, stored_in_out)
        kept.append((layer, weight))
    try:
        yield
    finally:
        for layer, weight in kept:
            del layer.forward
            layer.weight = weight
