"""Mamba-2's chunked scan as one op: its values and gradients are the reference's, its costs
the closed forms of `fxlens.rules.ssd`, and a captured Mamba-2 model runs each layer's scan as
that op (the CPU memory checks in tests/analyzer/test_measure.py show what it no longer saves)."""

from __future__ import annotations

import math

import torch

import fxlens.analyzer.capture.hf_ssd as hf_ssd
from fxlens.rules.conventions import FLOPS_PER_MAC, SPECIAL_FUNCTION_FLOPS
from tests.helpers import T, captured_kernel_ops, cost_of

b, tokens, heads, head_dim, groups, state, chunk = 2, 37, 4, 8, 2, 16, 16
chunks = math.ceil(tokens / chunk)


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, tokens, heads, head_dim), (b, tokens, heads), (heads,),
              (b, tokens, groups, state), (b, tokens, groups, state), (heads,), (heads,)]
    values = [torch.randn(s, generator=g) for s in shapes]
    values[2] = -values[2].abs()                       # A < 0, a decay
    return tuple(v.requires_grad_() for v in values)


def test_the_fused_scan_computes_the_references_values_and_gradients() -> None:
    x, dt, A, B, C, D, dt_bias = inputs()
    kwargs = dict(D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=(0.0, math.inf))
    reference = hf_ssd.SCAN.reference()(x, dt, A, B, C, chunk, **kwargs)
    fused = hf_ssd.fused_scan(x, dt, A, B, C, chunk, **kwargs)
    torch.testing.assert_close(fused, reference)
    grad = torch.randn_like(reference)
    leaves = (x, dt, A, B, C, D, dt_bias)
    for got, want in zip(torch.autograd.grad(fused, leaves, grad),
                         torch.autograd.grad(reference, leaves, grad), strict=True):
        torch.testing.assert_close(got, want)


def test_a_prefill_takes_the_ops_final_state_equal_to_the_references() -> None:
    x, dt, A, B, C, D, dt_bias = (t.detach() for t in inputs(1))
    kwargs = dict(D=D, dt_bias=dt_bias, dt_softplus=True, return_final_states=True)
    (out, final), (want_out, want_final) = (
        f(x, dt, A, B, C, chunk, **kwargs) for f in (hf_ssd.fused_scan, hf_ssd.SCAN.reference()))
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(final, want_final)


def test_a_call_with_a_cache_state_keeps_the_reference() -> None:
    x, dt, A, B, C, D, dt_bias = (t.detach() for t in inputs())
    start = torch.zeros(b, heads, head_dim, state)
    out, final = hf_ssd.fused_scan(x, dt, A, B, C, chunk, D=D, dt_bias=dt_bias,
                                   initial_states=start, return_final_states=True)
    assert final.shape == (b, heads, head_dim, state) and out.shape == x.shape


def specs() -> tuple:
    return (T(b, tokens, heads, head_dim, dtype="bfloat16"), T(b, tokens, heads, dtype="bfloat16"),
            T(heads), T(b, tokens, groups, state, dtype="bfloat16"),
            T(b, tokens, groups, state, dtype="bfloat16"), T(heads), T(heads))


def forward_macs() -> int:
    q, n, p = chunk, state, head_dim
    return b * chunks * (groups * q * q * n + heads * (q * n * p + q * q * p + q * n * p))


def pointwise() -> int:
    mask = heads * chunk * chunk * (SPECIAL_FUNCTION_FLOPS + 1)
    return b * chunks * (mask + heads * head_dim * state * 2)


def state_bytes() -> int:
    return b * chunks * heads * head_dim * state * 4


def test_the_forward_costs_four_matmul_passes_and_the_states_through_memory() -> None:
    x, dt, A, B, C, D, dt_bias = specs()
    cost = cost_of("fxlens_ssd.chunk_scan.default", x, dt, A, B, C, D, dt_bias, chunk, True,
                   0.0, math.inf)
    assert cost.flops == FLOPS_PER_MAC * forward_macs() + pointwise()
    inputs_read = sum(t.nbytes for t in (x, dt, A, B, C, D, dt_bias))
    # out, dA_cumsum and the final state (float32)
    outputs = x.nbytes + b * heads * chunks * chunk * 4 + b * heads * head_dim * state * 4
    assert cost.bytes_read == inputs_read + 2 * state_bytes()
    assert cost.bytes_written == outputs + 2 * state_bytes()


def test_the_backward_costs_twice_the_matmuls_and_its_states_twice() -> None:
    x, dt, A, B, C, D, dt_bias = specs()
    decay = T(b, heads, chunks, chunk)
    cost = cost_of("fxlens_ssd.chunk_scan_backward.default", x, x, x, dt, decay, A, B, C, D,
                   dt_bias, chunk, True, 0.0, math.inf)
    assert cost.flops == 2 * FLOPS_PER_MAC * forward_macs() + pointwise()
    grads = sum(t.nbytes for t in (x, dt, A, B, C, D, dt_bias))
    assert cost.bytes_written == grads + 4 * state_bytes()


def test_a_captured_mamba2_model_runs_its_scan_as_the_kernel_and_costs_it() -> None:
    from tests.models.hf_zoo_hybrid import build_mamba2

    module, kwargs = build_mamba2()
    _, scans = captured_kernel_ops(module, kwargs, "fxlens_ssd.chunk_scan")
    assert len(scans) == module.config.num_hidden_layers

