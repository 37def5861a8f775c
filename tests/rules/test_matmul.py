"""Matrix-product rules: closed forms, metamorphic identities, FlopCounterMode differentials."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from fxlens.analyzer.core.aten import meta_tensor, resolve_op
from fxlens.analyzer.core.graph import TensorSpec
from tests.helpers import T, cost_of

m, k, n, b = 3, 5, 7, 4
s, e = 11, 3  # routed token slots, experts (grouped GEMM)
kb, nb = 8, 16  # bf16 grouped-mm sizes: rows must be 16-byte aligned

CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    ("aten.mm.default", (T(m, k), T(k, n)), {}, 2 * m * k * n),
    ("aten.mm.dtype", (T(m, k, dtype="bfloat16"), T(k, n, dtype="bfloat16"), torch.float32), {},
     2 * m * k * n),
    ("aten.addmm.default", (T(n), T(m, k), T(k, n)), {}, 2 * m * k * n),
    ("aten.addmm.default", (T(m, n), T(m, k), T(k, n)), {"beta": 0.5, "alpha": 2}, 2 * m * k * n),
    ("aten.bmm.default", (T(b, m, k), T(b, k, n)), {}, 2 * b * m * k * n),
    ("aten.baddbmm.default", (T(b, m, n), T(b, m, k), T(b, k, n)), {}, 2 * b * m * k * n),
    ("aten.addbmm.default", (T(m, n), T(b, m, k), T(b, k, n)), {}, 2 * b * m * k * n),
    ("aten.matmul.default", (T(m, k), T(k, n)), {}, 2 * m * k * n),
    ("aten.matmul.default", (T(b, 1, m, k), T(2, k, n)), {}, 2 * b * 2 * m * k * n),
    ("aten.matmul.default", (T(k), T(k)), {}, 2 * k),
    ("aten.matmul.default", (T(m, k), T(k)), {}, 2 * m * k),
    ("aten.matmul.default", (T(k), T(b, k, n)), {}, 2 * b * k * n),
    ("aten.linear.default", (T(b, m, k), T(n, k)), {}, 2 * b * m * k * n),
    ("aten.linear.default", (T(b, m, k), T(n, k), T(n)), {}, 2 * b * m * k * n),
    ("aten.linear.default", (T(k), T(n, k)), {}, 2 * k * n),
    ("aten.dot.default", (T(k), T(k)), {}, 2 * k),
    ("aten.vdot.default", (T(k), T(k)), {}, 2 * k),
    ("aten.mv.default", (T(m, k), T(k)), {}, 2 * m * k),
    ("aten.addmv.default", (T(m), T(m, k), T(k)), {}, 2 * m * k),
    ("aten._scaled_mm.default",  # mat2 column-major, as the fp8 kernel requires
     (T(16, 32, dtype="float8_e4m3fn"), TensorSpec((32, 16), "float8_e4m3fn", (1, 32)), T(), T()),
     {"out_dtype": torch.bfloat16}, 2 * 16 * 32 * 16),
    ("aten._grouped_mm.default",
     (T(s, kb, dtype="bfloat16"), T(e, kb, nb, dtype="bfloat16"), T(e, dtype="int32")), {},
     2 * s * kb * nb),
    ("aten._grouped_mm.default",  # 3-d x 3-d: a plain batch of GEMMs
     (T(e, m, kb, dtype="bfloat16"), T(e, kb, nb, dtype="bfloat16")), {}, 2 * e * m * kb * nb),
    ("aten._grouped_mm.default",  # 2-d x 2-d: the groups split K
     (T(nb, e * kb, dtype="bfloat16"), T(e * kb, nb, dtype="bfloat16"), T(e, dtype="int32")), {},
     2 * nb * e * kb * nb),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES)
def test_closed_forms(target: str, args: tuple[Any, ...], kwargs: dict[str, Any], expected: int):
    assert cost_of(target, *args, **kwargs).flops == expected


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES[:3])
def test_bytes_left_to_the_default(target: str, args: tuple, kwargs: dict, expected: int):
    cost = cost_of(target, *args, **kwargs)
    assert (cost.bytes_read, cost.bytes_written) == (None, None)


def test_transformers_grouped_mm_fallback():
    pytest.importorskip("transformers.integrations.moe")
    x, w, offs = T(s, k), T(e, k, n), T(e, dtype="int64")
    assert cost_of("transformers.grouped_mm_fallback.default", x, w, offs).flops == 2 * s * k * n
    grads = cost_of("transformers.grouped_mm_fallback_backward.default", x, w, offs, T(s, n))
    assert grads.flops == 2 * (2 * s * k * n)  # grad_input and grad_weight GEMMs


@settings(max_examples=15, deadline=None)
@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=4), k=st.integers(1, 6),
       n=st.integers(1, 6))
def test_grouped_mm_fallback_matches_its_per_expert_mms(counts: list[int], k: int, n: int):
    """Only routed tokens count: the eager fallback's mms sum to 2·S·K·N, however split."""
    moe = pytest.importorskip("transformers.integrations.moe")
    s, e = sum(counts), len(counts)
    x, w = torch.randn(s, k), torch.randn(e, k, n)
    offs = torch.tensor(counts).cumsum(0)
    with FlopCounterMode(display=False) as counter:
        moe._grouped_mm_fallback(x, w, offs)
    ours = cost_of("transformers.grouped_mm_fallback.default", T(s, k), T(e, k, n),
                   T(e, dtype="int64")).flops
    assert ours == counter.get_total_flops() == 2 * s * k * n


