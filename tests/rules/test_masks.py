"""Attention masks built in the graph: an explicit mask counts every score (the kernel handed
it computes them all); its values say what it allows, named in the note and the verdict.

Each case is a tiny module that builds a mask and calls SDPA with it (``is_causal=False``);
it is captured with make_fx (fast) and the SDPA rule's verdict, FLOPs and note are checked.
Expected FLOPs are the derivation: B·H·scores·(4·d + 8).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.costs import Cost, OpCall
from fxlens.rules import load_rules, mask_values, masks
from fxlens.rules.attention import causal_scores
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT as SOFTMAX

B, H, T, D = 2, 2, 8, 4
MaskFn = Callable[[torch.Tensor], torch.Tensor]   # query (B, H, T_q, d) -> mask


def positions(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query, key) positions broadcast to (T, 1) and (1, T), as transformers builds them."""
    return torch.arange(t)[:, None], torch.arange(t)[None, :]


def kv_le_q(q: torch.Tensor) -> torch.Tensor:
    qi, kj = positions(q.shape[-2])
    return (kj <= qi)[None, None].expand(q.shape[0], 1, -1, -1)


def window(size: int) -> MaskFn:
    def build(q: torch.Tensor) -> torch.Tensor:
        qi, kj = positions(q.shape[-2])
        return (kj <= qi) & (kj > qi - size)
    return build


def additive_causal(q: torch.Tensor) -> torch.Tensor:
    return torch.full((q.shape[-2], q.shape[-2]), float("-inf")).triu(1)


def finfo_min_causal(q: torch.Tensor) -> torch.Tensor:
    t = q.shape[-2]
    keep = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.zeros(t, t).masked_fill(~keep, torch.finfo(torch.float32).min)


def alibi_causal(q: torch.Tensor) -> torch.Tensor:
    qi, kj = positions(q.shape[-2])
    return (kj - qi).float().masked_fill(kj > qi, float("-inf"))


class Masked(torch.nn.Module):
    def __init__(self, build: MaskFn | None, is_causal: bool = False) -> None:
        super().__init__()
        self.build, self.is_causal = build, is_causal

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        mask = self.build(q) if self.build is not None else None
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=self.is_causal)


class FromInput(torch.nn.Module):
    def forward(self, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


class FromBuffer(torch.nn.Module):
    """A causal mask held in a buffer: bool values are kept by the capture (`Node.value`),
    a float (additive) buffer's are not — floats are weights or data."""

    def __init__(self, dtype: torch.dtype = torch.bool) -> None:
        super().__init__()
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        self.register_buffer("mask", causal if dtype == torch.bool else
                             torch.zeros(T, T, dtype=dtype).masked_fill(~causal, -math.inf))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, attn_mask=self.mask)


def sdpa_cost(module: torch.nn.Module, *inputs: torch.Tensor) -> Cost:
    registry = load_rules()
    graph = capture(module, inputs, registry, methods=("make_fx",))
    (node,) = [n for n in graph.calls() if n.packet == "aten.scaled_dot_product_attention"]
    rule = registry.lookup(node)
    assert callable(rule)
    return rule(OpCall(node, graph))


def flops(scores: int) -> int:
    return B * H * scores * (4 * D + SOFTMAX)


CAUSAL, DENSE = causal_scores(T, T), T * T
EXACT = "dense: the mask is exactly causal"
q = torch.randn(B, H, T, D)

