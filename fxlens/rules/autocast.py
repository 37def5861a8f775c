"""``torch.autocast``'s op lists where CUDA's differ from CPU's: what a GPU run casts.

A training step under an autocast precision (``--precision autocast-bf16``) is recorded under
CPU autocast on fake CPU tensors (`fxlens.analyzer.capture.autocast`). `CUDA_ONLY` names the
aten ops that CUDA autocast casts and CPU autocast leaves in their inputs' dtype, with CUDA's
policy; `cuda_autocast(dtype)` is the policy the pipeline hands the recording when the
analysis targets a GPU. Ops on both lists are left to CPU's policy.

Source: ``aten/src/ATen/autocast_mode.cpp`` (``KERNEL_CUDA`` registrations), and in torch 2.13
the dispatcher itself: every name here has an ``AutocastCUDA`` kernel and no ``AutocastCPU``
one (``torch._C._dispatch_has_kernel_for_dispatch_key``; `tests/rules/test_autocast.py`
pins it, so a torch that moves an op between lists fails there).

Those that change a transformer's memory: the norms (``layer_norm``, ``group_norm``),
``pow``/``exp``/``log``/``rsqrt`` (fp32 on CUDA), and the reductions and softmaxes run with
``dtype=float32`` (``softmax``, ``log_softmax``, ``sum``, ``cumsum``).
Checked on an H200 (torch 2.11+cu130, 2026-11-27): under CUDA autocast bf16, 38 calls (these
ops, and linear, SDPA, cross-entropy, cat, batch_norm, gelu, silu, mean left to CPU's policy)
gave the output dtypes the recording gives here.

NB: ``rms_norm`` has an ``AutocastCUDA`` kernel in torch 2.13 but kept a bf16 input bf16 on
that H200 (torch 2.11); its policy unchecked, it is left out (the input's dtype, as on CPU;
HF models write their RMSNorm by hand, in fp32). ``norm.Scalar``/``norm.ScalarOpt_dim``
(CUDA's ``fp32_append_dtype``, redispatched to the overload with a dtype) are cast to fp32
instead: the same dtypes, one cast op more.
"""

from __future__ import annotations

from collections.abc import Mapping

from fxlens.analyzer.capture.types import Autocast, Cast

_LOWER = (
    "_convolution", "convolution", "cudnn_convolution", "cudnn_convolution_transpose",
    "addmv", "addr", "mv", "einsum", "chain_matmul", "linalg_multi_dot",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
)
_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "dist",
    "pdist", "renorm", "logsumexp", "norm.Scalar", "norm.ScalarOpt_dim",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
_FP32_DTYPE = (
    "softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum", "cumprod",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord",
)
_PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "tensordot",
    "index_put", "scatter_add",
)

CUDA_ONLY: Mapping[str, Cast] = {
    **{op: Cast.LOWER for op in _LOWER},
    **{op: Cast.FP32 for op in _FP32},
    **{op: Cast.FP32_DTYPE for op in _FP32_DTYPE},
    **{op: Cast.PROMOTE for op in _PROMOTE},
}


def cuda_autocast(dtype: str) -> Autocast:
    """CUDA autocast in `dtype` ("bfloat16", "float16"), recorded under CPU autocast."""
    return Autocast(dtype, CUDA_ONLY, source="CUDA autocast's op lists (torch 2.13)")


def cpu_autocast(dtype: str) -> Autocast:
    """CPU autocast in `dtype`, as it is."""
    return Autocast(dtype, {}, source="CPU autocast's op lists")
