"""What eager PyTorch refuses that fake and meta kernels let through.

A capture runs on fake tensors, whose kernels check shapes but not that the two operands of a
product share a dtype: an ``int64`` input into an ``nn.Linear`` traces and costs as float32,
while the eager run raises ``mat1 and mat2 must have the same dtype``. `SAME_DTYPE_OPERANDS`
names, per op packet, the two operands eager kernels require to share a dtype (the bias is
left out: some backends accept an fp32 bias on bf16 operands), and the pipeline refuses a
captured graph where they differ (`fxlens.analyzer.capture.check.mixed_dtypes`).

NB: from the CPU and CUDA kernels of torch 2.13 (``addmm_impl_cpu_``, ``convolution``'s
``check_input_same_type_as_parameters``); fp8 ``_scaled_mm`` mixes dtypes by design and is
not listed.
"""

from __future__ import annotations

from collections.abc import Mapping

_CONV = ("input", "weight")

SAME_DTYPE_OPERANDS: Mapping[str, tuple[str, str]] = {
    "aten.mm": ("self", "mat2"), "aten.bmm": ("self", "mat2"),
    "aten.addmm": ("mat1", "mat2"), "aten.baddbmm": ("batch1", "batch2"),
    "aten.addbmm": ("batch1", "batch2"), "aten.matmul": ("self", "other"),
    "aten.dot": ("self", "tensor"), "aten.vdot": ("self", "other"),
    "aten.mv": ("self", "vec"), "aten.addmv": ("mat", "vec"), "aten.linear": ("input", "weight"),
    **{f"aten.{name}": _CONV for name in (
        "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d")},
}
