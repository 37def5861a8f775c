"""Attention rules: closed forms (dense, causal, GQA, mixed head dims, varlen), the causal
score count against a materialised mask, and FlopCounterMode differentials (which count only
the GEMMs, never discount causal masks and know neither the CPU flash kernel nor the raw
kernels' (B, T, H, d) layout)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from fxlens.analyzer.core.aten import meta_tensor, resolve_op
from fxlens.analyzer.core.graph import TensorSpec
from fxlens.rules.attention import (
    OUTPUT_DOT_FLOPS_PER_ELEMENT,
    SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT,
    causal_scores,
)
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT as SOFTMAX
from tests.helpers import T, cost_of

SOFTMAX_BWD = SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT
DOT = OUTPUT_DOT_FLOPS_PER_ELEMENT
b, hq, hkv, tq, tk, d, dv = 2, 8, 2, 12, 20, 16, 24


def qkv(t_q: int = tq, t_k: int = tk, heads_kv: int = hq, d_v: int = d) -> tuple[TensorSpec, ...]:
    return T(b, hq, t_q, d), T(b, heads_kv, t_k, d), T(b, heads_kv, t_k, d_v)


def dense(t_q: int, t_k: int, d_qk: int = d, d_v: int = d) -> int:
    """Forward of every head: QKᵀ + AV + softmax on each of the T_q·T_k scores."""
    return b * hq * t_q * t_k * (2 * d_qk + 2 * d_v + SOFTMAX)


def causal_square(t: int) -> int:
    return t * (t + 1) // 2


SDPA = "aten.scaled_dot_product_attention.default"
FORWARD_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    (SDPA, qkv(), {}, b * hq * tq * tk * (4 * d + SOFTMAX)),
    (SDPA, qkv(tq, tq), {"is_causal": True}, b * hq * causal_square(tq) * (4 * d + SOFTMAX)),
    # T_q < T_k, top-left: query i sees i + 1 keys
    (SDPA, qkv(tq, tk), {"is_causal": True}, b * hq * causal_square(tq) * (4 * d + SOFTMAX)),
    # T_q > T_k: the rows past T_k see every key
    (SDPA, qkv(tk, tq), {"is_causal": True},
     b * hq * (causal_square(tq) + (tk - tq) * tq) * (4 * d + SOFTMAX)),
    (SDPA, qkv(heads_kv=hkv), {"enable_gqa": True}, dense(tq, tk)),  # follows the query heads
    (SDPA, qkv(d_v=dv), {}, dense(tq, tk, d, dv)),
    (SDPA, (*qkv(), T(tq, tk)), {}, dense(tq, tk)),  # an additive mask is not discounted
    ("aten._scaled_dot_product_flash_attention.default", qkv(), {"is_causal": True},
     b * hq * causal_square(tq) * (4 * d + SOFTMAX)),
    ("aten._scaled_dot_product_flash_attention_for_cpu.default", qkv(), {}, dense(tq, tk)),
    ("aten._scaled_dot_product_efficient_attention.default", (*qkv(), None, True), {},
     dense(tq, tk)),
    ("aten._scaled_dot_product_cudnn_attention.default", (*qkv(), None, True), {}, dense(tq, tk)),
    # the unfused math path computes the whole square even when causal
    ("aten._scaled_dot_product_attention_math.default", qkv(), {"is_causal": True},
     dense(tq, tk)),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), FORWARD_CASES)
def test_forward_closed_forms(target: str, args: tuple, kwargs: dict[str, Any], expected: int):
    assert cost_of(target, *args, **kwargs).flops == expected


def seq_first(t_q: int = tq, t_k: int = tk) -> tuple[TensorSpec, ...]:
    """The raw kernels' (B, T, H, d) layout."""
    return T(b, t_q, hq, d), T(b, t_k, hq, d), T(b, t_k, hq, d)


