"""FlexAttention counted as its kernel runs: the computed blocks of its block mask, the partial
ones in full, at SDPA's cost per score plus the score_mod's ops.

Property tests over random causal, sliding-window and document (jagged) masks built inside the
model with `create_block_mask`, random lengths, block sizes, batch and head counts (the block
mask per batch and head, or broadcast): the FLOPs equal the closed form computed here from the
real mask — a block counts when any of its scores is allowed, its area clipped to
T_q × T_k — times B·H·(2·d_qk + 2·d_v + 8 + score_mod ops).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.cost.engine import analyze
from fxlens.rules import load_rules
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT as SOFTMAX

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def mask_mod(kind: str, size: int) -> MaskMod:
    """causal; a causal window of `size` keys; documents of `size` tokens (ids from
    positions); heads > 0 causal and head 0 full (a per-head mask)."""
    def causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
               ) -> torch.Tensor:
        return q >= kv

    def window(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
               ) -> torch.Tensor:
        return (q >= kv) & (q - kv < size)

    def document(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
                 ) -> torch.Tensor:
        return (q // size) == (kv // size)

    def per_head(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
                 ) -> torch.Tensor:
        return (h == 0) | (q >= kv)

    return {"causal": causal, "window": window, "document": document,
            "per-head": per_head}[kind]


class Flex(torch.nn.Module):
    def __init__(self, mod: MaskMod, per_batch_head: bool, block: tuple[int, int],
                 bias: bool) -> None:
        super().__init__()
        self.mod, self.per_batch_head, self.block, self.bias = mod, per_batch_head, block, bias

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h = (q.shape[0], q.shape[1]) if self.per_batch_head else (None, None)
        mask = create_block_mask(self.mod, b, h, q.shape[-2], k.shape[-2], device="cpu",
                                 BLOCK_SIZE=self.block)
        score_mod = (lambda s, b, h, qi, ki: s + (qi - ki)) if self.bias else None
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask)


def computed_scores(mod: MaskMod, b: int, h: int, t_q: int, t_k: int,
                    block: tuple[int, int]) -> int:
    """Σ over (batch, head) of the clipped areas of the blocks holding an allowed score."""
    total = 0
    for bi in range(b):
        for hi in range(h):
            allowed = mod(torch.tensor(bi), torch.tensor(hi), torch.arange(t_q)[:, None],
                          torch.arange(t_k)[None, :]).expand(t_q, t_k)
            for q0 in range(0, t_q, block[0]):
                for k0 in range(0, t_k, block[1]):
                    tile = allowed[q0:q0 + block[0], k0:k0 + block[1]]
                    total += tile.numel() if bool(tile.any()) else 0
    return total


def test_a_causal_block_mask_counts_its_lower_blocks_in_full() -> None:
    """400 tokens in 128-token blocks (the last one 16 wide): query block i computes key
    blocks 0…i, the diagonal ones in full — 128·128 + 128·256 + 128·384 + 16·400 = 104,704
    scores per head, of 160,000."""
    q = torch.randn(1, 2, 400, 16)
    registry = load_rules()
    graph = capture(Flex(mask_mod("causal", 0), False, (128, 128), False), (q, q, q), registry,
                    methods=("export",))
    (node,) = [n for n in analyze(graph, registry, strict=True).nodes
               if n.target == "higher_order.flex_attention"]
    assert node.flops == 2 * 104_704 * (4 * 16 + SOFTMAX)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["causal", "window", "document", "per-head"]),
       size=st.integers(16, 200), b=st.integers(1, 2), h=st.integers(1, 3),
       t=st.integers(100, 400), block=st.sampled_from([(128, 128), (64, 128), (128, 64)]),
       per_batch_head=st.booleans(), bias=st.booleans(), d_v=st.sampled_from([8, 16]))
def test_flex_attention_counts_the_computed_blocks(
        kind: str, size: int, b: int, h: int, t: int, block: tuple[int, int],
        per_batch_head: bool, bias: bool, d_v: int) -> None:
    per_batch_head = per_batch_head or kind == "per-head"
    mod = mask_mod(kind, size)
    q, v = torch.randn(b, h, t, 16), torch.randn(b, h, t, d_v)
    registry = load_rules()
    graph = capture(Flex(mod, per_batch_head, block, bias), (q, q, v), registry,
                    methods=("export",))
    report = analyze(graph, registry, strict=True)
    (node,) = [n for n in report.nodes if n.target == "higher_order.flex_attention"]
    scores = computed_scores(mod, b, h, t, t, block)
    per_score = 2 * 16 + 2 * d_v + SOFTMAX + (2 if bias else 0)   # s + (q - kv): 2 ops
    assert node.flops == scores * per_score, node.note
    assert node.note.startswith("block-sparse:")
    assert f"{scores:,} of {b * h * t * t:,} scores" in node.note


class FlexBlock(torch.nn.Module):
    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: object) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = flex_attention(q, k, v, block_mask=mask)
        return x + self.out(y.transpose(1, 2).reshape(b, t, d))


class FlexModel(torch.nn.Module):
    """Weights that require grad, a block mask made once and handed to repeated blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(FlexBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = create_block_mask(mask_mod("window", 100), None, None, x.shape[1], x.shape[1],
                                 device="cpu")
        for block in self.blocks:
            x = block(x, mask)
        return x


@pytest.mark.slow
def test_a_model_of_flex_blocks_is_analysed_forward_and_training_step() -> None:
    """Forward (torch.export) and the training step (recorded at dispatch level): each
    layer's FlexAttention over its computed blocks, the backward at SDPA's backward per
    score, 2·(3·d_qk + 2·d_v) + 7, plus D = rowsum(dO·O)."""
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.api import AnalysisOptions, analyze_loaded

    model, x = FlexModel(), torch.randn(2, 300, 64)
    scores = computed_scores(mask_mod("window", 100), 2, 4, 300, 300, (128, 128))
    report = analyze_loaded(LoadedModel(model, (x,), "flex", "flex"),
                            AnalysisOptions(strict=True, device="h100"))
    assert report.coverage.complete
    flex = [n.flops for n in report.nodes if n.target == "higher_order.flex_attention"]
    assert flex == [scores * (4 * 16 + SOFTMAX)] * 3
    step = analyze_loaded(LoadedModel(model, (x,), "flex", "flex"),
                          AnalysisOptions(strict=True, train=True, device="h100"))
    assert step.coverage.complete
    forward = [n.flops for n in step.nodes if n.target == "higher_order.flex_attention"]
    backward = [n.flops for n in step.nodes
                if n.target == "higher_order.flex_attention_backward"]
    assert forward == [scores * (4 * 16 + SOFTMAX)] * 3
    assert backward == [scores * (2 * (3 * 16 + 2 * 16) + 7) + 2 * 2 * 4 * 300 * 16] * 3


@pytest.mark.parametrize("method", [pytest.param("export", marks=pytest.mark.slow), "make_fx",
                                    "record"])
def test_every_capture_method_records_flex_attention_alike(method: str) -> None:
    registry = load_rules()
    graph = capture(FlexModel(), (torch.randn(2, 300, 64),), registry, methods=(method,))
    flex = [n.flops for n in analyze(graph, registry, strict=True).nodes
            if n.target == "higher_order.flex_attention"]
    scores = computed_scores(mask_mod("window", 100), 2, 4, 300, 300, (128, 128))
    assert flex == [scores * (4 * 16 + SOFTMAX)] * 3


class SoftCapped(torch.nn.Module):
    """A score_mod alone (no block mask): tanh soft-capping, 3 ops per score."""

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return flex_attention(q, q, q, score_mod=lambda s, b, h, qi, ki: torch.tanh(s / 30) * 30)


@pytest.mark.parametrize("method", ["export", "make_fx", "record"])
def test_a_score_mod_alone_counts_dense_plus_its_ops(method: str) -> None:
    registry = load_rules()
    graph = capture(SoftCapped(), (torch.randn(1, 2, 200, 16),), registry, methods=(method,))
    (node,) = [n for n in analyze(graph, registry, strict=True).nodes
               if n.target == "higher_order.flex_attention"]
    assert node.flops == 2 * 200 * 200 * (4 * 16 + SOFTMAX + 3)
    assert node.note.startswith("dense:") and "score_mod 3 ops per score" in node.note


class MaskedBlocks(torch.nn.Module):
    """Two layers of projections around FlexAttention with `mod` built inside the forward."""

    def __init__(self, mod: MaskMod, block: tuple[int, int]) -> None:
        super().__init__()
        self.mod, self.block = mod, block
        self.layers = torch.nn.ModuleList(FlexBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = create_block_mask(self.mod, None, None, x.shape[1], x.shape[1], device="cpu",
                                 BLOCK_SIZE=self.block)
        for layer in self.layers:
            x = layer(x, mask)
        return x


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(kind=st.sampled_from(["causal", "window", "document"]), size=st.integers(16, 200),
       t=st.integers(100, 300), block=st.sampled_from([(128, 128), (64, 128)]))
def test_the_training_step_counts_the_computed_blocks_both_ways(
        kind: str, size: int, t: int, block: tuple[int, int]) -> None:
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.api import AnalysisOptions, analyze_loaded

    mod = mask_mod(kind, size)
    step = analyze_loaded(LoadedModel(MaskedBlocks(mod, block), (torch.randn(2, t, 64),),
                                      "flex", "flex"), AnalysisOptions(strict=True, train=True))
    scores = computed_scores(mod, 2, 4, t, t, block)
    forward = [n.flops for n in step.nodes if n.target == "higher_order.flex_attention"]
    backward = [n.flops for n in step.nodes
                if n.target == "higher_order.flex_attention_backward"]
    assert forward == [scores * (4 * 16 + SOFTMAX)] * 2
    assert backward == [scores * (2 * (3 * 16 + 2 * 16) + 7) + 2 * 2 * 4 * t * 16] * 2


class GivenMask(torch.nn.Module):
    """Layers of FlexBlock under a block mask made before the forward (torchtitan's pattern):
    held by the model, or handed to the forward as an argument."""

    def __init__(self, mask: object = None) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(FlexBlock() for _ in range(2))
        self.mask = mask

    def forward(self, x: torch.Tensor, mask: object = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, self.mask if mask is None else mask)
        return x


def _given(kind: str, size: int, t: int) -> object:
    return create_block_mask(mask_mod(kind, size), None, None, t, t, device="cpu")


@pytest.mark.parametrize("method", ["export", "record"])
@pytest.mark.parametrize("kind", ["causal", "window", "document"])
def test_a_block_mask_made_before_the_forward_counts_its_computed_blocks(
        method: str, kind: str) -> None:
    """Its block counts are tensors the capture saw real: kept on the graph (`Node.value`)
    and read as a mask built inside the forward is computed."""
    registry = load_rules()
    graph = capture(GivenMask(_given(kind, 90, 300)), (torch.randn(2, 300, 64),), registry,
                    methods=(method,))
    flex = [n for n in analyze(graph, registry, strict=True).nodes
            if n.target == "higher_order.flex_attention"]
    scores = computed_scores(mask_mod(kind, 90), 2, 4, 300, 300, (128, 128))
    assert [n.flops for n in flex] == [scores * (4 * 16 + SOFTMAX)] * 2, flex[0].note
    assert scores < 2 * 4 * 300 * 300


def test_a_block_mask_given_as_an_argument_is_counted_and_not_listed_as_an_input() -> None:
    """torch.export refuses a BlockMask argument; the recording reaches its tensors, which
    are no example input: the summary lists `x` alone."""
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.api import AnalysisOptions, analyze_loaded

    mask = _given("window", 90, 300)
    inputs = {"x": torch.randn(2, 300, 64), "mask": mask}
    scores = computed_scores(mask_mod("window", 90), 2, 4, 300, 300, (128, 128))
    for train in (False, True):
        report = analyze_loaded(LoadedModel(GivenMask(), inputs, "flex", "flex"),
                                AnalysisOptions(strict=True, train=train))
        flex = [n.flops for n in report.nodes if n.target == "higher_order.flex_attention"]
        assert flex == [scores * (4 * 16 + SOFTMAX)] * 2
        assert [i.name for i in report.model.inputs] == ["x"]


def test_the_eager_memory_simulation_runs_flex_attention_as_one_kernel() -> None:
    """The storage tracker passes the higher-order op through: its output (and logsumexp)
    are new storages, its inner score tensors are not."""
    from fxlens.analyzer.memory.measure import simulate_eager_memory

    measured = simulate_eager_memory(GivenMask(), (torch.randn(1, 256, 64),
                                                   _given("causal", 0, 256)))
    scores_bytes = 4 * 256 * 256 * 4    # one layer's float32 scores, 4 heads
    assert 0 < measured.peak_bytes < scores_bytes
    assert measured.ops.count("flex_attention") == 2


def test_validate_says_it_cannot_run_flex_attention() -> None:
    from fxlens.analyzer.core.errors import ValidationError
    from fxlens.analyzer.time.validate import run_graph

    registry = load_rules()
    model, x = GivenMask(_given("causal", 0, 128)), torch.randn(1, 128, 64)
    graph = capture(model, (x,), registry, methods=("export",))
    with pytest.raises(ValidationError, match="higher_order.flex_attention"):
        run_graph(graph, model, (x,))
