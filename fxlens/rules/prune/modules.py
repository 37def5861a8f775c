"""Modules after slicing: the size attributes each module is told from its sliced weights, and
the op arguments that state a size the pruning changed.

After slicing, ``nn.Linear``/convs/norms/embeddings read their sizes from their weights;
GPT-2's ``Conv1D`` its ``nf``/``nx``; attention modules with head counts (``num_heads``,
``num_attention_heads``, ``n_head``, ``num_key_value_heads``, ``all_head_size``) get them from
their projections' widths and ``head_dim``, and GPT-2's fused ``c_attn`` its ``split_size``.
A depthwise convolution's ``groups`` follows its channels; a grouped one keeps its groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.core.graph import Node

_HEAD_COUNTS = ("num_heads", "num_attention_heads", "n_head", "n_heads")
_KV_COUNTS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
_QUERY = ("q_proj", "query", "q", "wq")
_KEY = ("k_proj", "key", "k", "wk")


def attribute_fixes(module: nn.Module) -> Mapping[str, Any]:
    """The size attributes of `module` read from its (sliced) weights."""
    if isinstance(module, nn.Linear):
        return {"in_features": module.weight.shape[1], "out_features": module.weight.shape[0]}
    if isinstance(module, nn.modules.conv._ConvNd):
        return _conv_fixes(module)
    if isinstance(module, nn.modules.batchnorm._NormBase):
        return {"num_features": _first_dim(module, "weight", "running_mean")}
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and module.weight is not None:
        return {"normalized_shape": tuple(module.weight.shape)}
    if isinstance(module, nn.Embedding):
        return {"embedding_dim": module.weight.shape[1]}
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):   # GPT-2: W (nx, nf)
        nx, nf = _weight(module).shape
        return {"nx": nx, "nf": nf}
    return _head_fixes(module)


def _first_dim(module: nn.Module, *names: str) -> int:
    for name in names:
        tensor = getattr(module, name, None)
        if tensor is not None:
            return int(tensor.shape[0])
    raise ValueError(f"{type(module).__name__} has none of {names}")


def _conv_fixes(conv: nn.modules.conv._ConvNd) -> Mapping[str, Any]:
    w = conv.weight
    depthwise = conv.groups > 1 and conv.groups == conv.in_channels
    out_ch = w.shape[1] * conv.groups if conv.transposed else w.shape[0]
    in_ch = w.shape[0] if conv.transposed else w.shape[1] * conv.groups
    if depthwise and not conv.transposed:
        multiplier = conv.out_channels // conv.in_channels
        in_ch = w.shape[0] // multiplier
        return {"in_channels": in_ch, "out_channels": w.shape[0], "groups": in_ch}
    return {"in_channels": in_ch, "out_channels": out_ch}


def _head_fixes(module: nn.Module) -> Mapping[str, Any]:
    """Head counts of an attention module from its projections' widths."""
    head_dim = getattr(module, "head_dim", None) or getattr(module, "attention_head_size", None)
    if not isinstance(head_dim, int) or head_dim <= 0:
        return {}
    widths = {name: _out_width(child) for name, child in module.named_children()}
    query = next((widths[n] for n in _QUERY if widths.get(n)), None)
    key = next((widths[n] for n in _KEY if widths.get(n)), None)
    fixes: dict[str, Any] = {}
    fused = widths.get("c_attn")
    if query is None and fused and hasattr(module, "split_size") and fused % 3 == 0:
        query = key = fused // 3                     # GPT-2: one projection, Q | K | V
        fixes["split_size"] = query
    if query is not None:
        fixes.update({n: query // head_dim for n in _HEAD_COUNTS if hasattr(module, n)})
        if hasattr(module, "all_head_size"):
            fixes["all_head_size"] = query
    if key is not None:
        fixes.update({n: key // head_dim for n in _KV_COUNTS if hasattr(module, n)})
    return fixes


def _out_width(module: nn.Module) -> int | None:
    if isinstance(module, nn.Linear):
        return module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return int(_weight(module).shape[1])
    return None


def _weight(module: nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return weight


def resize_args(node: Node, shapes: Sequence[tuple[int, ...]],
                new_shapes: Sequence[tuple[int, ...]]) -> Mapping[str, Any]:
    """Arguments that state a size the pruning changed: a depthwise conv's ``groups``, a
    layer norm's ``normalized_shape``; `shapes` are the input tensors' before and after."""
    args = dict(node.args)
    if "groups" in args and shapes and len(shapes[0]) > 1 and args["groups"] == shapes[0][1]:
        args["groups"] = new_shapes[0][1]
    if "normalized_shape" in args and shapes:
        args["normalized_shape"] = list(new_shapes[0][len(new_shapes[0])
                                                      - len(args["normalized_shape"]):])
    return args
