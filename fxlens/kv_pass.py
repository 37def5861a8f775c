"""The KV cache pass: what each decoder layer keeps between decode steps, and the memory of one
decode step (`fxlens.analyzer.memory.kv_cache`), the layout read from the model's own cache
(`fxlens.analyzer.memory.cache_layers`), its config or its graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section
from fxlens.analyzer.core.sections import KVCache
from fxlens.analyzer.memory.cache_layers import layers_from_cache, token_ids_in
from fxlens.analyzer.memory.kv_cache import (
    cache_dtype_bytes,
    decode_step,
    kv_cache,
    layers_from_graph,
)
from fxlens.analyzer.memory.liveness import liveness
from fxlens.analyzer.memory.types import KVLayout
from fxlens.analyzer.time.roofline import throughput_basis
from fxlens.rules.kv_layouts import TOKEN_MAJOR_KERNELS, has_config, layers_from_config

if TYPE_CHECKING:
    from fxlens.pipeline import Context


class KVCachePass:
    """KV cache at the context and one decode step, whose activations come from the model
    captured again at one token (the example inputs' (batch, seq) tensors cut to one)."""

    name = "KV cache"
    provides: tuple[type[Section], ...] = (KVCache,)
    needs: tuple[type[Section], ...] = ()

    def wanted(self, options: Any) -> bool:
        return bool(options.kv_cache)

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        ctx.on_step("sizing the KV cache and one decode step")
        graph = ctx.forward()
        layout = kv_layout(ctx.loaded.module, graph, token_ids_in(ctx.loaded.inputs))
        if not layout.layers:
            raise LoadError("--kv-cache: no attention layers found (no transformers config "
                            "and no attention op in the graph)")
        basis = throughput_basis(graph)
        if not basis.tokens:
            raise LoadError("--kv-cache: the example inputs hold no (batch, sequence) token "
                            "tensor, so there is no sequence to cache")
        seq_len = basis.tokens // basis.samples
        batch = ctx.options.sizes.get("batch") or basis.samples
        cache = kv_cache(layout.layers, batch, ctx.options.context or seq_len,
                         layout.dtype_bytes, layout.source)
        token = capture(ctx.loaded.module, one_token_inputs(ctx.loaded.inputs, seq_len),
                        ctx.registry, ctx.options.methods)
        activations = liveness(token, ctx.registry).peak_activation_bytes
        weights = report.model.param_bytes + report.model.buffer_bytes
        return (cache.to_section(decode_step(weights, cache, activations)),)


def one_token_inputs(inputs: tuple[Any, ...] | dict[str, Any], seq_len: int
                     ) -> tuple[Any, ...] | dict[str, Any]:
    """The example inputs at one token: every 2-D (batch, `seq_len`) tensor cut to (batch, 1)."""

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[1] == seq_len:
            return value[:, :1]
        return value

    if isinstance(inputs, dict):
        return {k: cut(v) for k, v in inputs.items()}
    return tuple(cut(v) for v in inputs)


def kv_layout(module: torch.nn.Module, graph: Graph | None = None,
              token_ids: torch.Tensor | None = None) -> KVLayout:
    """The KV layout of a transformers model: from the cache the library builds for one
    token of `token_ids` when given (state layers of hybrids included), else its config;
    without a config, from `graph`'s attention nodes."""
    cached = (layers_from_cache(module, token_ids)
              if has_config(module) and token_ids is not None else None)
    if cached is not None:
        layers, source = cached, "model cache"
    elif has_config(module):
        layers, source = layers_from_config(module.config), "config"
    elif graph is not None:
        layers, source = layers_from_graph(graph, TOKEN_MAJOR_KERNELS), "graph"
    else:
        raise LoadError("--kv-cache: no transformers config on the model and no graph to read "
                        "attention layers from")
    return KVLayout(tuple(layers), cache_dtype_bytes(module, graph), source)
