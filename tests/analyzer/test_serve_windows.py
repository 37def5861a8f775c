"""Serving sliding-window models (issue 31): a sliding layer caches and reads at most its
window, a prompt's token attends to at most the window before it; checked against closed
forms on the affine step and through the pipeline on small Mistral and Gemma-3 configs."""

from __future__ import annotations

import math

import pytest
import torch

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.core.sections import Serve
from fxlens.analyzer.serve.kernels import Kernel, Point, fit
from fxlens.analyzer.serve.windows import (
    kv_per_sequence,
    window_share,
    windowed_decode,
    windowed_prefill,
)
from fxlens.pipeline import AnalysisOptions, run_pipeline
from fxlens.reports.views.serve import memory_table

SMALL = {"num_hidden_layers": "4", "hidden_size": "256", "intermediate_size": "512",
         "num_attention_heads": "4", "num_key_value_heads": "2", "vocab_size": "1024",
         "max_position_embeddings": "4096"}


def test_a_window_keeps_the_pairs_of_the_band() -> None:
    for prompt, window in ((10, 3), (100, 99), (4096, 512)):
        pairs = sum(min(t, window) for t in range(1, prompt + 1))
        assert window_share(prompt, window) == pytest.approx(pairs / (prompt * (prompt + 1) / 2))
    assert window_share(100, 100) == window_share(100, math.inf) == 1.0


def test_a_sequence_holds_its_window_in_sliding_layers_and_everything_in_global_ones() -> None:
    # 1,000 tokens in blocks of 16: 63 blocks in a global layer, 8 (128 tokens) in a sliding
    assert kv_per_sequence(1000, 16, [(None, 3), (128, 5)]) == 63 * 16 * 3 + 8 * 16 * 5
    assert kv_per_sequence(100, 16, [(128, 5)]) == 7 * 16 * 5       # the window not reached


def _step(weights: tuple[float, ...]) -> tuple:
    """Three kernels: a weight read (constant), attention over the cache of layer 0 and of
    layer 1 (standing for the layers past the first): work c·b·L."""
    def kernels(b: int, c: int) -> tuple[Kernel, ...]:
        return (Kernel("mm", "model.layers.1.mlp", "bf16", "", 10.0 * b, 1e6, weights[0]),
                Kernel("sdpa", "model.layers.0.attn", "bf16", "", 4.0 * b * c, 2.0 * b * c,
                       weights[1]),
                Kernel("sdpa", "model.layers.1.attn", "bf16", "", 4.0 * b * c, 2.0 * b * c,
                       weights[2]))
    return fit([Point(b, c, kernels(b, c)) for b in (2, 4) for c in (100, 300)])


def layer_of(path: str) -> int | None:
    return int(path.split(".")[2]) if path.startswith("model.layers.") else None


def test_decode_kernels_read_at_most_their_layers_window() -> None:
    # six layers: 0 sliding (64), then 1, 2, 4 sliding and 3, 5 global
    windows = [64, 64, 64, None, 64, None]
    step = windowed_decode(_step((5.0, 1.0, 5.0)), layer_of, windows)
    assert [k.module for k in step.kernels] == [
        "model.layers.1.mlp", "model.layers.0.attn", "model.layers.1.attn",
        "model.layers.1.attn"]
    assert step.weights.tolist() == [5.0, 1.0, 3.0, 2.0]
    flops, moved = step.work(8, 1000)
    assert flops.tolist() == [80.0, 4 * 8 * 64, 4 * 8 * 64, 4 * 8 * 1000]
    assert moved.tolist() == [1e6, 2 * 8 * 64, 2 * 8 * 64, 2 * 8 * 1000]
    total, _ = step.totals(8, 1000)
    assert total == 5 * 80 + 4 * 8 * (64 + 3 * 64 + 2 * 1000)
    # below every window nothing changes
    assert step.totals(8, 50) == windowed_decode(_step((5.0, 1.0, 5.0)), layer_of,
                                                 [None] * 6).totals(8, 50)


