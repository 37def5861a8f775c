"""Chunked gated delta rules (gated DeltaNet's, a decay per head; Kimi Delta Attention's, per key
channel) as one op: its values and gradients are the references', its costs the closed forms of
`fxlens.rules.gdn`, and a captured model runs each linear-attention layer's rule as that op
(the CPU memory checks in tests/analyzer/test_measure.py and test_training_step.py show what it
no longer saves)."""

from __future__ import annotations

import math

import pytest
import torch

import fxlens.analyzer.capture.hf_gdn as hf_gdn
from fxlens.analyzer.core.costs import Recurrence
from fxlens.rules.conventions import FLOPS_PER_MAC, SPECIAL_FUNCTION_FLOPS
from tests.helpers import T, captured_kernel_ops, cost_of

b, tokens, k_heads, heads, key_dim, value_dim, chunk = 2, 37, 2, 4, 8, 12, 16
chunks = math.ceil(tokens / chunk)


def inputs(seed: int = 0, per_channel: bool = False) -> tuple[torch.Tensor, ...]:
    """KDA's reference has as many key heads as value heads."""
    gen = torch.Generator().manual_seed(seed)
    qk_heads = heads if per_channel else k_heads
    q, k = (torch.randn(b, tokens, qk_heads, key_dim, generator=gen) for _ in range(2))
    v = torch.randn(b, tokens, heads, value_dim, generator=gen)
    decay = (b, tokens, heads, key_dim) if per_channel else (b, tokens, heads)
    g = -torch.rand(decay, generator=gen)                         # a log decay, ≤ 0
    beta = torch.rand(b, tokens, heads, generator=gen)
    return tuple(t.requires_grad_() for t in (q, k, v, g, beta))


