"""A `transformers` causal LM as a serving engine runs it: the prompt's prefill, and one decode
step against a KV cache of a given length — for `fxlens.analyzer.serve`.

- `decode_step(model)`: a module whose forward takes the new token's ids, its position and the
  cache's K and V tensors (one pair per layer, each (batch, kv_heads, context + 1, head_dim):
  the slot of the new token included, as a paged or static cache holds it) and runs the
  model's own forward against a `StaticCache` built on those tensors. So the decode graph is
  the library's real one — the new token's K/V written into its slot in place
  (``index_copy_``), attention over the whole cache — and every tensor is a plain input the
  capture puts on fake tensors (a cache object is not a pytree export can take).
- `prefill_inputs`: the prompt, computing the logits of its last position only
  (``logits_to_keep=1``), as engines do (the vocabulary projection of every prompt token is
  ~7 % of Llama-3-8B's prefill that no engine runs).
- Attention as serving kernels compute it (FlashAttention, FlashInfer, TensorRT-LLM's):
  grouped-query heads read their shared K and V directly (``enable_gqa``), no mask tensor —
  a decode step's query sees its whole cache, a prefill is causal. The library's own SDPA
  path copies K and V once per query head under export (``repeat_kv``: 4× Llama-3-8B's
  cache traffic) and builds a mask over the cache, which no engine does. `with_layers`
  builds the model with this attention (`ENGINE_ATTENTION`), everything else the library's.
- `with_layers(model, n)`: the same class and config on the meta device with `n` decoder
  layers. A decoder's layers are alike, so a graph of two of them holds every distinct kernel:
  `fxlens.analyzer.serve` captures that and counts the second layer's kernels once per layer
  past the first, so the captures cost the same whatever the depth.

The small model's layers all attend to their whole context (``layer_types`` all full, a
``sliding_window`` wider than any context): the engine attention reads whatever cache it is
given, and a sliding layer's window is applied to the captured work afterwards
(`fxlens.analyzer.serve.windows`), so its cache object keeps no cyclic window to reshape.

A model whose first k layers are dense and the rest MoE (DeepSeek's ``first_k_dense_replace``)
is built with one of each (`layers_standing_for`: the first stands for k layers, the second
for the rest). Multi-head latent attention decodes against its latent cache as engines do
(`fxlens.analyzer.capture.hf_mla`).

Models whose layers keep K and V (or an MLA latent) per token — dense and MoE decoders, full
or sliding-window attention — are built here: `unsupported_layout` says why another one is
not.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.capture.hf_mla import (
    absorb_latent,
    absorbed_attention,
    is_latent_attention,
    latent_layer,
    reads_latent,
)
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.memory.types import KVLayer

ENGINE_ATTENTION = "fxlens_engine"


def _engine_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Any, dropout: float = 0.0,
                      scaling: float | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """(B, H, T, d) queries against (B, H_kv, S, d) keys and values, as a serving kernel:
    causal over the prompt (T > 1), the whole cache for a decode token (T = 1); an MLA
    layer's decode against its latent cache with ``kv_b_proj`` absorbed (`hf_mla`)."""
    if reads_latent(module, key):
        return absorbed_attention(module, query, key, scaling), None
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=query.shape[2] > 1, scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*_: Any, **__: Any) -> None:
    return None


def _register_engine_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(ENGINE_ATTENTION, _engine_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ENGINE_ATTENTION, _no_mask)


class DecodeStep(nn.Module):
    """One decode step of `model` (see the module docstring); returns the logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.latent = any(is_latent_attention(m) for m in model.modules())

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor,
                *kv: torch.Tensor) -> torch.Tensor:
        from transformers import StaticCache

        config: Any = self.model.config
        cache: Any = StaticCache(config=config, max_cache_len=kv[0].shape[2])
        layer: Any
        for index, (layer, keys, values) in enumerate(zip(cache.layers, kv[::2], kv[1::2],
                                                           strict=True)):
            if self.latent:             # one latent buffer per layer (`hf_mla`)
                cache.layers[index] = latent_layer(keys)
                continue
            layer.keys, layer.values = keys, values
            layer.max_batch_size, layer.max_cache_len = keys.shape[0], keys.shape[2]
            layer.dtype, layer.device = keys.dtype, keys.device
            layer.is_initialized = True
        out = self.model(input_ids=input_ids, past_key_values=cache,
                         cache_position=cache_position, use_cache=True)
        logits: torch.Tensor = out.logits
        return logits


def decode_step(model: nn.Module) -> DecodeStep:
    return DecodeStep(model)


def decode_inputs(model: nn.Module, batch: int, context: int, layers: Sequence[KVLayer]
                  ) -> tuple[torch.Tensor, ...]:
    """(ids, position, K₀, V₀, K₁, V₁, …) of one decode step after `context` tokens, each
    layer's K and V shaped as its cache layout says (`layers`: one per decoder layer; an MLA
    layer's K is its latent buffer and its V empty, the layout having no separate V)."""
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    kv = [torch.empty(batch, layer.kv_heads, context + 1, width, device="meta", dtype=dtype)
          for layer in layers for width in (layer.k_head_dim, layer.v_head_dim)]
    ids = torch.zeros(batch, 1, dtype=torch.long, device="meta")
    return (ids, torch.tensor([context], device="meta"), *kv)


