"""KV cache worked examples, derived by hand: 2 (K and V) × layers × batch × context ×
kv_heads × head_dim × bytes per element."""

from __future__ import annotations

import pytest
import torch

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.memory.kv_cache import decode_step, kv_cache, layers_from_graph
from fxlens.analyzer.memory.liveness import liveness
from fxlens.analyzer.memory.types import KVLayer
from fxlens.kv_pass import kv_layout
from fxlens.rules import load_rules
from fxlens.rules.kv_layouts import TOKEN_MAJOR_KERNELS
from tests.models import tiny_gpt

GiB, MiB = 2**30, 2**20
FP16 = 2


def test_llama_2_7b_shape_at_2048_tokens_is_one_gib() -> None:
    layers = [KVLayer(f"layer {i}", kv_heads=32, k_head_dim=128, v_head_dim=128)
              for i in range(32)]
    report = kv_cache(layers, batch=1, context=2048, dtype_bytes=FP16)
    assert report.layers[0].bytes == 2 * 2048 * 32 * 128 * FP16 == 32 * MiB
    assert report.total_bytes == 2 * 32 * 2048 * 4096 * FP16 == 1 * GiB


def test_llama_2_7b_preset_layout_from_its_config() -> None:
    loaded = load_preset("llama-2-7b")
    layout = kv_layout(loaded.module)
    assert layout.source == "config" and layout.dtype_bytes == FP16    # published fp16
    report = kv_cache(layout.layers, batch=1, context=2048, dtype_bytes=layout.dtype_bytes)
    assert len(report.layers) == 32
    assert report.total_bytes == 1 * GiB


def test_grouped_query_attention_divides_by_heads_over_kv_heads() -> None:
    layout = kv_layout(load_preset("llama-3-8b").module)      # 32 query heads, 8 kv heads
    assert {layer.kv_heads for layer in layout.layers} == {8}
    report = kv_cache(layout.layers, batch=1, context=2048, dtype_bytes=FP16)
    assert report.total_bytes == 2 * 32 * 2048 * (8 * 128) * FP16 == 1 * GiB // (32 // 8)


def test_batch_and_context_scale_linearly() -> None:
    layout = kv_layout(load_preset("llama-3-8b").module)
    base = kv_cache(layout.layers, 1, 1024, FP16).total_bytes
    assert kv_cache(layout.layers, 4, 1024, FP16).total_bytes == 4 * base
    assert kv_cache(layout.layers, 1, 4096, FP16).total_bytes == 4 * base


def test_sliding_window_caps_the_cached_tokens() -> None:
    layout = kv_layout(load_preset("mistral-7b").module)      # sliding_window 4096, 8 kv heads
    report = kv_cache(layout.layers, batch=1, context=8192, dtype_bytes=FP16)
    assert {layer.tokens for layer in report.layers} == {4096}
    assert report.total_bytes == 2 * 32 * 4096 * (8 * 128) * FP16


def test_encoder_decoder_counts_decoder_self_attention_only() -> None:
    layout = kv_layout(load_preset("whisper-tiny").module)    # 4 decoder layers, 6 heads × 64
    report = kv_cache(layout.layers, batch=1, context=448, dtype_bytes=4)
    assert report.total_bytes == 2 * 4 * 448 * (6 * 64) * 4


def test_graph_layout_reads_each_causal_attention_node() -> None:
    module, inputs = tiny_gpt.build()                          # 2 layers, 4 heads × 16, fp32
    graph = capture(module, inputs, load_rules())
    layers = layers_from_graph(graph, TOKEN_MAJOR_KERNELS)
    assert [(layer.kv_heads, layer.k_head_dim, layer.v_head_dim) for layer in layers] == [
        (4, 16, 16), (4, 16, 16)]
    layout = kv_layout(module, graph)
    assert layout.source == "graph" and layout.dtype_bytes == 4
    assert kv_cache(layout.layers, 3, 100, 4).total_bytes == 2 * 2 * 3 * 100 * (4 * 16) * 4


def test_decode_step_adds_weights_cache_and_one_token_activations() -> None:
    loaded = load_preset("llama-3-8b", overrides={"num_hidden_layers": "2"}, seq_len=1)
    registry = load_rules()
    one_token = liveness(capture(loaded.module, loaded.inputs, registry), registry)
    layout = kv_layout(loaded.module)
    cache = kv_cache(layout.layers, batch=1, context=2048, dtype_bytes=layout.dtype_bytes)
    weights = one_token.param_bytes + one_token.buffer_bytes
    step = decode_step(weights, cache, one_token.peak_activation_bytes)
    assert cache.total_bytes == 2 * 2 * 2048 * (8 * 128) * 2
    assert step.total_bytes == weights + cache.total_bytes + one_token.peak_activation_bytes
    # one token's logits, 128 256 bf16 values, are part of its activation peak
    assert one_token.peak_activation_bytes >= 128256 * 2


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        kv_cache([KVLayer("l", 1, 1, 1)], batch=0, context=1, dtype_bytes=2)
    with pytest.raises(LoadError, match="no transformers config"):
        kv_layout(torch.nn.Linear(2, 2))
