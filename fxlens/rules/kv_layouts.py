"""KV cache layouts as model families describe them: `transformers` configs and kernels.

`layers_from_config(config)` reads a `transformers` config (the decoder's text config for
multimodal models): ``num_hidden_layers``, ``num_key_value_heads`` (default
``num_attention_heads``), ``head_dim`` (default ``hidden_size // num_attention_heads``;
``qk_head_dim``/``v_head_dim`` where a config has them). Encoder-decoder models count their
decoder's self-attention layers (``decoder_layers``/``num_decoder_layers``,
``decoder_attention_heads``). ``layer_types`` marks sliding-window layers; without it a set
``sliding_window`` (unless ``use_sliding_window`` is false) caps every layer. Multi-head
latent attention (``kv_lora_rank``: DeepSeek-V2/V3 and kin) caches one latent per token shared
by every head, ``kv_lora_rank + qk_rope_head_dim`` values (576 for DeepSeek-V3), as
`transformers` and serving engines do: one "head" of that width and no separate V.

`TOKEN_MAJOR_KERNELS`: attention kernels whose q/k/v are (B, T, H, d) rather than (B, H, T, d).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fxlens.analyzer.memory.types import KVLayer

TOKEN_MAJOR_KERNELS = ("aten._flash_attention_forward", "aten._efficient_attention_forward")


def has_config(module: Any) -> bool:
    """Whether `module` carries a `transformers` config to read the layout from."""
    config = getattr(module, "config", None)
    return config is not None and hasattr(config, "to_dict")


def layers_from_config(config: Any) -> list[KVLayer]:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    seq2seq = bool(getattr(text, "is_encoder_decoder", False))
    count = _first(text, ("decoder_layers", "num_decoder_layers") if seq2seq else ()) or (
        text.num_hidden_layers)
    heads = _first(text, ("decoder_attention_heads",) if seq2seq else ()) or (
        getattr(text, "num_attention_heads", None))
    if not heads:      # no attention (a pure state-space model): no layer caches K and V
        return []
    kv_heads = heads if seq2seq else (_first(text, ("num_key_value_heads",)) or heads)
    head_dim = _first(text, ("head_dim",)) or text.hidden_size // heads
    k_dim = _first(text, ("qk_head_dim",)) or head_dim
    v_dim = _first(text, ("v_head_dim",)) or head_dim
    windows = _windows(text, count)
    latent = latent_width(text)
    if latent:
        kv_heads, k_dim, v_dim = 1, latent, 0
    return [KVLayer(f"layer {i}", kv_heads, k_dim, v_dim, windows[i]) for i in range(count)]


def latent_width(config: Any) -> int | None:
    """Values one MLA layer caches per token (``kv_lora_rank + qk_rope_head_dim``), None for a
    model without latent attention."""
    rank = getattr(config, "kv_lora_rank", None)
    return int(rank) + int(getattr(config, "qk_rope_head_dim", 0) or 0) if rank else None


def _first(config: Any, names: Sequence[str]) -> Any:
    return next((getattr(config, n) for n in names if getattr(config, n, None)), None)


def _windows(config: Any, count: int) -> list[int | None]:
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types[:count]]
    if window and getattr(config, "use_sliding_window", True) is not False:
        return [window] * count
    return [None] * count
