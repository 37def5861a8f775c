"""Attention with dropout in a recorded training step: the fused kernel a GPU runs, not the
math path CPU's backend choice falls back to (`fxlens.analyzer.capture.fused_attention`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from fxlens.analyzer.capture.fused_attention import cpu_flash_takes
from fxlens.analyzer.capture.training import TrainingGraph, capture_training
from fxlens.analyzer.core.graph import NodeKind
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.cost.engine import analyze
from fxlens.api import AnalysisOptions
from fxlens.pipeline import Context, run_context
from fxlens.rules import load_rules
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT

B, T, D_HEAD = 2, 10, 4
FUSED = "aten._scaled_dot_product_flash_attention_for_cpu.default"
FUSED_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"


class _Attention(torch.nn.Module):
    """One self-attention: `heads` query heads, `kv_heads` key/value heads (GQA when fewer),
    an optional mask (a buffer, a parameter when `learned_mask`), else causal."""

    def __init__(self, dropout: float = 0.1, heads: int = 3, kv_heads: int = 3,
                 mask: torch.Tensor | None = None, learned_mask: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dropout = heads, kv_heads, dropout
        self.q = torch.nn.Linear(8, heads * D_HEAD)
        self.kv = torch.nn.Linear(8, 2 * kv_heads * D_HEAD)
        self.mask: torch.Tensor | None
        if learned_mask and mask is not None:
            self.mask = torch.nn.Parameter(mask)
        else:
            self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(B, T, self.heads, D_HEAD).transpose(1, 2)
        k, v = self.kv(x).view(B, T, 2, self.kv_heads, D_HEAD).permute(2, 0, 3, 1, 4)
        gqa = self.kv_heads != self.heads
        if self.mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout,
                                                  is_causal=True, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask,
                                              dropout_p=self.dropout, enable_gqa=gqa)


def step(module: torch.nn.Module, fused_attention: bool = True) -> TrainingGraph:
    return capture_training(module, (torch.randn(B, T, 8),), load_rules(),
                            fused_attention=fused_attention)


def square_tensors(step: TrainingGraph) -> list[str]:
    """Nodes with a T×T output (scores, probabilities, a dropout mask, a causal mask)."""
    return [n.target for n in step.graph.nodes if n.kind is NodeKind.CALL
            and any(s is not None and tuple(s.shape[-2:]) == (T, T) for s in n.outputs)]


def test_dropout_records_the_fused_kernel_and_saves_no_probabilities() -> None:
    fused, math = step(_Attention()), step(_Attention(), fused_attention=False)
    assert square_tensors(fused) == []
    assert not any(tuple(fused.graph.spec(r).shape[-2:]) == (T, T)   # type: ignore[union-attr]
                   for r in fused.saved)
    phases = {n.target: n.phase for n in fused.graph.nodes}
    assert phases[FUSED] == "forward" and phases[FUSED_BACKWARD] == "backward"
    call = next(n for n in fused.graph.nodes if n.target == FUSED)
    assert call.args["dropout_p"] == 0.1 and call.args["is_causal"] is True
    # Without it, the math path: the T×T probabilities, saved with the dropout mask.
    assert "aten._safe_softmax.default" in square_tensors(math)
    assert FUSED not in {n.target for n in math.graph.nodes}


def test_the_fused_step_is_costed_whole_and_its_gemms_are_the_math_paths() -> None:
    """Dense attention (a mask, not causal): the math path's two forward GEMMs are those
    the fused kernel is counted for, plus its softmax."""
    registry = load_rules()
    mask = torch.zeros(T, T)
    fused = analyze(step(_Attention(mask=mask)).graph, registry, strict=True)
    math = analyze(step(_Attention(mask=mask), fused_attention=False).graph, registry,
                   strict=True)
    assert fused.coverage.unsupported == {} and fused.coverage.failed == {}
    attention = {n.target: n.flops for n in fused.nodes if n.target == FUSED}[FUSED]
    gemms = 2 * 2 * B * 3 * T * T * D_HEAD
    assert attention == gemms + SOFTMAX_FLOPS_PER_ELEMENT * B * 3 * T * T
    math_gemms = sum(n.flops for n in math.nodes
                     if n.phase == "forward" and n.target == "aten.bmm.default")
    assert math_gemms == gemms


def test_a_boolean_mask_becomes_additive_with_the_ops_the_composite_uses() -> None:
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    dropout, without = step(_Attention(mask=mask)), step(_Attention(dropout=0.0, mask=mask))
    def calls(step: TrainingGraph) -> list[str]:
        return [n.target for n in step.graph.nodes if n.kind is NodeKind.CALL]

    assert calls(dropout) == calls(without)
    assert square_tensors(dropout) == ["aten.where.self"]    # the additive mask only


@pytest.mark.parametrize("module", [
    pytest.param(lambda: _Attention(dropout=0.0), id="no-dropout"),
    pytest.param(lambda: _Attention(heads=4, kv_heads=2), id="gqa-dropout"),
    pytest.param(lambda: _Attention(mask=torch.zeros(T, T), learned_mask=True),
                 id="learned-mask-dropout"),
])
def test_calls_it_leaves_alone_are_recorded_as_before(module: Callable[[], _Attention]
                                                       ) -> None:
    assert step(module()).graph.nodes == step(module(), fused_attention=False).graph.nodes


def test_a_learned_mask_still_gets_its_gradient() -> None:
    """The fused CPU op has no gradient for its mask: such a call stays on the math path."""
    graph = step(_Attention(mask=torch.zeros(T, T), learned_mask=True)).graph
    assert FUSED not in {n.target for n in graph.nodes}
    gradients = [graph.spec(r) for r, role in graph.roles.items() if role == "gradient"]
    assert any(s is not None and tuple(s.shape) == (T, T) for s in gradients)


class _Routed(_Attention):
    """A data-dependent branch: the step is recorded on small real tensors, where CPU's
    fused kernel refuses dropout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y[: int(y.abs().sum().item() > 0) + 1]