RAW_CASES: list[tuple[str, tuple[Any, ...], int]] = [
    ("aten._flash_attention_forward.default",
     (*seq_first(), None, None, tq, tk, 0.0, False, False), dense(tq, tk)),
    ("aten._flash_attention_forward.default",
     (*seq_first(tq, tq), None, None, tq, tq, 0.0, True, False),
     b * hq * causal_square(tq) * (4 * d + SOFTMAX)),
    ("aten._efficient_attention_forward.default",
     (*seq_first(), None, None, None, tq, tk, 0.0, 0), dense(tq, tk)),
    ("aten._efficient_attention_forward.default",  # 1: causal from the top left
     (*seq_first(), None, None, None, tq, tk, 0.0, 1),
     b * hq * causal_square(tq) * (4 * d + SOFTMAX)),
    ("aten._efficient_attention_forward.default",  # 2: causal from the bottom right
     (*seq_first(), None, None, None, tq, tk, 0.0, 2),
     b * hq * (tq * (tk - tq) + causal_square(tq)) * (4 * d + SOFTMAX)),
]


@pytest.mark.parametrize(("target", "args", "expected"), RAW_CASES)
def test_raw_kernels_read_the_seq_first_layout(target: str, args: tuple, expected: int):
    assert cost_of(target, *args).flops == expected


def test_varlen_flash_counts_each_sequence_at_max_length():
    seqs, total, max_len = 3, 20, 9
    q = T(total, hq, d)
    offsets = T(seqs + 1, dtype="int32")
    args = (q, q, q, offsets, offsets, max_len, max_len, 0.0, False, False)
    assert cost_of("aten._flash_attention_forward.default", *args).flops == (
        seqs * hq * max_len * max_len * (4 * d + SOFTMAX))


def backward(scores: int, d_qk: int = d, d_v: int = d, t_q: int = tq) -> int:
    """Five GEMMs (recompute QKᵀ, dP, dV, dQ, dK) + softmax backward + D = rowsum(dO ⊙ O)."""
    per_score = 2 * d_qk + 2 * d_v + 2 * d_v + 2 * d_qk + 2 * d_qk + SOFTMAX_BWD
    return b * hq * (scores * per_score + DOT * t_q * d_v)


def test_backward_is_two_and_a_half_forward_gemms():
    q, k, v = qkv()
    lse = T(b, hq, tq)
    cost = cost_of("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
                   q, q, k, v, q, lse, 0.0, False)
    assert cost.flops == backward(tq * tk)
    gemms = cost.flops - b * hq * (tq * tk * SOFTMAX_BWD + DOT * tq * d)
    assert gemms * 2 == 5 * b * hq * tq * tk * 4 * d


def test_causal_backward_counts_computed_scores():
    q, k, v = qkv(tq, tq)
    cost = cost_of("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
                   q, q, k, v, q, T(b, hq, tq), 0.0, True)
    assert cost.flops == backward(causal_square(tq))


def test_raw_efficient_backward_bottom_right():
    q, k, v = seq_first()
    args = (q, q, k, v, None, q, None, None, tq, tk, T(b, hq, 32), 0.0, T(), T(), 2, False)
    scores = tq * (tk - tq) + causal_square(tq)
    assert cost_of("aten._efficient_attention_backward.default", *args).flops == backward(scores)


def test_math_path_moves_the_score_matrix_through_memory():
    q, k, v = qkv()
    cost = cost_of("aten._scaled_dot_product_attention_math.default", q, k, v)
    scores_bytes = b * hq * tq * tk * 4
    io_read = q.nbytes + k.nbytes + v.nbytes
    assert cost.bytes_read == io_read + 2 * scores_bytes  # softmax reads S, A·V reads P
    assert cost.bytes_written == q.nbytes + scores_bytes + scores_bytes  # O, P (an output), S


def test_fused_kernels_leave_bytes_to_the_default():
    cost = cost_of(SDPA, *qkv())
    assert (cost.bytes_read, cost.bytes_written) == (None, None)


@settings(max_examples=25, deadline=None)
@given(t_q=st.integers(1, 40), t_k=st.integers(1, 40), bottom_right=st.booleans())
def test_causal_scores_match_a_materialised_mask(t_q: int, t_k: int, bottom_right: bool):
    offset = t_k - t_q if bottom_right else 0
    mask = torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=offset)
    assert causal_scores(t_q, t_k, offset) == int(mask.sum())


# ---- differential: FlopCounterMode counts the GEMMs only ------------------------------