@pytest.mark.parametrize(("x", "w", "expected"), [
    # GPT-2's lm_head: output rows of 50,257 bf16 values are not 16-byte aligned.
    (T(64, 768, dtype="bfloat16"), T(50257, 768, dtype="bfloat16"), "gemm-misaligned"),
    (T(64, 768, dtype="bfloat16"), T(50304, 768, dtype="bfloat16"), ""),
    (T(64, 8191, dtype="bfloat16"), T(64, 8191, dtype="bfloat16"), "gemm-misaligned"),
    (T(8191, 64, dtype="bfloat16"), T(64, 64, dtype="bfloat16"), ""),      # M is no stride
    (T(64, 768), T(50257, 768), ""),                                        # fp32: no mark
    (T(1, 768, dtype="bfloat16"), T(50257, 768, dtype="bfloat16"), ""),    # one row: GEMV
])
def test_tensor_core_alignment_names_the_kernel_class(x: TensorSpec, w: TensorSpec,
                                                      expected: str) -> None:
    assert cost_of("aten.linear.default", x, w).kernel == expected


def test_a_transposed_view_is_aligned_by_its_own_stride() -> None:
    """``x @ w.t()`` with w (N, K): the view's leading dimension is K, not N."""
    w_t = TensorSpec((768, 50257), "bfloat16", (1, 768))
    x = T(64, 768, dtype="bfloat16")
    out = T(64, 50257, dtype="bfloat16")
    cost = cost_of("aten.mm.default", x, w_t, given_outputs=(out,))
    assert cost.kernel == "gemm-misaligned"                # the output's rows still are not
    aligned = cost_of("aten.mm.default", x, TensorSpec((768, 50304), "bfloat16", (1, 768)),
                      given_outputs=(T(64, 50304, dtype="bfloat16"),))
    assert aligned.kernel == ""


def test_linear_is_matmul_with_the_transposed_weight():
    x, w = T(b, m, k), T(n, k)
    linear = cost_of("aten.linear.default", x, w, T(n)).flops
    assert linear == cost_of("aten.matmul.default", x, T(k, n)).flops
    assert linear == cost_of("aten.addmm.default", T(n), T(b * m, k), T(k, n)).flops


def test_flops_linear_in_batch():
    one = cost_of("aten.bmm.default", T(1, m, k), T(1, k, n)).flops
    assert cost_of("aten.bmm.default", T(b, m, k), T(b, k, n)).flops == b * one


# ---- differential: FlopCounterMode knows mm, addmm, bmm, baddbmm ----------------------

def _theirs(target: str, *specs: Any) -> int:
    args = [meta_tensor(x) if isinstance(x, TensorSpec) else x for x in specs]
    with FlopCounterMode(display=False) as counter:
        resolve_op(target)(*args)
    return counter.get_total_flops()


dims = st.integers(1, 64)


@settings(max_examples=25, deadline=None)
@given(m=dims, k=dims, n=dims, b=st.integers(1, 8))
def test_matches_flop_counter(m: int, k: int, n: int, b: int):
    calls = [
        ("aten.mm.default", (T(m, k), T(k, n))),
        ("aten.addmm.default", (T(n), T(m, k), T(k, n))),
        ("aten.bmm.default", (T(b, m, k), T(b, k, n))),
        ("aten.baddbmm.default", (T(b, m, n), T(b, m, k), T(b, k, n))),
    ]
    for target, specs in calls:
        assert cost_of(target, *specs).flops == _theirs(target, *specs), target


KNOWN_DIVERGENCES = [
    # (target, args, why FlopCounterMode differs)
    ("aten._grouped_mm.default",
     (T(s, kb, dtype="bfloat16"), T(e, kb, nb, dtype="bfloat16"), T(e, dtype="int32")),
     "torch 2.13 registers no formula for _grouped_mm (the MoE experts of transformers)"),
]


@pytest.mark.parametrize(("target", "args", "why"), KNOWN_DIVERGENCES)
def test_known_divergences(target: str, args: tuple, why: str):
    """Fails when PyTorch catches up, so the table stays true."""
    assert _theirs(target, *args) == 0, why
    assert cost_of(target, *args).flops > 0


def test_grouped_gemms_are_their_own_kernel_class():
    """MoE grouped GEMMs rate at the device's grouped share (Hopper 0.5, measured on an H200
    by bench/gpu/moe.py); devices without a measured share keep the GEMM factor. (A
    misaligned grouped GEMM cannot be built: the kernel refuses it.)"""
    from fxlens.rules.hardware import device

    aligned = cost_of("aten._grouped_mm.default", T(s, kb, dtype="bfloat16"),
                      T(e, kb, nb, dtype="bfloat16"), T(e, dtype="int32"))
    assert aligned.kernel == "gemm-grouped"
    assert device("h100").achievable_flops("bf16", "gemm-grouped") == pytest.approx(0.5 * 989.5e12)
    assert device("a100-80gb").achievable_flops("bf16", "gemm-grouped") == pytest.approx(
        0.7 * 312e12)