def test_a_prefill_s_sliding_attention_keeps_the_window_s_share_of_flops() -> None:
    windows = [64, None, 64, None]
    step = windowed_prefill(_step((3.0, 1.0, 3.0)), layer_of, windows, 300,
                            lambda k: k.target == "sdpa")
    share = window_share(300, 64)
    flops, moved = step.work(2, 300)
    assert step.weights.tolist() == [3.0, 1.0, 2.0, 1.0]     # layer 1 stands for 1, 2, 3
    got = dict(zip(((k.module, w) for k, w in zip(step.kernels, step.weights.tolist(),
                                                  strict=True)), flops.tolist(), strict=True))
    assert got[("model.layers.0.attn", 1.0)] == pytest.approx(4 * 2 * 300 * share)
    assert got[("model.layers.1.attn", 1.0)] == pytest.approx(4 * 2 * 300 * share)   # layer 2
    assert got[("model.layers.1.attn", 2.0)] == pytest.approx(4 * 2 * 300)           # 1 and 3
    assert moved.tolist()[1:] == [2 * 2 * 300] * 3                        # bytes unchanged


def _serve(preset: str, **config: str) -> Serve:
    loaded = load_preset(preset, {**SMALL, **config}, batch=1, seq_len=32)
    options = AnalysisOptions(serve=True, device="h100", input_len=512, output_len=64,
                              fusion=False, serve_batches=(1, 8))   # type: ignore[arg-type]
    serve = run_pipeline(loaded, options).get(Serve)
    assert serve is not None
    return serve


@pytest.mark.slow
def test_mistral_with_a_window_narrower_than_the_context_serves_over_its_window() -> None:
    wide, narrow = _serve("mistral-7b", sliding_window="4096"), _serve(
        "mistral-7b", sliding_window="128")
    per_token = 4 * 2 * 2 * 64 * 2          # layers · K,V · kv heads · head dim · bf16
    assert narrow.kv_bytes_per_token == wide.kv_bytes_per_token == per_token
    assert narrow.kv_bytes_per_sequence == 128 * per_token      # 8 blocks of 16
    assert wide.kv_bytes_per_sequence == 576 * per_token        # 36 blocks
    assert narrow.block_waste_bytes == 0
    assert narrow.max_batch > wide.max_batch
    assert (narrow.kv_window_tokens, wide.kv_window_tokens) == (128, 0)   # 4,096 ≥ 576
    per_request = {row[0].text: row[1].text for row in memory_table(narrow).rows}
    assert "sliding layers hold their last 128 tokens" in per_request["KV cache per request"]
    # a decode step reads the window of every layer's cache instead of its mean context
    middle = 512 + (64 - 2) / 2
    read_less = wide.decode_bytes_per_step - narrow.decode_bytes_per_step
    assert read_less == pytest.approx((middle - 128) * per_token, rel=0.02)
    assert narrow.curve[0].tpot_s < wide.curve[0].tpot_s
    # the prompt's attention keeps a band of its query–key pairs: its FLOPs (whatever the
    # rule counts per pair) fall by the share of pairs the band drops
    half = _serve("mistral-7b", sliding_window="256")
    fewer = [wide.prefill_flops_per_request - s.prefill_flops_per_request
             for s in (narrow, half)]
    assert fewer[0] / fewer[1] == pytest.approx(
        (1 - window_share(512, 128)) / (1 - window_share(512, 256)), rel=1e-6)


@pytest.mark.slow
def test_gemma3_caches_the_window_in_sliding_layers_and_everything_in_global_ones() -> None:
    serve = _serve("gemma-3-1b", sliding_window="128", num_key_value_heads="1",
                   head_dim="64", layer_types='["sliding_attention", "full_attention", '
                   '"sliding_attention", "sliding_attention"]')
    layer = 2 * 1 * 64 * 2                  # K,V · one kv head · head dim · bf16
    assert serve.kv_bytes_per_token == 4 * layer
    assert serve.kv_bytes_per_sequence == 576 * layer + 3 * 128 * layer
    assert torch.isfinite(torch.tensor(serve.output_tokens_per_s)) and serve.max_batch > 0