def _theirs(target: str, *specs: Any) -> int:
    args = [meta_tensor(x) if isinstance(x, TensorSpec) else x for x in specs]
    with FlopCounterMode(display=False) as counter:
        resolve_op(target)(*args)
    return counter.get_total_flops()


shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 33), st.integers(1, 33),
                   st.sampled_from([8, 16, 64]))


@settings(max_examples=25, deadline=None)
@given(shape=shapes)
def test_forward_matches_flop_counter_plus_softmax(shape: tuple[int, ...]):
    b, h, t_q, t_k, d = shape
    q, k, v = T(b, h, t_q, d), T(b, h, t_k, d), T(b, h, t_k, d)
    softmax = b * h * t_q * t_k * SOFTMAX
    for target, args in [
        ("aten._scaled_dot_product_flash_attention.default", (q, k, v)),
        ("aten._scaled_dot_product_efficient_attention.default", (q, k, v, None, True)),
        ("aten._scaled_dot_product_cudnn_attention.default", (q, k, v, None, True)),
    ]:
        assert cost_of(target, *args).flops == _theirs(target, *args) + softmax, target


@settings(max_examples=25, deadline=None)
@given(shape=shapes)
def test_backward_matches_flop_counter_plus_softmax_backward(shape: tuple[int, ...]):
    b, h, t_q, t_k, d = shape
    q, k, v = T(b, h, t_q, d), T(b, h, t_k, d), T(b, h, t_k, d)
    lse, seed = T(b, h, t_q), T(2, dtype="int64")
    elementwise = b * h * (t_q * t_k * SOFTMAX_BWD + DOT * t_q * d)
    for target, args in [
        ("aten._scaled_dot_product_flash_attention_backward.default",
         (q, q, k, v, q, lse, None, None, t_q, t_k, 0.0, False, seed, seed)),
        ("aten._scaled_dot_product_efficient_attention_backward.default",
         (q, q, k, v, T(b, h, t_q, t_k), q, lse, seed, seed, 0.0, [True, True, True, False])),
        ("aten._scaled_dot_product_cudnn_attention_backward.default",
         (q, q, k, v, q, lse, seed, seed, T(b, h, t_q, t_k), None, None, t_q, t_k, 0.0, False)),
    ]:
        assert cost_of(target, *args).flops == _theirs(target, *args) + elementwise, target


@settings(max_examples=25, deadline=None)
@given(shape=shapes)
def test_raw_kernels_match_flop_counter_on_the_sdpa_layout(shape: tuple[int, ...]):
    """Same work as the (B, H, T, d) op; FlopCounterMode reads the raw (B, T, H, d) tensors as
    if they were (B, H, T, d), so it is the reference only through the sdpa-level op."""
    b, h, t_q, t_k, d = shape
    raw = (T(b, t_q, h, d), T(b, t_k, h, d), T(b, t_k, h, d))
    flash = cost_of("aten._flash_attention_forward.default",
                    *raw, None, None, t_q, t_k, 0.0, False, False).flops
    efficient = cost_of("aten._efficient_attention_forward.default",
                        *raw, None, None, None, t_q, t_k, 0.0, 0).flops
    sdpa = (T(b, h, t_q, d), T(b, h, t_k, d), T(b, h, t_k, d))
    theirs = _theirs("aten._scaled_dot_product_flash_attention.default", *sdpa)
    assert flash == efficient == theirs + b * h * t_q * t_k * SOFTMAX


KNOWN_DIVERGENCES: list[tuple[str, tuple[Any, ...], dict[str, Any], int, str]] = [
    ("aten._scaled_dot_product_flash_attention_for_cpu.default", qkv(), {}, 0,
     "torch 2.13 registers no formula for the CPU flash kernel"),
    ("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
     (qkv()[0], *qkv(), qkv()[0], T(b, hq, tq), 0.0, False), {}, 0,
     "torch 2.13 registers no formula for the CPU flash kernel's backward"),
    ("aten._scaled_dot_product_flash_attention.default", qkv(tq, tq), {"is_causal": True},
     b * hq * tq * tq * 4 * d, "FlopCounterMode counts the dense square for causal attention"),
    ("aten._flash_attention_forward.default",
     (*seq_first(tq, tq), None, None, tq, tq, 0.0, False, False), {}, b * tq * hq * hq * 4 * d,
     "FlopCounterMode reads the raw kernels' (B, T, H, d) tensors as (B, H, T, d)"),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "theirs", "why"), KNOWN_DIVERGENCES)
