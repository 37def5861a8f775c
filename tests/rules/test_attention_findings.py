"""Attention counted as its kernel runs, and FUS009 saying what a kernel that skips masked
scores would skip.

Property tests over random attention calls (batch, query and key/value heads for GQA, query
and key lengths, separate value head dims, boolean and float causal masks, sliding windows):
a call handed any explicit mask counts the dense square, ``is_causal=True`` the lower
triangle; a call handed an exactly causal or banded mask carries the finding, whose FLOPs are
the masked scores by the closed form B·H·(T_q·T_k − allowed)·(2·d_qk + 2·d_v + 8).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.fusion.kernels import analyze_fusion
from fxlens.rules import load_rules
from fxlens.rules.attention import causal_scores
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT as SOFTMAX
from fxlens.rules.fusion import fusion_rules, kinds_of

MASKS = ("is_causal", "bool tril", "float -inf", "float finfo.min", "bool window", "none")


def causal_mask(kind: str, t_q: int, t_k: int) -> torch.Tensor | None:
    """Top-left causal when T_q == T_k, aligned to the last key otherwise; "bool window": each
    query sees its last two keys."""
    qi = torch.arange(t_q)[:, None] + (t_k - t_q)
    kj = torch.arange(t_k)[None, :]
    allowed = kj <= qi
    if kind == "bool tril":
        return allowed
    if kind == "bool window":
        return allowed & (kj > qi - 2)
    if kind == "float -inf":
        return torch.zeros(t_q, t_k).masked_fill(~allowed, float("-inf"))
    if kind == "float finfo.min":
        return torch.zeros(t_q, t_k).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return None


class Attention(torch.nn.Module):
    def __init__(self, kind: str, gqa: bool) -> None:
        super().__init__()
        self.kind, self.gqa = kind, gqa

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = causal_mask(self.kind, q.shape[-2], k.shape[-2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              is_causal=self.kind == "is_causal",
                                              enable_gqa=self.gqa)


def per_score(d_qk: int, d_v: int) -> int:
    return 2 * d_qk + 2 * d_v + SOFTMAX


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(b=st.integers(1, 2), kv_heads=st.integers(1, 3), groups=st.integers(1, 3),
       t_q=st.integers(1, 12), extra=st.integers(0, 6), d_qk=st.sampled_from([4, 8, 12]),
       d_v=st.sampled_from([4, 8, 6]), kind=st.sampled_from(MASKS))
def test_explicit_masks_count_dense_and_is_causal_the_triangle(
        b: int, kv_heads: int, groups: int, t_q: int, extra: int, d_qk: int, d_v: int,
        kind: str) -> None:
    check_masked_call(b, kv_heads, groups, t_q, extra, d_qk, d_v, kind)


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize(("b", "kv_heads", "groups", "t_q", "extra", "d_qk", "d_v"),
                         [(1, 1, 1, 1, 0, 4, 4),       # one query, one key
                          (2, 2, 3, 7, 5, 12, 6),      # GQA, more keys than queries, d_v ≠ d_qk
                          (1, 3, 1, 12, 0, 8, 8)])     # square, heads without groups
def test_each_mask_kind_on_fixed_calls(b: int, kv_heads: int, groups: int, t_q: int,
                                       extra: int, d_qk: int, d_v: int, kind: str) -> None:
    """The property's cases the fast loop runs (the random sweep above is slow)."""
    check_masked_call(b, kv_heads, groups, t_q, extra, d_qk, d_v, kind)


def check_masked_call(b: int, kv_heads: int, groups: int, t_q: int, extra: int, d_qk: int,
                      d_v: int, kind: str) -> None:
    t_k = t_q + (0 if kind == "is_causal" else extra)   # is_causal is top-left: T_q == T_k
    heads = kv_heads * groups
    q = torch.randn(b, heads, t_q, d_qk)
    k, v = torch.randn(b, kv_heads, t_k, d_qk), torch.randn(b, kv_heads, t_k, d_v)
    registry = load_rules()
    graph = capture(Attention(kind, groups > 1), (q, k, v), registry, methods=("make_fx",))
    report = analyze(graph, registry, strict=True)
    (node,) = [n for n in report.nodes if "scaled_dot_product" in n.target]
    scores = causal_scores(t_q, t_k) if kind == "is_causal" else t_q * t_k
    assert node.flops == b * heads * scores * per_score(d_qk, d_v), node.note
    assert node.note.startswith("causal" if kind == "is_causal" else "dense")

    fusion = analyze_fusion(report, graph, kinds_of(list(graph.nodes), registry),
                            fusion_rules(registry), registry.lookup, 1e12, lambda _n, f: f / 1e15)
    found = [f for f in fusion.findings if f.code == "FUS009"]
    mask = causal_mask(kind, t_q, t_k)
    if mask is None:
        assert found == []
        return
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    skipped = b * heads * (t_q * t_k - int(allowed.sum())) * per_score(d_qk, d_v)
    if skipped == 0:      # every key seen by every query: nothing to skip
        assert found == []
        return
    (finding,) = found
    assert finding.saved_flops == skipped
    assert finding.saved_s == pytest.approx(finding.saved_bytes / 1e12 + skipped / 1e15)
    window = not torch.equal(allowed, causal_mask("bool tril", t_q, t_k))
    assert ("window_size" in finding.fix) is window
    assert ("causal_lower_right" in finding.fix) is (t_q != t_k and not window)


class BufferMask(torch.nn.Module):
    """nanoGPT's and GPT-2's pattern: a causal mask registered as a bool buffer, sliced to
    the sequence and handed to SDPA."""

    def __init__(self, t_max: int) -> None:
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(t_max, t_max, dtype=torch.bool))
                             .view(1, 1, t_max, t_max))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        t = q.shape[-2]
        return F.scaled_dot_product_attention(q, q, q, attn_mask=self.bias[:, :, :t, :t])


@pytest.mark.parametrize("method", ["export", "make_fx", "record"])
def test_a_causal_mask_held_in_a_buffer_is_judged_by_its_values(method: str) -> None:
    """The buffer's values are kept on the graph (`Node.value`), so every capture method
    judges the mask exactly causal: dense count, and FUS009 saving the masked scores."""
    q = torch.randn(2, 3, 20, 8)
    registry = load_rules()
    graph = capture(BufferMask(32), (q,), registry, methods=(method,))
    report = analyze(graph, registry, strict=True)
    (node,) = [n for n in report.nodes if "scaled_dot_product" in n.target]
    assert node.flops == 2 * 3 * 20 * 20 * per_score(8, 8)
    assert "exactly causal" in node.note, node.note
    fusion = analyze_fusion(report, graph, kinds_of(list(graph.nodes), registry),
                            fusion_rules(registry), registry.lookup, 1e12, lambda _n, f: f / 1e15)
    (finding,) = [f for f in fusion.findings if f.code == "FUS009"]
    assert finding.saved_flops == 2 * 3 * (20 * 20 - causal_scores(20, 20)) * per_score(8, 8)
