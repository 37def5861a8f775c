"""Cost rules for matrix products: mm, addmm, bmm, baddbmm, matmul, linear, the vector
products, fp8 `_scaled_mm` and the grouped GEMMs of mixture-of-experts layers.

Legend: ``M, K, N`` for (M, K) @ (K, N); ``B`` a batch of products; ``S`` routed token slots,
``E`` experts. Every product costs ``FLOPS_PER_MAC`` (2) per multiply-add, i.e. ``2·M·K·N``.

Conventions:
- The ``beta·self + alpha·(...)`` epilogue of addmm/baddbmm/addmv/addbmm and the bias of
  linear/_scaled_mm/_grouped_mm are not counted (conventions.py, as FlopCounterMode).
- A product whose output has ``numel(out)`` elements, each a dot product over ``K``, costs
  ``2·numel(out)·K``; this one form covers matmul's broadcasting and 1-D cases and linear's
  leading dimensions.
- Grouped GEMMs (``_grouped_mm``, ``transformers.grouped_mm_fallback``) count only the routed
  token slots: input (S, K) sorted by expert against weights (E, K, N) is ``2·S·K·N`` however
  the S rows are split by ``offs`` (whose values a fake trace does not know, and need not).
- Backward of every product here is made of the same ops (mm/bmm on transposes) and is costed
  by these rules as it appears in a joint graph; the transformers fallback's opaque backward op
  is costed here as its two GEMMs.
- Bytes: the default (every input read once, the output written once) is right for a GEMM.
- Kernel class: a 16- or 8-bit product whose operands' or output's rows do not start on
  16-byte boundaries (a leading dimension such as GPT-2's 50,257-token vocabulary) runs on
  slower fallback kernels: ``Cost.kernel = "gemm-misaligned"``, rated by the device's
  `kernel_efficiency` (`fxlens.rules.hardware`). NB: fp32 products are not marked: without
  TF32 they run on the CUDA cores, where alignment costs little.

Known limitations: complex dtypes (vdot) are counted as real multiply-adds; the fp8 scales of
``_scaled_mm`` are not counted (one multiply per output element, negligible).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.analyzer.core.graph import TensorSpec, dtype_bytes
from fxlens.rules.conventions import FLOPS_PER_MAC
from fxlens.rules.hardware import GROUPED_GEMM, MISALIGNED_GEMM

aten = torch.ops.aten


TENSOR_CORE_ALIGNMENT_BYTES = 16     # cuBLAS's fast kernels want 16-byte aligned rows


def _gemm(call: OpCall, m: int, k: int, n: int, batch: int = 1) -> Cost:
    return Cost(flops=FLOPS_PER_MAC * batch * m * k * n, kernel=kernel_class(call))


def _dot_per_output(call: OpCall, k: int) -> Cost:
    """Each output element is a length-`k` dot product."""
    return Cost(flops=FLOPS_PER_MAC * call.out.numel * k, kernel=kernel_class(call))


def kernel_class(call: OpCall) -> str:
    """``gemm-misaligned`` for a 16- or 8-bit product with a matrix (operand or output) whose
    leading dimension is not a multiple of 16 bytes; else "" (the device's usual rate)."""
    matrices = [s for s in (*call.inputs, *call.outputs) if len(s.shape) >= 2]
    if not matrices or all(dtype_bytes(s.dtype) > 2 for s in matrices):
        return ""
    leads = (_leading_bytes(s) for s in matrices)
    aligned = all(lead % TENSOR_CORE_ALIGNMENT_BYTES == 0 for lead in leads)
    return "" if aligned else MISALIGNED_GEMM


def _leading_bytes(spec: TensorSpec) -> int:
    """Bytes from one row of the last two dims to the next (the BLAS leading dimension): the
    stride of the dim that is not the unit-stride one; a matrix with neither is copied first
    (aligned), counted as its contiguous width. A single row or column is a vector (GEMV
    kernels, no alignment rule): 0."""
    rows, cols = spec.shape[-2:]
    if rows == 1 or cols == 1:
        return 0
    strides = spec.stride[-2:] if len(spec.stride) == len(spec.shape) else (cols, 1)
    lead = strides[0] if strides[1] == 1 else strides[1] if strides[0] == 1 else cols
    return int(lead * dtype_bytes(spec.dtype))


@cost_rule(aten.mm, aten._scaled_mm)
def mm(call: OpCall) -> Cost:
    """(M, K) @ (K, N)."""
    (m, k), (_, n) = call.shape("self"), call.shape("mat2")
    return _gemm(call, m, k, n)


@cost_rule(aten.addmm)
def addmm(call: OpCall) -> Cost:
    """beta·self + (M, K) @ (K, N); the epilogue add is not counted."""
    (m, k), (_, n) = call.shape("mat1"), call.shape("mat2")
    return _gemm(call, m, k, n)


@cost_rule(aten.bmm)
def bmm(call: OpCall) -> Cost:
    """(B, M, K) @ (B, K, N)."""
    (b, m, k), (_, _, n) = call.shape("self"), call.shape("mat2")
    return _gemm(call, m, k, n, batch=b)


@cost_rule(aten.baddbmm, aten.addbmm)
def baddbmm(call: OpCall) -> Cost:
    """(B, M, K) @ (B, K, N), plus self; addbmm also sums over B (the same MAC chain)."""
    (b, m, k), (_, _, n) = call.shape("batch1"), call.shape("batch2")
    return _gemm(call, m, k, n, batch=b)


@cost_rule(aten.matmul, aten.dot, aten.vdot, aten.mv)
def matmul(call: OpCall) -> Cost:
    """Broadcast (..., M, K) @ (..., K, N), and the 1-D cases: K is the last dim of self."""
    return _dot_per_output(call, call.shape("self")[-1])


@cost_rule(aten.linear)
def linear(call: OpCall) -> Cost:
    """(..., K) @ (N, K)ᵀ; the bias add is not counted."""
    return _dot_per_output(call, call.shape("input")[-1])


@cost_rule(aten.addmv)
def addmv(call: OpCall) -> Cost:
    """beta·self + (M, K) @ (K,)."""
    m, k = call.shape("mat")
    return _gemm(call, m, k, 1)


@cost_rule(aten._grouped_mm)
def grouped_mm(call: OpCall) -> Cost:
    """(S, K) @ (E, K, N) → (S, N) routed by `offs`, and the other layouts.

    With both operands 2-D, the groups split K: (M, K_total) @ (K_total, N) → (E, M, N).
    Its own kernel class (``gemm-grouped``) unless misaligned.
    """
    a, b = call.shape("self"), call.shape("mat2")
    cost = (_gemm(call, a[0], a[1], b[1]) if len(a) == 2 and len(b) == 2
            else _dot_per_output(call, a[-1]))
    return cost if cost.kernel else replace(cost, kernel=GROUPED_GEMM)


@cost_rule("transformers.grouped_mm_fallback")
def grouped_mm_fallback(call: OpCall) -> Cost:
    """(S, K) @ (E, K, N) routed by `offs`, one mm per expert: 2·S·K·N."""
    (s, k), n = call.shape("input"), call.shape("weight")[-1]
    return _gemm(call, s, k, n)


@cost_rule("transformers.grouped_mm_fallback_backward")
def grouped_mm_fallback_backward(call: OpCall) -> Cost:
    """grad_input = grad_out @ Wᵀ and grad_weight = inputᵀ @ grad_out per expert: 2 GEMMs."""
    (s, k), n = call.shape("input"), call.shape("weight")[-1]
    return Cost(flops=2 * FLOPS_PER_MAC * s * k * n)
