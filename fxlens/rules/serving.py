"""What serving engines run at reduced precision (`fxlens.serve_pass`, `fxlens.analyzer.serve`).

- FP8 (``--precision fp8`` with ``--serve``): the linear layers' weights are stored in FP8
  (1 byte) and their GEMMs run at the FP8 peak, as TensorRT-LLM's and vLLM's FP8 checkpoints
  (NVIDIA ModelOpt) do; the vocabulary projection (``lm_head``) and the embeddings stay at
  16 bits (ModelOpt's default quantization config excludes ``*lm_head*``), so do norms and
  attention. NB: the GEMMs' activations are FP8 too in those engines; they are counted at 16
  bits here (an over-estimate of decode bytes below 1 % at batch 1).
- KV cache dtype (``--kv-dtype``): the bytes per cached element; attention reads the cache at
  that width (FP8 KV attention kernels dequantize in registers).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

# Torch-free at import (the CLI's option checks read the tables below before torch loads).
WEIGHT_GEMMS = frozenset({"aten.linear", "aten.addmm", "aten.mm"})
KEPT_16_BIT = ("lm_head",)          # module names whose weights stay at 16 bits under FP8

SERVE_PRECISIONS = ("bf16", "fp8")   # bf16: the model's own 16-bit weights, as loaded
KV_DTYPE_BYTES: Mapping[str, int] = {"fp8": 1, "int8": 1, "fp16": 2, "bf16": 2}


def op_packet(target: str) -> str:
    """``aten.linear.default`` → ``aten.linear``."""
    return target.rsplit(".", 1)[0] if target.count(".") >= 2 else target


def weight_gemm(target: str, module: str) -> bool:
    """Whether a kernel is a linear layer's GEMM whose weight FP8 serving stores in FP8."""
    return op_packet(target) in WEIGHT_GEMMS and not any(
        module == name or module.endswith("." + name) for name in KEPT_16_BIT)


def cache_attention(target: str) -> bool:
    """Whether a kernel is fused attention, which reads the KV cache in a decode step."""
    return op_packet(target) in _fused_attention()


@functools.cache
def _fused_attention() -> frozenset[str]:
    from fxlens.rules.attention import FUSED_FORWARD

    return frozenset(str(op) for op in FUSED_FORWARD)