def test_known_divergences(target: str, args: tuple, kwargs: dict, theirs: int, why: str):
    """Fails when PyTorch changes, so the table stays true; ours is checked above."""
    meta = [meta_tensor(x) if isinstance(x, TensorSpec) else x for x in args]
    with FlopCounterMode(display=False) as counter:
        resolve_op(target)(*meta, **kwargs)
    assert counter.get_total_flops() == theirs, why
    assert cost_of(target, *args, **kwargs).flops != theirs


@settings(max_examples=15, deadline=None)
@given(shape=shapes, kv_groups=st.sampled_from([1, 2]), causal=st.booleans())
def test_math_path_matches_its_own_decomposition(shape: tuple[int, ...], kv_groups: int,
                                                 causal: bool):
    """The math op decomposes into bmm's before FlopCounterMode sees it: an eager oracle,
    GQA included (the decomposition repeats K and V to the query heads)."""
    b, h, t_q, t_k, d = shape
    h_q = h * kv_groups
    q, k, v = torch.randn(b, h_q, t_q, d), torch.randn(b, h, t_k, d), torch.randn(b, h, t_k, d)
    with FlopCounterMode(display=False) as counter:
        torch.ops.aten._scaled_dot_product_attention_math(q, k, v, is_causal=causal,
                                                          enable_gqa=True)
    ours = cost_of("aten._scaled_dot_product_attention_math.default", T(b, h_q, t_q, d),
                   T(b, h, t_k, d), T(b, h, t_k, d), is_causal=causal, enable_gqa=True).flops
    assert ours == counter.get_total_flops() + b * h_q * t_q * t_k * SOFTMAX


@pytest.mark.filterwarnings("ignore:.*were assigned during export")  # torch's RNN internals
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")
def test_capture_pins_the_attention_ops():
    """Pinned for torch 2.13 on CPU: export keeps the composite op; a traced training step
    runs the CPU flash kernel and its backward. All three have rules here."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxlens.rules import load_rules

    class Attention(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(Attention()(q, k, v).sum(), (q, k, v))

    x = [torch.randn(b, hq, tq, d, requires_grad=True) for _ in range(3)]
    program = torch.export.export(Attention(), tuple(x), strict=False).run_decompositions({})
    exported = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert exported == {SDPA}
    joint = make_fx(step, tracing_mode="fake")(*x)
    traced = {str(n.target) for n in joint.graph.nodes if "attention" in str(n.target)}
    assert traced == {"aten._scaled_dot_product_flash_attention_for_cpu.default",
                      "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"}
    assert all(load_rules().knows(t) for t in exported | traced)


def test_fused_attention_runs_at_the_devices_attention_share():
    """Fused attention is its own kernel class: on Hopper at 0.55 (forward) and 0.45
    (backward) of the dense peak, as cuDNN's kernels measured on an H200; the math path and
    devices without a measured share keep the GEMM factor."""
    from fxlens.rules.hardware import device

    q, k, v = qkv(tq, tq)
    forward = cost_of("aten._scaled_dot_product_flash_attention_for_cpu.default", q, k, v,
                      0.0, True)
    backward_cost = cost_of("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
                            q, q, k, v, q, T(b, hq, tq), 0.0, True)
    h100, a100 = device("h100"), device("a100-80gb")
    assert (forward.kernel, backward_cost.kernel) == ("attention-forward", "attention-backward")
    assert h100.achievable_flops("bf16", forward.kernel) == pytest.approx(0.55 * 989.5e12)
    assert h100.achievable_flops("bf16", backward_cost.kernel) == pytest.approx(0.45 * 989.5e12)
    assert a100.achievable_flops("bf16", forward.kernel) == a100.achievable_flops("bf16")
    math = cost_of("aten._scaled_dot_product_attention_math.default", q, k, v)
    assert math.kernel == ""
