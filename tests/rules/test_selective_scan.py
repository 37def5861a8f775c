"""Mamba-1's selective scan as one op: its values, final state and gradients are the
reference's, its costs the closed forms of `fxlens.rules.selective_scan`, and a captured
Mamba-1 model (Mamba, Jamba) runs each mixer's scan as that op, not a loop over tokens."""

from __future__ import annotations

import pytest
import torch

import fxlens.analyzer.capture.hf_selective_scan as hf_scan
from fxlens.rules.conventions import SPECIAL_FUNCTION_FLOPS
from tests.helpers import T, captured_kernel_ops, cost_of

b, channels, tokens, states = 2, 6, 37, 4


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(b, channels, tokens), (b, channels, tokens), (channels, states),
              (b, states, tokens), (b, states, tokens), (channels,), (b, channels, tokens),
              (channels,)]
    values = [torch.randn(s, generator=gen) for s in shapes]
    values[2] = -values[2].abs()                       # A < 0, a decay
    return tuple(v.requires_grad_() for v in values)


def test_the_fused_scan_computes_the_references_values_state_and_gradients() -> None:
    u, delta, A, B, C, D, z, bias = leaves = inputs()
    kwargs = dict(D=D, z=z, delta_bias=bias, delta_softplus=True, return_last_state=True)
    (out, final), (want, want_final) = (f(u, delta, A, B, C, **kwargs)
                                        for f in (hf_scan.fused_scan, hf_scan.SCAN.reference()))
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(final, want_final.float())
    grad = torch.randn_like(want)
    for got, expected in zip(torch.autograd.grad(out, leaves, grad),
                             torch.autograd.grad(want, leaves, grad), strict=True):
        torch.testing.assert_close(got, expected)


def test_the_op_keeps_each_chunks_last_state_and_the_decay_that_led_to_it() -> None:
    A, D = (t.detach() for t in inputs(1)[2::3])
    long = 2 * hf_scan.CHUNK + 5
    gen = torch.Generator().manual_seed(2)
    u, z = (torch.randn(1, channels, long, generator=gen) for _ in range(2))
    delta = 0.01 * torch.rand(1, channels, long, generator=gen)      # small steps: no overflow
    bias = 0.01 * torch.rand(channels, generator=gen)
    B = torch.randn(1, states, long, generator=gen)
    _, saved, final = hf_scan.selective_scan(u, delta, A, B, B, D, z, bias, False)
    assert saved.shape == (1, channels, 3, 2 * states)
    torch.testing.assert_close(saved[:, :, -1, states:], final)
    head = slice(0, hf_scan.CHUNK)       # the first chunk alone ends in the first saved state
    _, first = hf_scan.SCAN.reference()(u[..., head], delta[..., head], A, B[..., head],
                                    B[..., head], D=D, z=z[..., head], delta_bias=bias,
                                    return_last_state=True)
    torch.testing.assert_close(saved[:, :, 0, states:], first.float())
    decay = torch.exp(A[None] * (delta[..., head] + bias[:, None]).sum(-1)[..., None])
    torch.testing.assert_close(saved[:, :, 0, :states], decay)


def test_a_call_without_a_gate_keeps_the_reference() -> None:
    u, delta, A, B, C, D, _, bias = (t.detach() for t in inputs())
    out = hf_scan.fused_scan(u, delta, A, B, C, D=D, delta_bias=bias, delta_softplus=True)
    torch.testing.assert_close(out, hf_scan.SCAN.reference()(u, delta, A, B, C, D=D,
                                                         delta_bias=bias,
                                                         delta_softplus=True))


def specs() -> tuple:
    x = T(b, channels, tokens, dtype="bfloat16")
    return (x, x, T(channels, states), T(b, states, tokens, dtype="bfloat16"),
            T(b, states, tokens, dtype="bfloat16"), T(channels), x, T(channels))


PER_TOKEN = 3 * SPECIAL_FUNCTION_FLOPS + 7      # softplus, δ·u, the skip, the gate


def test_the_forward_costs_one_pass_over_every_state() -> None:
    args = specs()
    cost = cost_of("fxlens_mamba.selective_scan.default", *args, True)
    elements = b * channels * tokens
    assert cost.flops == elements * (states * (SPECIAL_FUNCTION_FLOPS + 6) + PER_TOKEN)
    assert cost.bytes_read == sum(t.nbytes for t in args)
    chunks_saved = b * channels * 1 * 2 * states * 4
    outputs = elements * 2 + chunks_saved + b * channels * states * 4
    assert cost.bytes_written == outputs + elements * 2      # + the ungated output


def test_the_backward_recomputes_the_states_and_scans_back() -> None:
    u, delta, A, B, C, D, z, bias = specs()
    saved = T(b, channels, 1, 2 * states)
    cost = cost_of("fxlens_mamba.selective_scan_backward.default", u, u, saved, u, delta, A,
                   B, C, D, z, bias, True)
    elements = b * channels * tokens
    assert cost.flops == elements * (states * (SPECIAL_FUNCTION_FLOPS + 20) + 2 * PER_TOKEN)
    assert cost.bytes_written == sum(t.nbytes for t in (u, delta, A, B, C, D, z, bias))


@pytest.mark.parametrize("build", ["build_mamba", "build_jamba"])
def test_a_captured_mamba_model_runs_its_scan_as_the_kernel(build: str) -> None:
    import tests.models.hf_zoo as zoo

    module, kwargs = getattr(zoo, build)()
    graph, scans = captured_kernel_ops(module, kwargs, "fxlens_mamba.selective_scan")
    mixers = [m for m in module.modules() if type(m).__name__.endswith("Mixer")]
    assert mixers and len(scans) == len(mixers)
    # no per-token loop left: the reference stacks one output per token
    assert not any(str(n.target).startswith("aten.stack") for n in graph.nodes)
