"""KV cache of a decoder: bytes per layer and in total, and the memory of one decode step.

An attention layer caches K and V for every context token: ``batch × tokens × kv_heads ×
(d_k + d_v)`` elements, ``2 × batch × tokens × kv_heads × head_dim`` when ``d_k = d_v``;
``tokens`` is the context, capped by the layer's sliding window (or attention chunk) when it
has one. Grouped-query attention shows in ``kv_heads`` (fewer than the query heads). A state
layer (linear attention, a scan, a short convolution) keeps ``batch × state_bytes`` whatever
the context; a layer reusing another's K and V keeps nothing.

Where a layer's layout comes from (`fxlens.kv_pass.kv_layout`):
(a) a `transformers` model: the cache the library builds for one decode token, layer by
    layer (`fxlens.analyzer.memory.cache_layers`), else its config
    (`fxlens.rules.kv_layouts`);
(b) otherwise the graph: each forward attention node (an op with ``query``/``key``/``value``
    tensor arguments, laid out ``(B, H, T, d)``; the token-major kernels the caller names,
    `fxlens.rules.kv_layouts.TOKEN_MAJOR_KERNELS`, take ``(B, T, H, d)``) is one layer, with
    the key's head count and last dim, the value's last dim. When some are causal, only the
    causal ones count (an encoder's or a cross-attention is never causal).
The cache dtype defaults to the module's parameter dtype.

Decode step (`decode_step`): weights + KV cache at the full context + the activation peak of
one decode token. NB: that peak is estimated as the liveness peak of the model captured on one
token per sequence without a cache; the attention of that token over the cached context adds
its scores, ``batch × heads × context`` per layer, only where attention is not fused (the
fused SDPA kernels never materialise them), and those are not included.

Known limitations: cross-attention caches of encoder-decoder models (``encoder tokens ×
layers``) are left out; from a graph, keys repeated for grouped-query attention before the
attention op count the query heads, and attention written as matmul → softmax → matmul is not
found. From a config (not the model's cache), compressed caches (MLA latents, quantized
caches) and state layers are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fxlens.analyzer.core.graph import Graph, NodeKind, TensorRef, dtype_bytes
from fxlens.analyzer.core.sections import DecodeStep, KVCache, KVLayerBytes
from fxlens.analyzer.memory.types import KVLayer


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
        tokens = 0 if layer.kind != "attention" else (
            min(context, layer.window) if layer.window else context)
        elements = batch * tokens * layer.kv_heads * (layer.k_head_dim + layer.v_head_dim)
        state = batch * layer.state_bytes
        rows.append(KVLayerBytes(layer.name, layer.kv_heads, layer.k_head_dim, layer.v_head_dim,
                                 tokens, int(elements * dtype_bytes) + state,
                                 kind=layer.kind, state_bytes=state))
    return KVCacheBytes(batch, context, dtype_bytes, tuple(rows),
                         sum(r.bytes for r in rows), source)


def decode_step(
    weights_bytes: int, cache: KVCacheBytes, token_activation_bytes: int
) -> DecodeStep:
    """Memory of one decode step (see the module docstring for the activation estimate)."""
    return DecodeStep(weights_bytes, cache.total_bytes, token_activation_bytes,
                            weights_bytes + cache.total_bytes + token_activation_bytes)


# --- layouts -----------------------------------------------------------------------------------

def layers_from_graph(graph: Graph, token_major: Sequence[str] = ()) -> list[KVLayer]:
    """Each forward attention node as one cached layer; `token_major` names the attention
    kernels whose q/k/v are laid out (B, T, H, d) rather than (B, H, T, d)."""
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
        head_axis = -2 if node.target.startswith(tuple(token_major)) else -3
        heads = key.shape[head_axis] if len(key.shape) >= -head_axis else 1
        layer = KVLayer(node.module or f"node {node.id}", heads, key.shape[-1], value.shape[-1])
        found.append((bool(node.args.get("is_causal")), layer))
    causal = [layer for is_causal, layer in found if is_causal]
    return causal or [layer for _, layer in found]


def cache_dtype_bytes(module: torch.nn.Module | None, graph: Graph | None) -> float:
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