def test_on_real_tensors_attention_with_dropout_is_run_as_written() -> None:
    recorded = step(_Routed())
    assert "real tensors" in recorded.graph.notes[0]
    assert "aten._safe_softmax.default" in square_tensors(recorded)


@pytest.mark.parametrize("device, fused", [(None, True), ("h100", True), ("cpu", False)])
def test_the_pipeline_fuses_unless_the_device_is_a_cpu(device: str | None, fused: bool) -> None:
    loaded = LoadedModel(_Attention(), (torch.randn(B, T, 8),), "attention", "test")
    ctx = Context(loaded, AnalysisOptions(train=True, device=device, fusion=False),
                  on_step=lambda _: None)
    run_context(ctx)
    assert ctx.step is not None
    assert (FUSED in {n.target for n in ctx.step.graph.nodes}) is fused


def _qkv(heads: int = 2, kv_heads: int = 2, dims: int = 4, head_dim: int = 8,
         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    shape = (2, heads, 6, head_dim)[4 - dims:]
    kv_shape = (2, kv_heads, 6, head_dim)[4 - dims:]
    return (torch.randn(shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype),
            torch.randn(kv_shape, dtype=dtype))


@pytest.mark.parametrize("qkv, mask", [
    (_qkv(), None),
    (_qkv(), torch.ones(6, 6, dtype=torch.bool)),
    (_qkv(), torch.zeros(1, 6)),
    (_qkv(), torch.zeros(2, 1, 6, 6)),
    (_qkv(), torch.zeros(1, 2, 1, 6)),
    (_qkv(), torch.zeros(2, 6, 6)),                               # 3-D mask
    (_qkv(), torch.zeros(3, 1, 6, 6)),                            # batch 3 ≠ 2
    (_qkv(), torch.zeros(6, 6, requires_grad=True)),
    (_qkv(), torch.zeros(6, 12)[:, ::2]),                         # taken: any stride
    (_qkv(dims=3), None),
    (_qkv(dtype=torch.bfloat16), None),
    (_qkv(dtype=torch.float16), None),
    (tuple(t.transpose(-1, -2) for t in _qkv(head_dim=6)), None),  # last stride ≠ 1
])
def test_cpu_flash_takes_mirrors_torchs_own_choice(qkv: tuple[torch.Tensor, ...],
                                                   mask: torch.Tensor | None) -> None:
    """`cpu_flash_takes` restates ``use_flash_attention_cpp``; a torch that changes it fails
    here. Dropout 0: torch's answer for the same call without the dropout."""
    q, k, v = qkv
    choice = torch.ops.aten._fused_sdp_choice.default(q, k, v, mask, 0.0, False)
    assert cpu_flash_takes(q, k, v, mask) is (choice == 1)   # SDPBackend.FLASH_ATTENTION


class _LatentAttention(torch.nn.Module):
    """Queries and keys of head dimension 6, values of 4 (MLA's shape), causal or masked."""

    def __init__(self, mask: torch.Tensor | None = None) -> None:
        super().__init__()
        self.qk = torch.nn.Linear(8, 2 * 3 * 6)
        self.v = torch.nn.Linear(8, 3 * D_HEAD)
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).view(B, T, 2, 3, 6).permute(2, 0, 3, 1, 4)
        v = self.v(x).view(B, T, 3, D_HEAD).transpose(1, 2)
        if self.mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"


@pytest.mark.parametrize("mask", [None, torch.ones(T, T, dtype=torch.bool).tril()])
def test_values_with_their_own_head_dim_record_the_efficient_kernel(
        mask: torch.Tensor | None) -> None:
    """MLA's shapes: the math path on CPU, a fused kernel (cuDNN or memory-efficient) on a
    GPU; recorded as the latter, its FLOPs those of the math path's GEMMs, no T×T tensor."""
    fused, math = step(_LatentAttention(mask)), step(_LatentAttention(mask), False)
    targets = {n.target: n.phase for n in fused.graph.nodes}
    assert targets[EFFICIENT] == "forward"
    assert targets[EFFICIENT.replace("attention", "attention_backward")] == "backward"
    # the additive mask (and its broadcast view) only
    assert set(square_tensors(fused)) <= {"aten.where.self", "aten.expand.default"}
    assert "aten._safe_softmax.default" in square_tensors(math)
    registry = load_rules()
    report = analyze(fused.graph, registry, strict=True)
    attention = next(n for n in report.nodes if n.target == EFFICIENT)
    # causal: the lower triangle; a mask (a buffer fake tensors hold no values of): dense
    scores = B * 3 * (T * (T + 1) // 2 if mask is None else T * T)
    assert attention.flops == 2 * scores * (6 + D_HEAD) + SOFTMAX_FLOPS_PER_ELEMENT * scores
