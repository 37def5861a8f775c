"""Gated DeltaNet's chunked rule as one op: its values and gradients are the reference's, its
costs the closed forms of `fxlens.rules.gdn`, and a captured gated-DeltaNet model runs each
linear-attention layer's rule as that op (the CPU memory checks in tests/analyzer/test_measure.py
and test_training_step.py show what it no longer saves)."""

from __future__ import annotations

import math

import pytest
import torch

import fxlens.analyzer.capture.hf_gdn as hf_gdn
from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.costs import OpCall
from fxlens.rules import load_rules
from fxlens.rules.conventions import FLOPS_PER_MAC, SPECIAL_FUNCTION_FLOPS
from tests.helpers import T, cost_of

b, tokens, k_heads, heads, key_dim, value_dim, chunk = 2, 37, 2, 4, 8, 12, 16
chunks = math.ceil(tokens / chunk)


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, tokens, k_heads, key_dim, generator=gen) for _ in range(2))
    v = torch.randn(b, tokens, heads, value_dim, generator=gen)
    g = -torch.rand(b, tokens, heads, generator=gen)              # a log decay, ≤ 0
    beta = torch.rand(b, tokens, heads, generator=gen)
    return tuple(t.requires_grad_() for t in (q, k, v, g, beta))


@pytest.mark.parametrize("l2norm", [True, False])
def test_the_fused_rule_computes_the_references_values_state_and_gradients(l2norm: bool
                                                                          ) -> None:
    leaves = inputs()
    kwargs = dict(chunk_size=chunk, output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
    (out, final), (want, want_final) = (f(*leaves[:3], g=leaves[3], beta=leaves[4], **kwargs)
                                        for f in (hf_gdn.fused_rule, hf_gdn._reference()))
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(final, want_final)
    grad = torch.randn_like(want)
    for got, expected in zip(torch.autograd.grad(out, leaves, grad),
                             torch.autograd.grad(want, leaves, grad), strict=True):
        torch.testing.assert_close(got, expected)


def test_the_op_keeps_the_solved_system_the_kernel_saves() -> None:
    """A, per chunk and head, inverts I + the strictly lower part of β·K·Kᵀ ⊙ decay, built
    here token by token."""
    q, k, v, g, beta = (t.detach() for t in inputs(1))
    _, solved, _ = hf_gdn.chunk(q, k, v, g, beta, chunk, False)
    assert solved.shape == (b, tokens, heads, chunk)
    keys = k.repeat_interleave(heads // k_heads, dim=2)
    for start in range(0, tokens, chunk):
        rows = range(start, min(start + chunk, tokens))
        n = len(rows)
        for batch in range(b):
            for head in range(heads):
                system = torch.eye(n)
                for i, ti in enumerate(rows):
                    for j, tj in enumerate(rows[:i]):
                        decay = torch.exp(g[batch, tj + 1:ti + 1, head].sum())
                        dot = keys[batch, ti, head] @ keys[batch, tj, head]
                        system[i, j] = beta[batch, ti, head] * dot * decay
                block = solved[batch, start:start + n, head, :n]
                torch.testing.assert_close(block @ system, torch.eye(n), atol=1e-4, rtol=1e-4)


def test_a_call_with_a_cache_state_keeps_the_reference() -> None:
    q, k, v, g, beta = (t.detach() for t in inputs())
    start = torch.zeros(b, heads, key_dim, value_dim)
    out, final = hf_gdn.fused_rule(q, k, v, g, beta, chunk_size=chunk, initial_state=start,
                                   output_final_state=True)
    want, want_final = hf_gdn._reference()(q, k, v, g, beta, chunk_size=chunk,
                                           initial_state=start, output_final_state=True)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(final, want_final)


def specs() -> tuple:
    return (T(b, tokens, k_heads, key_dim, dtype="bfloat16"),
            T(b, tokens, k_heads, key_dim, dtype="bfloat16"),
            T(b, tokens, heads, value_dim, dtype="bfloat16"), T(b, tokens, heads),
            T(b, tokens, heads, dtype="bfloat16"))


def per_chunk(kk: int, vv: int, kv: int, cube: float) -> int:
    c, k, v = chunk, key_dim, value_dim
    return int(b * chunks * heads * (kk * c * c * k + vv * c * c * v + kv * c * k * v
                                     + cube * c ** 3))


def pointwise() -> int:
    return b * chunks * heads * (2 * chunk * chunk * (SPECIAL_FUNCTION_FLOPS + 1)
                                 + 2 * key_dim * value_dim)


def states() -> int:
    return b * chunks * heads * key_dim * value_dim * 2


def test_the_forward_costs_five_kernels_and_their_hand_offs() -> None:
    q, k, v, g, beta = specs()
    cost = cost_of("fxlens_gdn.chunk.default", q, k, v, g, beta, chunk, True)
    assert cost.flops == FLOPS_PER_MAC * per_chunk(3, 2, 3, 1 / 6) + pointwise()
    token_heads = b * tokens * heads
    inputs_read = sum(t.nbytes for t in (q, k, v, g, beta))
    # out (bf16), A (bf16, one row of the chunk per token and head), the final state (fp32)
    outputs = v.nbytes + token_heads * chunk * 2 + b * heads * key_dim * value_dim * 4
    handed = token_heads * (4 * chunk + 2 * (key_dim + 2 * value_dim)) + states()
    assert cost.bytes_written == outputs + handed
    assert cost.bytes_read == (inputs_read + handed
                               + token_heads * (2 * chunk + 3 * 2 * key_dim + 3 * 4))


def test_the_backward_recomputes_and_costs_its_gradient_kernels() -> None:
    q, k, v, g, beta = specs()
    solved = T(b, tokens, heads, chunk, dtype="bfloat16")
    cost = cost_of("fxlens_gdn.chunk_backward.default", v, q, k, v, g, beta, solved, chunk,
                   True)
    assert cost.flops == FLOPS_PER_MAC * per_chunk(8, 5, 8, 2) + pointwise()
    assert cost.flops > 2 * (FLOPS_PER_MAC * per_chunk(3, 2, 3, 1 / 6))
    grads = sum(t.nbytes for t in (q, k, v, g, beta))
    token_heads = b * tokens * heads
    assert cost.bytes_written == grads + token_heads * 2 * (3 * key_dim + 4 * value_dim) \
        + 2 * states()


@pytest.mark.parametrize("build", ["build_qwen3_next", "build_qwen3_5", "build_olmo_hybrid"])
def test_a_captured_gated_deltanet_model_runs_its_rule_as_the_kernel(build: str) -> None:
    import tests.models.hf_zoo_hybrid as zoo

    module, kwargs = getattr(zoo, build)()
    module.eval()
    registry = load_rules()
    with torch.no_grad():
        graph = capture(module, kwargs, registry)
    targets = [str(n.target) for n in graph.nodes]
    rules = [n for n in graph.nodes if str(n.target).startswith("fxlens_gdn.chunk")]
    linear = module.config.layer_types.count("linear_attention")
    assert linear and len(rules) == linear
    assert not any("solve_triangular" in t for t in targets)   # the reference's solve is gone
    for node in rules:                 # costed by the rule, at the closed form's size
        rule = registry.lookup(node)
        assert callable(rule) and rule(OpCall(node, graph)).flops > 0
