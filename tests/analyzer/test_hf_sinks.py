"""GPT-OSS's attention sinks as one fused kernel and a renormalisation
(`fxlens.analyzer.capture.hf_sinks`): the eager path's values, none of its score matrices."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.gpt_oss import modeling_gpt_oss

from fxlens.analyzer.capture.hf_sinks import SINK_ATTENTION, register, sink_attention
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.api import AnalysisOptions
from fxlens.pipeline import Context, run_context
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT
from tests.models.hf_build import instantiate, tokens

B, T, HEADS, KV_HEADS, D = 2, 24, 4, 2, 16
FUSED = "aten._scaled_dot_product_flash_attention_for_cpu"
WINDOWED = "aten._flash_attention_forward"


def _config() -> transformers.GptOssConfig:
    return transformers.GptOssConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=D, intermediate_size=48,
        max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"])


def _causal(window: int | None = None) -> torch.Tensor:
    """transformers' eager mask: 0 where a query sees a key, -inf elsewhere, (B, 1, T, T)."""
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = (k <= q) & ((q - k < window) if window else True)
    return torch.where(seen, 0.0, float("-inf")).expand(B, 1, T, T)


@pytest.mark.parametrize("window", [None, 8])
def test_sink_attention_equals_the_eager_path(window: int | None) -> None:
    torch.manual_seed(0)
    attention = modeling_gpt_oss.GptOssAttention(_config(), layer_idx=0)
    torch.nn.init.normal_(attention.sinks, std=2.0)       # sinks that matter
    query = torch.randn(B, HEADS, T, D)
    key, value = torch.randn(B, KV_HEADS, T, D), torch.randn(B, KV_HEADS, T, D)
    eager, _ = modeling_gpt_oss.eager_attention_forward(
        attention, query, key, value, _causal(window), scaling=D ** -0.5)
    mask = None if window is None else _causal(window) == 0     # SDPA's: boolean, or causal
    fused = sink_attention(attention, query, key, value, mask, attention.sinks,
                           scale=D ** -0.5)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)


def test_a_gpt_oss_step_saves_no_score_matrix() -> None:
    """Recorded with the sink implementation, a GPT-OSS training step runs one fused attention
    per layer and its backward, the sliding-window layer as FlashAttention's windowed kernel
    counted on its band, and saves nothing of T × T per head; eager saved the scores'
    probabilities (B × H × T × T) in every layer."""
    register()
    model = instantiate(transformers.GptOssForCausalLM, _config(), attention=SINK_ATTENTION)
    ctx = Context(LoadedModel(model, {"input_ids": tokens(length=T)}, "gpt-oss", "gpt-oss"),
                  AnalysisOptions(train=True, fusion=False), lambda _: None)
    report = run_context(ctx)
    assert ctx.step is not None
    graph = ctx.step.graph
    calls = {n.packet: n for n in graph.calls() if "attention" in n.packet}
    assert sorted(calls) == sorted([FUSED, FUSED + "_backward", WINDOWED,
                                    "aten._flash_attention_backward"])
    window, per_score = _config().sliding_window, 2 * (D + D) + SOFTMAX_FLOPS_PER_ELEMENT
    assert calls[WINDOWED].args["window_size_left"] == window - 1
    band = sum(min(i + 1, window) for i in range(T))           # 164 of the causal 300
    flops = {n.id: n.flops for n in report.nodes}
    assert flops[calls[WINDOWED].id] == B * HEADS * band * per_score
    assert flops[calls[FUSED].id] == B * HEADS * T * (T + 1) // 2 * per_score
    square = [s for s in (graph.spec(r) for r in ctx.step.saved) if s is not None
              and len(s.shape) == 4 and s.shape[-2:] == (T, T) and s.shape[1] == HEADS]
    assert square == []
    assert any(p.name.endswith("sinks") for p in graph.params)