CASES: list[tuple[str, torch.nn.Module, int, str]] = [
    ("is_causal", Masked(None, is_causal=True), CAUSAL, "causal: is_causal=True"),
    ("no mask", Masked(None), DENSE, "dense: no mask"),
    ("kv <= q, batch-expanded", Masked(kv_le_q), DENSE, "dense: the mask is exactly causal"),
    ("tril of ones", Masked(lambda q: torch.ones(T, T, dtype=torch.bool).tril()), DENSE,
     "dense: the mask is exactly causal"),
    ("-inf above the diagonal", Masked(additive_causal), DENSE, EXACT),
    ("finfo.min above the diagonal", Masked(finfo_min_causal), DENSE, EXACT),
    ("window wider than T", Masked(window(T)), DENSE, "dense: the mask is exactly causal"),
    ("window narrower than T", Masked(window(3)), DENSE,
     "dense: the mask is a sliding window of 3 keys per query"),
    ("all allowed", Masked(lambda q: torch.ones(T, T, dtype=torch.bool)), DENSE,
     "dense: the mask allows every score"),
    ("ALiBi bias + causal", Masked(alibi_causal), DENSE, "dense: the mask adds a bias"),
    ("anti-causal", Masked(lambda q: torch.ones(T, T, dtype=torch.bool).triu()), DENSE,
     "dense: the mask is not causal"),
    ("from a bool buffer", FromBuffer(), DENSE, EXACT),
    ("from a float buffer", FromBuffer(torch.float32), DENSE,
     "dense: the mask depends on a buffer"),
]


@pytest.mark.parametrize(("label", "module", "scores", "note"), CASES, ids=[c[0] for c in CASES])
def test_mask_verdicts(label: str, module: torch.nn.Module, scores: int, note: str) -> None:
    cost = sdpa_cost(module, q)
    assert cost.note.startswith(note)
    assert cost.flops == flops(scores)


