"""4-bit NormalFloat base weights under LoRA (``--lora R --lora-base nf4``): QLoRA (Dettmers et
al. 2023, arXiv:2305.14314) as `bitsandbytes` and PEFT run it (``BitsAndBytesConfig(
load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
bnb_4bit_compute_dtype=torch.bfloat16)``).

Every linear layer but the output head (the layers `transformers`' bitsandbytes integration
converts: it keeps the head) stores its frozen weight as NF4 — two 4-bit codes per byte, one
absmax per block of 64 weights, the absmaxes double-quantized (8-bit, one float32 scale per
256 of them): 0.5 + 1/64 + 4/16,384 B per weight, the paper's 4.127 bits — held as three
buffers of the layer. Compute is in bf16: each use of the weight dequantizes it first, one
kernel reading the codes and scales and writing the bf16 weight (``fxlens_nf4::dequantize``,
costed by `fxlens.rules.nf4`), then the bf16 GEMM; the backward dequantizes again for the
input gradient, as bitsandbytes' ``MatMul4Bit`` saves the quantized weight, not the bf16 one,
and computes no weight gradient. The layer's input is cast to bf16 and its output back to the
input's dtype, the bias cast to bf16 too (``Linear4bit.forward``).

`nf4_weights(model)` swaps the weights for the length of a ``with`` block (each layer's
``weight`` parameter out, the buffers and a forward of its own in) and puts them back after.
NB: a layer's ``bias`` is held in the model's dtype, as bitsandbytes keeps it. Under ``--plan``
the GEMM after a dequantization is a weight GEMM, its weight the codes (tensor parallelism
splits it as the bf16 layer, `fxlens.analyzer.plan.tensor_split.weight_param`); FSDP's sharding
of the 4-bit weights (FSDP-QLoRA) is not planned: buffers are whole on every rank.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BLOCK = 64                    # weights per absmax
SCALE_BLOCK = 256             # absmaxes per float32 scale (double quantization)
COMPUTE_DTYPE = torch.bfloat16
BUFFERS = ("weight_nf4", "weight_absmax", "weight_absmax_scale")
# the 16 NF4 levels (the paper's Appendix E values, normalised to [-1, 1])
LEVELS = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
          -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
          0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
          0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)


def nf4_bytes(numel: int) -> int:
    """Bytes an NF4 weight of `numel` elements takes, double-quantized."""
    blocks = math.ceil(numel / BLOCK)
    return math.ceil(numel / 2) + blocks + 4 * math.ceil(blocks / SCALE_BLOCK)


@torch.library.custom_op("fxlens_nf4::dequantize", mutates_args=())
def dequantize(codes: torch.Tensor, absmax: torch.Tensor, scale: torch.Tensor, rows: int,
               cols: int) -> torch.Tensor:
    """The (rows, cols) bf16 weight from its packed codes and double-quantized absmaxes."""
    table = torch.tensor(LEVELS, dtype=torch.float32, device=codes.device)
    pairs = torch.stack([codes >> 4, codes & 15], dim=-1).flatten()[: rows * cols].long()
    scales = scale.view(torch.float32) if scale.dtype == torch.int32 else scale.float()
    blocks = absmax.float() / 127 * scales.repeat_interleave(SCALE_BLOCK)[: absmax.numel()]
    values = table[pairs] * blocks.repeat_interleave(BLOCK)[: rows * cols]
    return values.view(rows, cols).to(COMPUTE_DTYPE)


@dequantize.register_fake
def _dequantize_fake(codes: torch.Tensor, absmax: torch.Tensor, scale: torch.Tensor,
                     rows: int, cols: int) -> torch.Tensor:
    return codes.new_empty((rows, cols), dtype=COMPUTE_DTYPE)


class _MatMul4Bit(torch.autograd.Function):
    """``x @ W.T + b`` on the dequantized weight, saving the quantized one for the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor,
                scale: torch.Tensor, bias: torch.Tensor | None, rows: int, cols: int
                ) -> torch.Tensor:
        ctx.save_for_backward(codes, absmax, scale)
        ctx.shape = (rows, cols)
        return F.linear(x, dequantize(codes, absmax, scale, rows, cols), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        weight = dequantize(*ctx.saved_tensors, *ctx.shape)
        return grad @ weight, None, None, None, None, None, None


def _forward(layer: nn.Module, rows: int, cols: int, x: torch.Tensor) -> torch.Tensor:
    buffers = [layer.get_buffer(name) for name in BUFFERS]
    bias = layer.bias.to(COMPUTE_DTYPE) if isinstance(layer.bias, torch.Tensor) else None
    out = _MatMul4Bit.apply(x.to(COMPUTE_DTYPE), *buffers, bias, rows, cols)
    return out.to(x.dtype)


@contextlib.contextmanager
def nf4_weights(layers: list[tuple[nn.Module, int, int]]) -> Iterator[None]:
    """`layers` (each with its input and output widths: an ``nn.Linear`` or GPT-2's
    ``Conv1D``) holding NF4 weights (see the module docstring) inside the ``with`` block."""
    kept = []
    for layer, width_in, width_out in layers:
        weight = layer.get_parameter("weight")
        blocks = math.ceil(weight.numel() / BLOCK)
        sizes = (math.ceil(weight.numel() / 2), blocks, math.ceil(blocks / SCALE_BLOCK))
        # the float32 scales held as their bits (int32): a step casts floating buffers to its
        # working dtype, where bitsandbytes keeps these in float32
        dtypes = (torch.uint8, torch.uint8, torch.int32)
        del layer.weight
        for name, size, dtype in zip(BUFFERS, sizes, dtypes, strict=True):
            layer.register_buffer(name, torch.zeros(size, dtype=dtype, device=weight.device))
        # model code that reads the weight's dtype or shape (T5's `wo.weight.dtype`) sees the
        # compute dtype, as bitsandbytes' quantized parameter answers; it holds no memory
        layer.weight = torch.empty(weight.shape, dtype=COMPUTE_DTYPE, device="meta")
        layer.forward = functools.partial(_forward, layer, width_out, width_in)
        kept.append((layer, weight))
    try:
        yield
    finally:
        for layer, weight in kept:
            del layer.forward
            for name in BUFFERS:
                delattr(layer, name)
            del layer.weight
            layer.weight = weight
