"""What each layer of a hybrid decoder keeps between decode steps, read from the cache the
model builds (`fxlens.analyzer.memory.cache_layers`), against closed forms from its config:

- softmax attention: 2 (K, V) × batch × tokens × kv_heads × head_dim × bytes, tokens capped at
  a sliding window;
- gated DeltaNet: the short convolution's last ``kernel`` inputs of the q, k, v channels and the
  recurrent state, value heads × d_k × d_v, per sequence;
- Mamba-2: the convolution's last ``kernel`` inputs of x, B and C and the SSM state, heads ×
  head_dim × state, per sequence;
- lightning attention: the K·V state, heads × d × d, per sequence;
- a KV-shared layer: nothing; MLA: the latent and the rotary key, one "head" per token.
The zoo models run in fp32: 4 bytes per element.
"""

from __future__ import annotations

from typing import Any

import pytest

from fxlens.analyzer.memory.cache_layers import token_ids_in
from fxlens.analyzer.memory.kv_cache import kv_cache
from fxlens.kv_pass import kv_layout
from tests.models.hf_zoo import ZOO

F32 = 4
BATCH, CONTEXT = 3, 40


def layout_of(name: str) -> tuple[Any, list[int]]:
    """The model's config and the bytes per layer at BATCH × CONTEXT, as fxlens reports."""
    module, inputs = ZOO[name]()
    layout = kv_layout(module, None, token_ids_in(inputs))
    assert layout.source == "model cache"
    cache = kv_cache(layout.layers, BATCH, CONTEXT, layout.dtype_bytes)
    assert cache.total_bytes == sum(r.bytes for r in cache.layers)
    return module.config, [r.bytes for r in cache.layers]


def kv(kv_heads: int, head_dim: int, tokens: int = CONTEXT) -> int:
    return 2 * BATCH * tokens * kv_heads * head_dim * F32


def deltanet_state(c: Any) -> int:
    conv = (2 * c.linear_num_key_heads * c.linear_key_head_dim
            + c.linear_num_value_heads * c.linear_value_head_dim) * c.linear_conv_kernel_dim
    recurrent = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
    return BATCH * (conv + recurrent) * F32


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5", "olmo_hybrid"])
def test_gated_deltanet_layers_keep_a_fixed_state_attention_layers_their_kv(name: str) -> None:
    config, per_layer = layout_of(name)
    expected = [deltanet_state(config) if kind == "linear_attention"
                else kv(config.num_key_value_heads, config.head_dim if hasattr(
                    config, "head_dim") and config.head_dim else
                    config.hidden_size // config.num_attention_heads)
                for kind in config.layer_types]
    assert per_layer == expected


def mamba2_state(hidden: int, expand: int, groups: int, state: int, kernel: int, heads: int,
                 head_dim: int) -> int:
    conv = (expand * hidden + 2 * groups * state) * kernel
    return BATCH * (conv + heads * head_dim * state) * F32


def test_mamba2_keeps_its_convolution_and_ssm_state_whatever_the_context() -> None:
    c, per_layer = layout_of("mamba2")
    state = mamba2_state(c.hidden_size, c.expand, c.n_groups, c.state_size, c.conv_kernel,
                         c.num_heads, c.head_dim)
    assert per_layer == [state] * c.num_hidden_layers


def test_granite_4_hybrid_keeps_mamba2_states_and_attention_kv() -> None:
    c, per_layer = layout_of("granite_moe_hybrid")
    state = mamba2_state(c.hidden_size, c.mamba_expand, c.mamba_n_groups, c.mamba_d_state,
                         c.mamba_d_conv, c.mamba_n_heads, c.mamba_d_head)
    attention = kv(c.num_key_value_heads, c.hidden_size // c.num_attention_heads)
    # the config names its Mamba layers "linear_attention" (given as "mamba")
    assert c.layer_types == ["linear_attention", "full_attention"]
    assert per_layer == [state, attention]


def test_minimax_lightning_attention_keeps_its_kv_product() -> None:
    c, per_layer = layout_of("minimax")
    assert per_layer == [BATCH * c.num_attention_heads * c.head_dim * c.head_dim * F32,
                         kv(c.num_key_value_heads, c.head_dim)]


def test_sliding_layers_cap_their_cache_at_the_window() -> None:
    c, per_layer = layout_of("gpt_oss")
    assert per_layer == [kv(c.num_key_value_heads, c.head_dim, tokens=c.sliding_window),
                         kv(c.num_key_value_heads, c.head_dim)]


def test_kv_shared_layers_keep_nothing() -> None:
    c, per_layer = layout_of("gemma3n")
    owners = c.num_hidden_layers - c.num_kv_shared_layers
    window = [min(CONTEXT, c.sliding_window) if t == "sliding_attention" else CONTEXT
              for t in c.layer_types]
    assert per_layer == ([kv(c.num_key_value_heads, c.head_dim, window[i])
                          for i in range(owners)] + [0] * c.num_kv_shared_layers)


def test_multi_head_latent_attention_caches_its_latent_and_rotary_key() -> None:
    c, per_layer = layout_of("deepseek_v3")
    per_token = c.kv_lora_rank + c.qk_rope_head_dim
    assert per_layer == [BATCH * CONTEXT * per_token * F32] * c.num_hidden_layers


def test_zamba2_hybrid_layers_keep_a_mamba_state_and_the_shared_attention_kv() -> None:
    """Zamba2's "hybrid" layers run a Mamba-2 block and the shared attention block (on the
    input concatenated with the embeddings: heads of 2·hidden / heads)."""
    c, per_layer = layout_of("zamba2")
    state = mamba2_state(c.hidden_size, c.mamba_expand, c.mamba_ngroups, c.mamba_d_state,
                         c.mamba_d_conv, c.n_mamba_heads, c.mamba_headdim)
    attention = kv(c.num_key_value_heads, c.attention_head_dim)
    assert per_layer == [state + attention if t == "hybrid" else state
                         for t in c.layers_block_type]