@pytest.mark.parametrize(("label", "module", "pattern"), [
    ("is_causal", Masked(None, is_causal=True), masks.MaskPattern.OTHER),
    ("tril of ones", Masked(lambda q: torch.ones(T, T, dtype=torch.bool).tril()),
     masks.MaskPattern.CAUSAL),
    ("-inf above the diagonal", Masked(additive_causal), masks.MaskPattern.CAUSAL),
    ("all allowed", Masked(lambda q: torch.ones(T, T, dtype=torch.bool)), masks.MaskPattern.ALL),
    ("window narrower than T", Masked(window(3)), masks.MaskPattern.WINDOW),
    ("ALiBi bias + causal", Masked(alibi_causal), masks.MaskPattern.OTHER),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_verdict_names_what_an_explicit_mask_allows(
        label: str, module: torch.nn.Module, pattern: masks.MaskPattern) -> None:
    registry = load_rules()
    graph = capture(module, (q,), registry, methods=("make_fx",))
    (node,) = [n for n in graph.calls() if n.packet == "aten.scaled_dot_product_attention"]
    verdict = masks.mask_convention(OpCall(node, graph))
    assert verdict.mask is pattern
    assert verdict.causal is (label == "is_causal")


def test_a_mask_from_the_inputs_counts_dense() -> None:
    cost = sdpa_cost(FromInput(), q, torch.ones(T, T, dtype=torch.bool).tril())
    assert cost.note.startswith("dense: the mask depends on an input")
    assert cost.flops == flops(DENSE)


def test_bottom_right_causal_with_fewer_queries_than_keys() -> None:
    """New tokens after a cache: query i sees keys j ≤ i + T_k − T_q."""
    t_q, t_k = 3, T

    class Cached(torch.nn.Module):
        def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            qi = torch.arange(t_q)[:, None] + (t_k - t_q)
            mask = torch.arange(t_k)[None, :] <= qi
            return F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)

    cost = sdpa_cost(Cached(), torch.randn(B, H, t_q, D), torch.randn(B, H, t_k, D))
    assert cost.note.startswith("dense: the mask is exactly causal aligned to the last key")
    assert cost.flops == B * H * t_q * t_k * (4 * D + SOFTMAX)


def all_allowed(q: torch.Tensor) -> torch.Tensor:
    qi, kj = positions(q.shape[-2])
    return kj >= qi - q.shape[-2]


LARGE = [  # masks built by elementwise ops only, so they can be judged by rows
    ("kv <= q, batch-expanded", kv_le_q, DENSE, "dense: the mask is exactly causal"),
    ("window wider than T", window(T), DENSE, "dense: the mask is exactly causal"),
    ("window narrower than T", window(3), DENSE,
     "dense: the mask is a sliding window of 3 keys per query"),
    ("ALiBi bias + causal", alibi_causal, DENSE, "dense: the mask adds a bias"),
    ("all allowed", all_allowed, DENSE, "dense: the mask allows every score"),
]


def _rows_per_block(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many query rows each block of a recipe computes, as the test runs."""
    blocks: list[int] = []
    real = mask_values.Recipe.rows
    monkeypatch.setattr(mask_values.Recipe, "rows",
                        lambda self, a, b: blocks.append(b - a) or real(self, a, b))
    return blocks


@pytest.mark.parametrize(("label", "build", "scores", "note"), LARGE, ids=[c[0] for c in LARGE])
def test_a_mask_too_large_to_hold_is_judged_by_rows(
        monkeypatch: pytest.MonkeyPatch, label: str, build: MaskFn, scores: int, note: str
) -> None:
    """Beyond `MAX_MASK_ELEMENTS` the square is never held: 3 query rows at a time here."""
    monkeypatch.setattr(mask_values, "MAX_MASK_ELEMENTS", T)
    monkeypatch.setattr(masks, "BLOCK_ELEMENTS", 3 * T)
    blocks = _rows_per_block(monkeypatch)
    cost = sdpa_cost(Masked(build), q)
    assert cost.note.startswith(note)
    assert cost.flops == flops(scores)
    assert blocks and max(blocks) <= 3


def test_between_the_limits_recipes_save_memory_and_change_no_verdict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `HOLD_ELEMENTS` an elementwise mask is judged by rows; an op that cannot run by
    rows (``tril``, ``flip``) gets its recipe computed whole, as when every mask up to
    `MAX_MASK_ELEMENTS` was held: the same verdicts either way."""
    monkeypatch.setattr(mask_values, "HOLD_ELEMENTS", T)
    monkeypatch.setattr(masks, "BLOCK_ELEMENTS", 3 * T)
    blocks = _rows_per_block(monkeypatch)
    by_rows = sdpa_cost(Masked(kv_le_q), q)
    assert by_rows.note.startswith("dense: the mask is exactly causal")
    assert blocks and max(blocks) <= 3
    blocks.clear()
    whole = sdpa_cost(Masked(lambda q: kv_le_q(q).tril()), q)
    assert whole.note.startswith("dense: the mask is exactly causal")
    assert T in blocks                      # the recipe computed whole for tril
    flipped = sdpa_cost(Masked(lambda q: kv_le_q(q).flip(-1)), q)
    assert flipped.note.startswith("dense: the mask is not causal")
    assert flipped.flops == flops(DENSE)


def test_a_large_mask_built_by_other_ops_counts_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tril`` is not elementwise: beyond the limit its square cannot be computed by rows."""
    monkeypatch.setattr(mask_values, "MAX_MASK_ELEMENTS", T * T - 1)
    cost = sdpa_cost(Masked(lambda q: torch.ones(T, T, dtype=torch.bool).tril()), q)
    assert cost.note.startswith("dense: the mask needs a tensor of 64 elements")
    assert "cannot be computed by rows" in cost.note
    assert cost.flops == flops(DENSE)


@pytest.mark.parametrize(("build", "note"), [(kv_le_q, "dense: the mask is exactly causal"),
                                              (window(T - 1), "dense: the mask is a sliding "
                                                              "window of 7 keys per query")])
def test_a_mask_beyond_the_scores_read_whole_is_judged_on_sampled_rows(
        monkeypatch: pytest.MonkeyPatch, build: MaskFn, note: str) -> None:
    """2 of the 8 one-row blocks are read, the first and the last; the window shows in the
    last, and the note says what was read."""
    monkeypatch.setattr(mask_values, "MAX_MASK_ELEMENTS", T)
    monkeypatch.setattr(masks, "BLOCK_ELEMENTS", T)
    monkeypatch.setattr(masks, "MAX_LAZY_ELEMENTS", 2 * T)
    starts: list[int] = []
    real = mask_values.Recipe.rows
    monkeypatch.setattr(mask_values.Recipe, "rows",
                        lambda self, a, b: starts.append(a) or real(self, a, b))
    cost = sdpa_cost(Masked(build), q)
    assert cost.note.startswith(note)
    assert sorted(set(starts)) == [0, T - 1]
    if "exactly causal" in note:
        assert cost.note.endswith("(judged on 2 of its 8 query rows, in 2 blocks evenly spread: "
                                  "a square this large is too slow to read whole)")
    assert cost.flops == flops(DENSE)


class Padded(torch.nn.Module):
    """transformers' shape of it: causal positions AND a (B, T) padding mask from the inputs."""

    def forward(self, q: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = kv_le_q(q) & attention_mask.bool()[:, None, None, :]
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_an_integer_padding_mask_input_is_taken_as_all_ones(dtype: torch.dtype) -> None:
    """Its values are not traced; a tokenizer's unpadded batch is all ones, for which the
    mask is exactly causal. The note says what was assumed."""
    cost = sdpa_cost(Padded(), q, torch.ones(B, T, dtype=dtype))
    assert cost.note.startswith("dense: the mask is exactly causal")
    assert "taken as all ones" in cost.note
    assert cost.flops == flops(DENSE)


def test_a_padding_mask_of_more_than_two_dims_counts_dense() -> None:
    """A 4-D integer input is an explicit mask, not a tokenizer's padding: nothing assumed."""

    class Explicit(torch.nn.Module):
        def forward(self, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, q, q, attn_mask=mask.bool() & kv_le_q(q))

    cost = sdpa_cost(Explicit(), q, torch.ones(B, 1, T, T, dtype=torch.int64))
    assert cost.note.startswith("dense: the mask depends on an input")
    assert cost.flops == flops(DENSE)


def test_one_mask_is_evaluated_once_per_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers of a model share one mask: its verdict is cached per graph."""
    calls = []
    real = masks.classify
    monkeypatch.setattr(masks, "classify", lambda g, r, *t: calls.append(r) or real(g, r, *t))

    class TwoLayers(torch.nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            mask = kv_le_q(q)
            return F.scaled_dot_product_attention(
                F.scaled_dot_product_attention(q, q, q, attn_mask=mask), q, q, attn_mask=mask)

    registry = load_rules()
    graph = capture(TwoLayers(), (q,), registry, methods=("make_fx",))
    nodes = [n for n in graph.calls() if n.packet == "aten.scaled_dot_product_attention"]
    costs = [registry.lookup(n)(OpCall(n, graph)) for n in nodes]  # type: ignore[operator]
    assert len(nodes) == 2 and len(calls) == 1
    assert all(c.flops == flops(DENSE) for c in costs)


def test_masks_built_alike_are_judged_once_and_different_ones_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Layers that each build their own copy of one mask (a recorded training step does) are
    judged once, by the mask's recipe; a layer whose mask differs only by a window, or whose
    queries are longer, is judged on its own and keeps its own verdict."""
    calls = []
    real = masks.classify
    monkeypatch.setattr(masks, "classify", lambda g, r, *t: calls.append(r) or real(g, r, *t))

    class FourLayers(torch.nn.Module):
        def forward(self, q: torch.Tensor, long: torch.Tensor) -> torch.Tensor:
            x = F.scaled_dot_product_attention(q, q, q, attn_mask=kv_le_q(q))
            x = F.scaled_dot_product_attention(x, q, q, attn_mask=kv_le_q(q))
            x = F.scaled_dot_product_attention(x, q, q, attn_mask=window(3)(q))
            y = F.scaled_dot_product_attention(long, long, long, attn_mask=kv_le_q(long))
            return x.sum() + y.sum()

    registry = load_rules()
    long = torch.randn(B, H, 2 * T, D)
    graph = capture(FourLayers(), (q, long), registry, methods=("make_fx",))
    nodes = [n for n in graph.calls() if n.packet == "aten.scaled_dot_product_attention"]
    costs = [registry.lookup(n)(OpCall(n, graph)) for n in nodes]  # type: ignore[operator]
    refs = [n.args["attn_mask"] for n in nodes]
    assert len(nodes) == 4 and len(set(refs)) == 4           # four masks, built apart
    assert len(calls) == 3                                    # causal T, window, causal 2T
    exact = [c.note.startswith("dense: the mask is exactly causal") for c in costs]
    assert exact == [True, True, False, True]
    assert all(c.flops == flops(DENSE) for c in costs[:3]) and "window" in costs[2].note
