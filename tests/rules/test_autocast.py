"""CUDA autocast's op lists where they differ from CPU's (fxlens/rules/autocast.py), pinned
against torch's dispatcher: a torch that moves an op between the lists fails here."""

from __future__ import annotations

import pytest
import torch

from fxlens.analyzer.capture.autocast import aten_overload
from fxlens.analyzer.capture.types import Cast
from fxlens.rules.autocast import CUDA_ONLY, cpu_autocast, cuda_autocast

has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key

# CUDA-only registrations left out of the table, and why.
LEFT_OUT = {
    "aten::rms_norm": "its policy unchecked on a GPU; torch 2.11 on an H200 kept bf16 bf16",
    "aten::_scaled_dot_product_flash_attention": "a CUDA kernel; never called on CPU tensors",
}


def qualified(name: str) -> str:
    op = aten_overload(name)
    assert op is not None, f"aten.{name} is not in this torch"
    return op.name()


@pytest.mark.parametrize("name", sorted(CUDA_ONLY))
def test_each_op_has_a_cuda_policy_and_no_cpu_one(name: str) -> None:
    op = qualified(name)
    assert has_kernel(op, "AutocastCUDA") and not has_kernel(op, "AutocastCPU")


def test_the_table_is_every_cuda_only_registration_but_the_ones_left_out() -> None:
    ops = torch._C._dispatch_get_all_op_names()
    cuda_only = {op for op in ops if op.startswith("aten::")
                 and has_kernel(op, "AutocastCUDA") and not has_kernel(op, "AutocastCPU")}
    assert cuda_only - set(LEFT_OUT) == {qualified(name) for name in CUDA_ONLY}


@pytest.mark.parametrize("name", sorted(n for n, c in CUDA_ONLY.items() if c is Cast.FP32_DTYPE))
def test_ops_computed_in_fp32_take_a_dtype_argument(name: str) -> None:
    op = aten_overload(name)
    assert op is not None and "dtype" in [a.name for a in op._schema.arguments]


def test_cpu_policy_adds_no_casts() -> None:
    assert cpu_autocast("bfloat16").casts == {}
    assert cuda_autocast("float16").dtype == "float16"
    assert cuda_autocast("bfloat16").casts["layer_norm"] is Cast.FP32
