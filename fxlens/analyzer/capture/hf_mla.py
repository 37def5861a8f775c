"""Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2, MiniCPM3 …)
decoded as serving engines decode it — for `fxlens.analyzer.capture.hf_decode`.

An MLA layer caches, per token, one latent of ``kv_lora_rank`` (512) plus the rotated key part
of ``qk_rope_head_dim`` (64) shared by every head: 576 values, one buffer in FlashMLA,
FlashInfer, vLLM and SGLang (`LatentLayer` holds it so). `transformers` caches the same two
parts but expands the whole cache through ``kv_b_proj`` into per-head K and V at every decode
step (B·L·512·H·256·2 FLOPs a layer); engines never do. They *absorb* ``kv_b_proj`` instead
(DeepSeek-V2 paper, §2.1.2): its key half W_UK (H, 128, 512) turns each head's non-rotary
query into the latent space, attention runs with 576-wide queries and keys over the latent
cache read once for all heads (MQA-shaped), and its value half W_UV (H, 128, 512) turns each
head's 512-wide output back into 128 values. `absorbed_attention` is that kernel sequence; a
prompt's prefill keeps the library's expanded form (compute-bound, as engines run it).

How the capture gets there without touching the library's forward: the decode cache's layers
are `LatentLayer`s, whose ``update`` writes the new token's latent into the one buffer and
returns it with ``None`` for the rotary part; `absorb_latent` gives each MLA attention module a
subclass whose ``expand_kv`` passes such a buffer through unexpanded; the engine attention
function sees a one-head, 576-wide key and calls `absorbed_attention`.

Cost conventions: the attention kernel is one fused SDPA call whose key and value are the same
buffer (read once, as FlashMLA reads it); its value side is the whole 576 width where FlashMLA
multiplies the first 512 (the value FLOPs 64/512 high, 6 % of the attention's FLOPs).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

LATENT_ATTRIBUTES = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                     "kv_b_proj")


def is_latent_attention(module: nn.Module) -> bool:
    return all(hasattr(module, name) for name in LATENT_ATTRIBUTES)


def reads_latent(module: nn.Module, key: torch.Tensor) -> bool:
    """Whether an attention call gets the one-head latent buffer (a decode step) rather than
    expanded per-head keys (a prefill)."""
    attn: Any = module
    return (is_latent_attention(module) and key.shape[1] == 1
            and key.shape[-1] == attn.kv_lora_rank + attn.qk_rope_head_dim)


def absorbed_attention(module: nn.Module, query: torch.Tensor, latent: torch.Tensor,
                       scaling: float | None) -> torch.Tensor:
    """(B, T, H, v_head_dim) outputs of queries (B, H, T, nope + rope) against the latent cache
    (B, 1, S, rank + rope), ``kv_b_proj`` absorbed into the query and the output."""
    attn: Any = module
    nope, rank, heads = attn.qk_nope_head_dim, attn.kv_lora_rank, query.shape[1]
    weight = attn.kv_b_proj.weight.view(heads, nope + attn.v_head_dim, rank)
    w_uk, w_uv = weight[:, :nope, :], weight[:, nope:, :]
    q_latent = torch.matmul(query[..., :nope], w_uk)                   # (B, H, T, rank)
    q = torch.cat((q_latent, query[..., nope:]), dim=-1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, latent, latent, scale=scaling, enable_gqa=heads > 1,
        is_causal=query.shape[2] > 1)
    values = torch.matmul(out[..., :rank], w_uv.transpose(1, 2))       # (B, H, T, v)
    return values.transpose(1, 2).contiguous()


def absorb_latent(model: nn.Module) -> None:
    """Give every MLA attention module of `model` (a meta copy fxlens built) an ``expand_kv``
    that passes the decode cache's latent buffer through."""
    for module in model.modules():
        if is_latent_attention(module) and hasattr(module, "expand_kv"):
            cls: Any = type(module)
            module.__class__ = _absorbing(cls)


@functools.cache
def _absorbing(cls: Any) -> type:
    def expand_kv(self: Any, kv_nope: torch.Tensor, k_rot: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        if k_rot is None:          # `LatentLayer`'s buffer: attention reads it as it is
            return kv_nope, kv_nope
        expanded: tuple[torch.Tensor, torch.Tensor] = cls.expand_kv(self, kv_nope, k_rot)
        return expanded

    return type(f"Absorbed{cls.__name__}", (cls,), {"expand_kv": expand_kv})


def latent_layer(buffer: torch.Tensor) -> Any:
    """A cache layer over one latent buffer (B, 1, S, rank + rope) for `transformers`'
    ``StaticCache``, its first S − 1 slots the context: the new token goes in the last slot,
    at that position."""
    from transformers.cache_utils import StaticLayer

    class LatentLayer(StaticLayer):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
                   *args: Any, **kwargs: Any) -> Any:
            token = torch.cat((key_states, value_states), dim=-1)
            position = torch.arange(token.shape[-2], device=token.device) + (
                self.max_cache_len - token.shape[-2])
            buffer.index_copy_(2, position, token)
            return buffer, None

    layer: Any = LatentLayer(max_cache_len=buffer.shape[2])
    layer.keys = layer.values = buffer
    layer.cumulative_length = torch.tensor(buffer.shape[2] - 1)
    layer.max_batch_size = buffer.shape[0]
    layer.dtype, layer.device = buffer.dtype, buffer.device
    layer.is_initialized = True
    return layer