RULES = {False: hf_gdn.PER_HEAD, True: hf_gdn.PER_CHANNEL}


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("l2norm", [True, False])
def test_the_fused_rule_computes_the_references_values_state_and_gradients(
        l2norm: bool, per_channel: bool) -> None:
    leaves = inputs(per_channel=per_channel)
    kwargs = dict(chunk_size=chunk, output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
    name = RULES[per_channel]
    (out, final), (want, want_final) = (f(*leaves[:3], g=leaves[3], beta=leaves[4], **kwargs)
                                        for f in (hf_gdn.FUSED[name], name.reference()))
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(final, want_final)
    grad = torch.randn_like(want)
    for got, expected in zip(torch.autograd.grad(out, leaves, grad),
                             torch.autograd.grad(want, leaves, grad), strict=True):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_op_keeps_the_systems_the_kernels_save(per_channel: bool) -> None:
    """A, per chunk and head, inverts I + the strictly lower part of β·K·Kᵀ ⊙ decay; KDA's
    kernels also keep the decayed scores Q·Kᵀ (scaled, the diagonal in). Built here token
    by token, channel by channel."""
    q, k, v, g, beta = (t.detach() for t in inputs(1, per_channel))
    _, saved, _ = hf_gdn.chunk(q, k, v, g, beta, chunk, False)
    assert saved.shape == (b, tokens, heads, chunk * (2 if per_channel else 1))
    keys, queries = (x.repeat_interleave(heads // x.shape[2], dim=2) for x in (k, q))
    decay = g if per_channel else g[..., None].expand(b, tokens, heads, key_dim)

    def score(left: torch.Tensor, batch: int, head: int, ti: int, tj: int) -> torch.Tensor:
        gaps = torch.exp(decay[batch, tj + 1:ti + 1, head].sum(0))     # per channel
        return (left[batch, ti, head] * keys[batch, tj, head] * gaps).sum()

    for start in range(0, tokens, chunk):
        rows = range(start, min(start + chunk, tokens))
        n = len(rows)
        for batch in range(b):
            for head in range(heads):
                system, scores = torch.eye(n), torch.zeros(n, n)
                for i, ti in enumerate(rows):
                    for j, tj in enumerate(rows[:i + 1]):
                        scores[i, j] = score(queries, batch, head, ti, tj) * key_dim ** -0.5
                        if j < i:
                            system[i, j] = beta[batch, ti, head] * score(keys, batch, head,
                                                                         ti, tj)
                block = saved[batch, start:start + n, head]
                torch.testing.assert_close(block[:, :n] @ system, torch.eye(n), atol=1e-4,
                                           rtol=1e-4)
                if per_channel:
                    torch.testing.assert_close(block[:, chunk:chunk + n], scores, atol=1e-4,
                                               rtol=1e-4)


def test_a_call_with_a_cache_state_keeps_the_reference() -> None:
    q, k, v, g, beta = (t.detach() for t in inputs())
    start = torch.zeros(b, heads, key_dim, value_dim)
    out, final = hf_gdn.FUSED[hf_gdn.PER_HEAD](q, k, v, g, beta, chunk_size=chunk,
                                               initial_state=start, output_final_state=True)
    want, want_final = hf_gdn.PER_HEAD.reference()(q, k, v, g, beta, chunk_size=chunk,
                                           initial_state=start, output_final_state=True)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(final, want_final)


def specs(per_channel: bool) -> tuple:
    decay = (b, tokens, heads, key_dim) if per_channel else (b, tokens, heads)
    return (T(b, tokens, k_heads, key_dim, dtype="bfloat16"),
            T(b, tokens, k_heads, key_dim, dtype="bfloat16"),
            T(b, tokens, heads, value_dim, dtype="bfloat16"), T(*decay),
            T(b, tokens, heads, dtype="bfloat16"))


def per_chunk(kk: int, vv: int, kv: int, cube: float, diagonal: int, per_channel: bool) -> int:
    c, k, v = chunk, key_dim, value_dim
    sub_blocks = 2 * 16 * c * k if per_channel else 0    # both squares' 16 × 16 diagonals
    return int(b * chunks * heads * (kk * c * c * k + vv * c * c * v + kv * c * k * v
                                     + cube * c ** 3 + diagonal * sub_blocks))


def pointwise(per_channel: bool) -> int:
    exp = SPECIAL_FUNCTION_FLOPS + 1
    if per_channel:     # the diagonal sub-blocks' decays, Q and K each decayed both ways
        decays = (2 * 16 * chunk * key_dim + 4 * chunk * key_dim) * exp
    else:               # one decay per score of both squares
        decays = 2 * chunk * chunk * exp
    return b * chunks * heads * (decays + 2 * key_dim * value_dim)


def states() -> int:
    return b * chunks * heads * key_dim * value_dim * 2


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_forward_costs_its_kernels_and_their_hand_offs(per_channel: bool) -> None:
    q, k, v, g, beta = specs(per_channel)
    cost = cost_of("fxlens_gdn.chunk.default", q, k, v, g, beta, chunk, True)
    assert cost.flops == FLOPS_PER_MAC * per_chunk(3, 2, 3, 1 / 6, 1, per_channel) \
        + pointwise(per_channel)
    token_heads = b * tokens * heads
    decay = 4 * (key_dim if per_channel else 1)             # float32 chunk sums
    inputs_read = sum(t.nbytes for t in (q, k, v, g, beta))
    # out, what the backward reads (one chunk row per token and head; KDA's scores too),
    # the final state (float32)
    saved = token_heads * chunk * 2 * (2 if per_channel else 1)
    outputs = v.nbytes + saved + b * heads * key_dim * value_dim * 4
    handed = token_heads * (4 * chunk + 2 * (key_dim + 2 * value_dim) + decay) + states()
    assert cost.bytes_written == outputs + handed
    assert cost.bytes_read == (inputs_read + handed
                               + token_heads * (2 * chunk + 3 * 2 * key_dim + 3 * decay))


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_backward_recomputes_and_costs_its_gradient_kernels(per_channel: bool) -> None:
    q, k, v, g, beta = specs(per_channel)
    saved = T(b, tokens, heads, chunk * (2 if per_channel else 1), dtype="bfloat16")
    cost = cost_of("fxlens_gdn.chunk_backward.default", v, q, k, v, g, beta, saved, chunk,
                   True)
    assert cost.flops == FLOPS_PER_MAC * per_chunk(8, 5, 8, 2, 2, per_channel) \
        + pointwise(per_channel)
    assert cost.flops > 2 * FLOPS_PER_MAC * per_chunk(3, 2, 3, 1 / 6, 1, per_channel)
    grads = sum(t.nbytes for t in (q, k, v, g, beta))
    token_heads = b * tokens * heads
    decay = 4 * (key_dim if per_channel else 1)
    assert cost.bytes_written == grads + token_heads * (2 * (3 * key_dim + 4 * value_dim)
                                                        + 2 * decay) + 2 * states()


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_state_kernels_walk_the_chunks_in_order(per_channel: bool) -> None:
    """Forward: one step per chunk (``fwd_h``); backward: ``fwd_h`` again and ``bwd_dhu``,
    whose step measured 1.85 forward steps on an H200; one program per sequence, value head
    and 32 value channels walks them."""
    q, k, v, g, beta = specs(per_channel)
    forward = cost_of("fxlens_gdn.chunk.default", q, k, v, g, beta, chunk, True)
    saved = T(b, tokens, heads, chunk * (2 if per_channel else 1), dtype="bfloat16")
    backward = cost_of("fxlens_gdn.chunk_backward.default", v, q, k, v, g, beta, saved, chunk,
                       True)
    programs = b * heads * -(-value_dim // 32)
    assert forward.recurrence == Recurrence(chunks, programs)
    assert backward.recurrence is not None and backward.recurrence.programs == programs
    assert backward.recurrence.steps == pytest.approx(2.85 * chunks)


def test_a_decay_per_channel_costs_more_than_one_per_head() -> None:
    head, channel = (cost_of("fxlens_gdn.chunk.default", *specs(c), chunk, True)
                     for c in (False, True))
    assert channel.flops > head.flops and channel.bytes_read > head.bytes_read


@pytest.mark.parametrize("build", ["build_qwen3_next", "build_qwen3_5", "build_olmo_hybrid",
                                   "build_kimi_linear"])
def test_a_captured_delta_rule_model_runs_its_rule_as_the_kernel(build: str) -> None:
    import tests.models.hf_zoo_hybrid as zoo

    module, kwargs = getattr(zoo, build)()
    graph, rules = captured_kernel_ops(module, kwargs, "fxlens_gdn.chunk")
    targets = [str(n.target) for n in graph.nodes]
    linear = module.config.layer_types.count("linear_attention")
    assert linear and len(rules) == linear
    # the references' triangular solve is gone, and KDA's chunk × chunk × channel decays
    assert not any("solve_triangular" in t for t in targets)
    assert max(len(o.shape) for n in graph.nodes for o in n.outputs if o is not None) < 6