def prefill_inputs(batch: int, prompt: int) -> dict[str, Any]:
    """The prompt's ids; only the last position's logits computed."""
    return {"input_ids": torch.zeros(batch, prompt, dtype=torch.long, device="meta"),
            "logits_to_keep": 1, "use_cache": False}


def with_layers(model: nn.Module, layers: int) -> nn.Module:
    """`model`'s class and config with `layers` decoder layers, on the meta device."""
    config = copy.deepcopy(model.config)
    text = _text_config_of(config)
    dense = _dense_first(text)
    text.num_hidden_layers = layers
    if dense:          # one dense layer, then MoE ones (DeepSeek's first_k_dense_replace)
        text.first_k_dense_replace = 1
    if getattr(text, "layer_types", None):
        text.layer_types = ["full_attention"] * layers
    if getattr(text, "sliding_window", None):      # wider than any context served
        text.sliding_window = max(getattr(text, "max_position_embeddings", 0) or 0, 2**20)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    _register_engine_attention()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            built: Any = type(model)(config)
    finally:
        torch.set_default_dtype(previous)
    built.set_attn_implementation(ENGINE_ATTENTION)
    absorb_latent(built)
    small: nn.Module = built.eval()
    return small


def layer_count(model: nn.Module) -> int:
    return int(text_config(model).num_hidden_layers)


def layers_standing_for(model: nn.Module) -> tuple[int, int]:
    """How many of `model`'s decoder layers the first and the second layer of its
    `with_layers(model, 2)` copy stand for: (k, n − k) when its first k layers are dense and
    the rest MoE (``first_k_dense_replace``), else (1, n − 1)."""
    count = layer_count(model)
    dense = _dense_first(text_config(model))
    return (dense, count - dense) if dense else (1, count - 1)


def _dense_first(text: Any) -> int:
    """The k of a config whose first k layers are dense and the rest MoE; 0 for any other."""
    dense = getattr(text, "first_k_dense_replace", None)
    count = int(text.num_hidden_layers)
    return dense if isinstance(dense, int) and 0 < dense < count else 0


def unsupported_layout(model: nn.Module) -> str | None:
    """Why `model` cannot be served here (None: it can): no transformers causal-LM config, or
    layers that keep something else than K and V per token."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return "the model has no transformers config (serving estimates read its layers)"
    text = _text_config_of(config)
    generates = getattr(model, "can_generate", None)
    if callable(generates) and not generates():
        return (f"{type(model).__name__} does not generate text (transformers' can_generate() "
                f"is false): serving estimates decoder LMs")
    if getattr(text, "is_encoder_decoder", False):
        return "an encoder-decoder model (serving covers decoder-only LMs)"
    if not getattr(text, "num_attention_heads", None):
        return "no attention layers (a state-space model keeps no KV cache)"
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds - {"full_attention", "sliding_attention"}:
        return (f"layers of kinds {', '.join(sorted(kinds))} (only attention layers are served; "
                f"--kv-cache sizes every layer's cache, a recurrent layer's fixed state too)")
    return None


def text_config(model: nn.Module) -> Any:
    return _text_config_of(model.config)


def _text_config_of(config: Any) -> Any:
    if hasattr(config, "get_text_config"):
        return config.get_text_config(decoder=True)
    return config


def check_servable(model: nn.Module) -> None:
    reason = unsupported_layout(model)
    if reason is not None:
        raise LoadError(f"--serve: {reason}")
