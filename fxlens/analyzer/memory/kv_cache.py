"""KV cache of a decoder: bytes per layer and in total, and the memory of one decode step.

A layer caches K and V for every context token: ``batch × tokens × kv_heads × (d_k + d_v)``
elements, ``2 × batch × tokens × kv_heads × head_dim`` when ``d_k = d_v``; ``tokens`` is the
context, capped by the layer's sliding window when it has one. Grouped-query attention shows
in ``kv_heads`` (fewer than the query heads).

Where a layer's layout comes from (`kv_layout`):
(a) a `transformers` config on the module (``module.config``, the decoder's text config for
    multimodal models): ``num_hidden_layers``, ``num_key_value_heads`` (default
    ``num_attention_heads``), ``head_dim`` (default ``hidden_size // num_attention_heads``;
    ``qk_head_dim``/``v_head_dim`` where a config has them). Encoder-decoder models count
    their decoder's self-attention layers (``decoder_layers``/``num_decoder_layers``,
    ``decoder_attention_heads``). ``layer_types`` marks sliding-window layers; without it a
    set ``sliding_window`` (unless ``use_sliding_window`` is false) caps every layer.
(b) otherwise the graph: each forward attention node (an op with ``query``/``key``/``value``
    tensor arguments, laid out ``(B, H, T, d)``; the raw ``_flash_attention_forward`` and
    ``_efficient_attention_forward`` kernels take ``(B, T, H, d)``) is one layer, with the key's
    head count and last dim, the value's last dim. When some are causal, only the causal ones
    count (an encoder's or a cross-attention is never causal).
The cache dtype defaults to the module's parameter dtype.

Decode step (`decode_step`): weights + KV cache at the full context + the activation peak of
one decode token. NB: that peak is estimated as the liveness peak of the model captured on one
token per sequence without a cache; the attention of that token over the cached context adds
its scores, ``batch × heads × context`` per layer, only where attention is not fused (the
fused SDPA kernels never materialise them), and those are not included.

Known limitations: cross-attention caches of encoder-decoder models (``encoder tokens ×
layers``) are left out; from a graph, keys repeated for grouped-query attention before the
attention op count the query heads, and attention written as matmul → softmax → matmul is not
found. Compressed caches (MLA latents, quantized caches) are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxlens.analyzer.core.graph import Graph, NodeKind, TensorRef, dtype_bytes
from fxlens.analyzer.core.sections import DecodeStep, KVCache, KVLayerBytes

TOKEN_MAJOR_KERNELS = ("aten._flash_attention_forward", "aten._efficient_attention_forward")


@dataclass(frozen=True)
class KVLayer:
    """The cached layout of one attention layer."""

    name: str
    kv_heads: int
    k_head_dim: int
    v_head_dim: int
    window: int | None = None      # sliding window: at most this many tokens are cached


@dataclass(frozen=True)
class KVLayout:
    layers: tuple[KVLayer, ...]
    dtype_bytes: float
    source: str                    # "config" or "graph"


@dataclass(frozen=True)
class KVCacheBytes:
    batch: int
    context: int
    dtype_bytes: float
    layers: tuple[KVLayerBytes, ...]
    total_bytes: int
    source: str = ""

    def to_section(self, step: DecodeStep) -> KVCache:
        return KVCache(batch=self.batch, context=self.context, dtype_bytes=self.dtype_bytes,
                       source=self.source, total_bytes=self.total_bytes, layers=self.layers,
                       decode_step=step)


def kv_cache(
    layers: Sequence[KVLayer], batch: int, context: int, dtype_bytes: float, source: str = ""
) -> KVCacheBytes:
    """Bytes of the K and V cache of `layers` for `batch` sequences of `context` tokens."""
    if batch < 1 or context < 1:
        raise ValueError(f"batch and context must be positive, got {batch} and {context}")
    rows = []
    for layer in layers:
        tokens = min(context, layer.window) if layer.window else context
        elements = batch * tokens * layer.kv_heads * (layer.k_head_dim + layer.v_head_dim)
        rows.append(KVLayerBytes(layer.name, layer.kv_heads, layer.k_head_dim, layer.v_head_dim,
                                 tokens, int(elements * dtype_bytes)))
    return KVCacheBytes(batch, context, dtype_bytes, tuple(rows),
                         sum(r.bytes for r in rows), source)


def decode_step(
    weights_bytes: int, cache: KVCacheBytes, token_activation_bytes: int
) -> DecodeStep:
    """Memory of one decode step (see the module docstring for the activation estimate)."""
    return DecodeStep(weights_bytes, cache.total_bytes, token_activation_bytes,
                            weights_bytes + cache.total_bytes + token_activation_bytes)


# --- layouts -----------------------------------------------------------------------------------

def kv_layout(module: torch.nn.Module | None = None, graph: Graph | None = None) -> KVLayout:
    """The layout from `module`'s transformers config when it has one, else from `graph`."""
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        layers = layers_from_config(config)
        source = "config"
    elif graph is not None:
        layers = layers_from_graph(graph)
        source = "graph"
    else:
        raise ValueError("a KV-cache layout needs a module with a transformers config or a graph")
    return KVLayout(tuple(layers), _dtype_bytes(module, graph), source)


def layers_from_config(config: Any) -> list[KVLayer]:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    seq2seq = bool(getattr(text, "is_encoder_decoder", False))
    count = _first(text, ("decoder_layers", "num_decoder_layers") if seq2seq else ()) or (
        text.num_hidden_layers)
    heads = _first(text, ("decoder_attention_heads",) if seq2seq else ()) or (
        text.num_attention_heads)
    kv_heads = heads if seq2seq else (_first(text, ("num_key_value_heads",)) or heads)
    head_dim = _first(text, ("head_dim",)) or text.hidden_size // heads
    k_dim = _first(text, ("qk_head_dim",)) or head_dim
    v_dim = _first(text, ("v_head_dim",)) or head_dim
    windows = _windows(text, count)
    return [KVLayer(f"layer {i}", kv_heads, k_dim, v_dim, windows[i]) for i in range(count)]


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


def layers_from_graph(graph: Graph) -> list[KVLayer]:
    found = []
    for node in graph.nodes:
        if node.kind is not NodeKind.CALL or node.phase != "forward" or "backward" in node.target:
            continue
        refs = [node.args.get(name) for name in ("query", "key", "value")]
        if not all(isinstance(r, TensorRef) for r in refs):
            continue
        key, value = (graph.spec(r) for r in refs[1:] if isinstance(r, TensorRef))
        if key is None or value is None:
            continue
        head_axis = -2 if node.target.startswith(TOKEN_MAJOR_KERNELS) else -3
        heads = key.shape[head_axis] if len(key.shape) >= -head_axis else 1
        layer = KVLayer(node.module or f"node {node.id}", heads, key.shape[-1], value.shape[-1])
        found.append((bool(node.args.get("is_causal")), layer))
    causal = [layer for is_causal, layer in found if is_causal]
    return causal or [layer for _, layer in found]


def _dtype_bytes(module: torch.nn.Module | None, graph: Graph | None) -> float:
    """The first floating parameter's element size (fp32 when there is none)."""
    if module is not None:
        floating = [p for p in module.parameters() if p.is_floating_point()]
        if floating:
            return float(floating[0].element_size())
    if graph is not None:
        dtypes = [p.spec.dtype for p in graph.params if p.spec.dtype.startswith(("float", "bf"))]
        if dtypes:
            return float(dtype_bytes(dtypes[0]))
    return 4.0
