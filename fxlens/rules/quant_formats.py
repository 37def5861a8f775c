"""Quantization number formats (`fxlens.rules.quant`'s docstring lists them): how each
rounds a weight (`NumberFormat.fake_quantize`) and what it stores, scales included
(`NumberFormat.storage_bytes`); the formats every layer is scored at, and the activations'
format beside a weight format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import torch
from torch import nn

DEFAULT_GROUP_SIZE = 128
SCALE_BYTES = 2                 # fp16 scales
FP8_E4M3_MAX = 448.0
FP8_SCALE_BYTES = 4             # fp32 per-tensor scale



class Granularity(str, Enum):
    TENSOR = "per_tensor"
    CHANNEL = "per_channel"
    GROUP = "group"
    NONE = "none"


@dataclass(frozen=True)
class NumberFormat:
    """A weight number format: how it rounds and what it stores."""

    name: str
    kind: str                     # "int", "fp8" or "float" (a plain cast)
    bits: int
    granularity: Granularity
    group_size: int = DEFAULT_GROUP_SIZE

    def fake_quantize(self, weight: torch.Tensor, axis: int) -> torch.Tensor:
        """`weight` rounded to this format and back to its dtype (float32 maths)."""
        w = weight.detach().float()
        if self.kind == "float":
            return w.to(torch.bfloat16).to(weight.dtype)
        if self.kind == "fp8":
            scale = w.abs().amax().clamp(min=1e-12) / FP8_E4M3_MAX
            return ((w / scale).to(torch.float8_e4m3fn).float() * scale).to(weight.dtype)
        rows = w.movedim(axis, 0).reshape(w.shape[axis], -1)          # (C_out, K)
        q = _int_round(_grouped(rows, self.granularity, self.group_size), self.bits)
        out = q.reshape(rows.shape[0], -1)[:, : rows.shape[1]]
        shape = [w.shape[axis], *[s for i, s in enumerate(w.shape) if i != axis]]
        return out.reshape(shape).movedim(0, axis).to(weight.dtype)

    def storage_bytes(self, shape: tuple[int, ...], axis: int) -> int:
        """Bytes of a weight of `shape` in this format, scales included."""
        numel = math.prod(shape)
        data = math.ceil(numel * self.bits / 8)
        if self.kind == "float":
            return data
        if self.kind == "fp8":
            return data + FP8_SCALE_BYTES
        channels = shape[axis] if shape else 1
        scales = {Granularity.TENSOR: 1, Granularity.CHANNEL: channels,
                  Granularity.GROUP: channels * math.ceil(numel // max(channels, 1)
                                                          / self.group_size)}
        return data + SCALE_BYTES * scales.get(self.granularity, 0)


def _grouped(rows: torch.Tensor, granularity: Granularity, group: int) -> torch.Tensor:
    """(C, K) → (G, n): the sets of values sharing one scale."""
    if granularity is Granularity.TENSOR:
        return rows.reshape(1, -1)
    if granularity is Granularity.CHANNEL or rows.shape[1] <= group:
        return rows
    pad = (-rows.shape[1]) % group
    return nn.functional.pad(rows, (0, pad)).reshape(-1, group)


def _int_round(groups: torch.Tensor, bits: int) -> torch.Tensor:
    qmax = 2 ** (bits - 1) - 1
    scale = groups.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / qmax
    return torch.clamp(torch.round(groups / scale), -qmax, qmax) * scale


def formats(group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, NumberFormat]:
    """The four weight formats every layer is scored at, by name."""
    return {
        "int8_per_channel": NumberFormat("int8_per_channel", "int", 8, Granularity.CHANNEL),
        "int8_per_tensor": NumberFormat("int8_per_tensor", "int", 8, Granularity.TENSOR),
        f"int4_g{group_size}": NumberFormat(f"int4_g{group_size}", "int", 4, Granularity.GROUP,
                                            group_size),
        "fp8_e4m3": NumberFormat("fp8_e4m3", "fp8", 8, Granularity.TENSOR),
    }


BF16 = NumberFormat("bf16", "float", 16, Granularity.NONE)
INT8_ACTIVATIONS = NumberFormat("int8_act", "int", 8, Granularity.TENSOR)
FP8_ACTIVATIONS = NumberFormat("fp8_act", "fp8", 8, Granularity.TENSOR)


def activation_format(weight_format: NumberFormat) -> NumberFormat:
    """The format a layer's input activations take beside `weight_format` (``--activations``)."""
    return FP8_ACTIVATIONS if weight_format.kind == "fp8" else INT8_ACTIVATIONS
