"""Structured-pruning knowledge: how each op carries channels from its inputs to its outputs
(axis rules), and how a module whose weights were sliced is told its new sizes.

Axis rules (one per op packet) read the layouts of their arguments through
`fxlens.analyzer.prune.types.AxisCall` and give their outputs' layouts. What couples channels:
- a contraction unifies the contracted axes (linear, mm, addmm, bmm, matmul: ``x[..., K]`` with
  ``W[:, K]``), so a layer's output channels meet the next layer's input channels;
- broadcasting ops (pointwise, residual adds) unify every operand's axis of the output's size;
- norms over the channel axis unify their weight with it (batch norm on dim 1, layer/RMS norm on
  the trailing dims); the weight is a member of the group;
- a convolution ties its weight's out axis to the output's dim 1 and its in axis to the input's;
  a depthwise convolution (``groups == C_in``, one input channel per group) ties output to input
  channels (``C_out = m·C_in``); any other grouped convolution pins its channels;
- attention unifies Q's and K's heads and feature dims, K's and V's heads and keys; with
  ``enable_gqa`` one KV head serves ``Hq / Hkv`` query heads, so the unit becomes a KV group;
- views keep units through reshapes (`fxlens.analyzer.prune.trace`); slices and ``cat`` cut and
  join spaces at their offsets; an embedding's rows are picked by value and are pinned.
An op without a rule pins every axis it touches: never pruned, named in the report.

Attribute fixes: after slicing, ``nn.Linear``/convs/norms/embeddings read their sizes from
their weights; attention modules with head counts (``num_heads``, ``num_attention_heads``,
``n_head``, ``num_key_value_heads``, ``all_head_size``) get them from their projections' widths
and ``head_dim``.

Rule-facing API used: `fxlens.analyzer.core` and `fxlens.analyzer.prune.types`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from fxlens.analyzer.core.graph import Node
from fxlens.analyzer.prune.types import Axes, AxisCall, AxisRule, PruneKnowledge, entries
from fxlens.rules.pointwise import POINTWISE
from fxlens.rules.quant import BATCH_NORM_TYPES, RESIDUAL_OPS
from fxlens.rules.views import METADATA_OPS

KERNEL_ALIGNMENTS = (128, 64, 8)    # tensor-core tiles (128, 64) and the 16-byte vector width


def _aten(names: str) -> list[str]:
    return [f"aten.{name}" for name in names.split()]


def _tensor_args(call: AxisCall) -> list[Axes | None]:
    return [call.axes(name) for name in call.node.args]


def pointwise(call: AxisCall) -> None:
    """Every output of the output's shape broadcasts every tensor operand."""
    operands = [a for a in _tensor_args(call) if a is not None]
    for i, spec in enumerate(call.node.outputs):
        if spec is not None:
            call.output(call.broadcast(spec.shape, *operands), i)


def reshape(call: AxisCall) -> None:
    axes, shape = call.axes("self"), call.shape("self")
    assert axes is not None and shape is not None
    call.output(call.reshape(axes, shape, call.out_shape()))


def transpose(call: AxisCall) -> None:
    axes = call.axes("self")
    assert axes is not None
    order = list(range(len(axes)))
    if call.node.packet == "aten.permute":
        order = [d % len(axes) for d in call.arg("dims")]
    elif len(axes) == 2 and call.node.packet == "aten.t":
        order = [1, 0]
    elif len(axes) >= 2:
        a, b = call.arg("dim0") % len(axes), call.arg("dim1") % len(axes)
        order[a], order[b] = b, a
    call.output(tuple(axes[d] for d in order))


def expand(call: AxisCall) -> None:
    call.output(call.broadcast(call.out_shape(), call.axes("self")))


def slice_(call: AxisCall) -> None:
    axes, shape = call.axes("self"), call.shape("self")
    assert axes is not None and shape is not None
    dim = call.arg("dim", 0) % len(axes)
    if call.arg("step", 1) != 1:
        raise ValueError("a strided slice")
    start = call.arg("start", 0)
    start = max(0, start + shape[dim] if start < 0 else start)
    end = call.arg("end", shape[dim])
    end = min(shape[dim], end + shape[dim] if end < 0 else end)
    cut = call.cut(axes[dim], start, max(start, end))
    call.output(axes[:dim] + (cut,) + axes[dim + 1:])


def split(call: AxisCall) -> None:
    """split / split_with_sizes / chunk / unsafe_split: consecutive slices along `dim`."""
    axes = call.axes("self")
    assert axes is not None
    dim = call.arg("dim", 0) % len(axes)
    offset = 0
    for i, spec in enumerate(call.node.outputs):
        assert spec is not None
        size = spec.shape[dim]
        call.output(axes[:dim] + (call.cut(axes[dim], offset, offset + size),)
                    + axes[dim + 1:], i)
        offset += size


def select(call: AxisCall) -> None:
    """select / unbind: one entry of `dim` is taken, the dim goes (its units pinned)."""
    axes = call.axes("self")
    assert axes is not None
    dim = call.arg("dim", 0) % len(axes)
    call.pin(axes[dim], f"one entry picked by {call.node.packet}")
    for i, spec in enumerate(call.node.outputs):
        if spec is not None:
            call.output(axes[:dim] + axes[dim + 1:], i)


def cat(call: AxisCall) -> None:
    parts = [a for a in call.axes_list("tensors") if not (len(a) == 1 and not a[0])]
    dim = call.arg("dim", 0) % len(parts[0])
    for other in parts[1:]:
        for d, (x, y) in enumerate(zip(parts[0], other, strict=True)):
            if d != dim:
                call.unify(x, y)
    joined = tuple(atom for part in parts for atom in part[dim])
    call.output(parts[0][:dim] + (joined,) + parts[0][dim + 1:])


def stack(call: AxisCall) -> None:
    parts = call.axes_list("tensors")
    for other in parts[1:]:
        for x, y in zip(parts[0], other, strict=True):
            call.unify(x, y)
    dim = call.arg("dim", 0) % (len(parts[0]) + 1)
    call.output(parts[0][:dim] + (call.fresh(len(parts), "stacked"),) + parts[0][dim:])


def linear(call: AxisCall) -> None:
    """``y[..., N] = x[..., K] @ W[N, K].T + b[N]``."""
    x, w, b = call.axes("input"), call.axes("weight"), call.axes("bias")
    assert x is not None and w is not None
    call.unify(x[-1], w[1])
    if b is not None:
        call.unify(b[0], w[0])
    call.output(x[:-1] + (w[0],))


def matmul(call: AxisCall) -> None:
    """mm / bmm / matmul / addmm / baddbmm: ``(…, M, K) @ (…, K, N)``; batch dims broadcast."""
    names = ("mat1", "mat2") if call.axes("mat1") is not None else (
        ("batch1", "batch2") if call.axes("batch1") is not None else ("self", "mat2")
        if call.axes("mat2") is not None else ("self", "other"))
    a, b = call.axes(names[0]), call.axes(names[1])
    assert a is not None and b is not None
    if len(a) < 2 or len(b) < 2:
        raise ValueError("a matrix-vector product")
    call.unify(a[-1], b[-2])
    batch = call.broadcast(call.out_shape()[:-2], a[:-2], b[:-2])
    out = batch + (a[-2], b[-1])
    bias = call.axes("self") if names[0] != "self" else None
    if bias is not None:
        out = call.broadcast(call.out_shape(), out, bias)
    call.output(out)


def embedding(call: AxisCall) -> None:
    w, idx = call.axes("weight"), call.axes("indices")
    assert w is not None and idx is not None
    call.pin(w[0], "embedding rows picked by value")
    call.output(idx + w[1:])


def layer_norm(call: AxisCall) -> None:
    """layer_norm / native_layer_norm / rms_norm: the weight over the trailing dims."""
    x = call.axes("input")
    assert x is not None
    for name in ("weight", "bias"):
        p = call.axes(name)
        if p is not None:
            for a, b in zip(p, x[len(x) - len(p):], strict=True):
                call.unify(a, b)
    for i, spec in enumerate(call.node.outputs):
        if spec is not None:
            call.output(call.broadcast(spec.shape, x), i)


def batch_norm(call: AxisCall) -> None:
    x = call.axes("input")
    assert x is not None
    for name in ("weight", "bias", "running_mean", "running_var"):
        p = call.axes(name)
        if p is not None:
            call.unify(p[0], x[1])
    for i, spec in enumerate(call.node.outputs):
        if spec is not None:
            shape = call.shape("input") or ()
            stats = (x[1],) if spec.shape == shape[1:2] else tuple(
                call.fresh(n, "batch-norm statistics") for n in spec.shape)
            call.output(x if spec.shape == shape else stats, i)


def convolution(call: AxisCall) -> None:
    x, w, b = call.axes("input"), call.axes("weight"), call.axes("bias")
    assert x is not None and w is not None
    transposed = bool(call.arg("transposed", False)) or "transpose" in call.node.packet
    groups = int(call.arg("groups", 1))
    w_out, w_in = (w[1], w[0]) if transposed else (w[0], w[1])
    out_layout = w_out
    if groups == 1:
        call.unify(x[1], w_in)
    elif not transposed and sum(a.entries for a in w_in) == 1 and \
            sum(a.entries for a in x[1]) == groups:
        multiplier = sum(a.entries for a in w_out) // groups        # depthwise: C_out = m·C_in
        call.unify(w_out, call.widen(x[1], multiplier))
    else:
        for layout in (x[1], w_out, w_in):
            call.pin(layout, f"grouped convolution (groups={groups})")
    if b is not None:
        call.unify(b[0], out_layout)
    for window in w[2:]:
        call.pin(window, "convolution window")
    spatial = tuple(call.fresh(n, "spatial") for n in call.out_shape()[2:])
    call.output((x[0], out_layout) + spatial)


def pooling(call: AxisCall) -> None:
    """Pools keep the leading (batch, channel) axes; spatial axes are new."""
    x, shape = call.axes("self"), call.shape("self")
    assert x is not None and shape is not None
    spatial = int(call.node.packet[-2]) if call.node.packet[-2].isdigit() else 2
    for i, spec in enumerate(call.node.outputs):
        if spec is not None:
            lead = x[:len(spec.shape) - spatial]
            call.output(lead + tuple(call.fresh(n, "spatial") for n in spec.shape[len(lead):]),
                        i)


def attention(call: AxisCall) -> None:
    """Q ``(…, Hq, Tq, E)``, K ``(…, Hkv, Tk, E)``, V ``(…, Hkv, Tk, Ev)`` → ``(…, Hq, Tq, Ev)``."""
    q, k, v = call.axes("query"), call.axes("key"), call.axes("value")
    assert q is not None and k is not None and v is not None
    out = call.out_shape()
    hq, hk = (entries(q[-3]), entries(k[-3])) if len(q) >= 3 and len(k) >= 3 else (1, 1)
    if hq != hk and hk and hq % hk == 0:
        call.unify(q[-3], call.widen(k[-3], hq // hk))            # one KV head, hq/hk queries
        batch = call.broadcast(out[:-3], q[:-3], k[:-3]) + (q[-3],)
    else:
        batch = call.broadcast(out[:-2], q[:-2], k[:-2])
    if len(k) >= 3 and len(v) >= 3:
        call.unify(k[-3], v[-3])
    call.unify(q[-1], k[-1])
    call.unify(k[-2], v[-2])
    mask = call.axes("attn_mask") or call.axes("attn_bias")
    if mask is not None:
        call.broadcast(out[:-1] + (entries(k[-2]),), batch + (q[-2], k[-2]), mask)
    call.output(batch + (q[-2], v[-1]))
    if len(call.node.outputs) > 1 and call.node.outputs[1] is not None:
        call.output(call.broadcast(call.out_shape(1), batch + (q[-2],)), 1)
    for i in range(2, len(call.node.outputs)):
        if call.node.outputs[i] is not None:
            call.output(tuple(call.fresh(n, "attention state") for n in call.out_shape(i)), i)


def reduction(call: AxisCall) -> None:
    """sum / mean / amax … over `dim` (all dims without one): reduced dims go (or stay as 1)."""
    x = call.axes("self")
    assert x is not None
    dims = call.arg("dim")
    dims = list(range(len(x))) if dims is None else (dims if isinstance(dims, list) else [dims])
    reduced = {d % max(len(x), 1) for d in dims}
    for i, spec in enumerate(call.node.outputs):
        if spec is None:
            continue
        kept = [layout for d, layout in enumerate(x) if d not in reduced or
                len(spec.shape) == len(x)]
        axes = tuple(layout if d not in reduced else call.fresh(1, "reduced")
                     for d, layout in enumerate(x)) if len(spec.shape) == len(x) else tuple(kept)
        call.output(axes, i)


def topk(call: AxisCall) -> None:
    x = call.axes("self")
    assert x is not None
    dim = call.arg("dim", -1) % len(x)
    call.pin(x[dim], f"ranked by {call.node.packet}")
    for i, spec in enumerate(call.node.outputs):
        if spec is not None:
            call.output(x[:dim] + (call.fresh(spec.shape[dim], "ranked"),) + x[dim + 1:], i)


def index(call: AxisCall) -> None:
    """``x[idx]`` with one index tensor on dim 0: rows picked, other axes kept."""
    x, idx = call.axes("self"), call.axes_list("indices")
    indices = call.arg("indices") or []
    assert x is not None
    if len(indices) != 1 or len(idx) != 1:  # a None in the list: a slice before the index
        raise ValueError("advanced indexing beyond one index on dim 0")
    call.pin(x[0], "rows picked by value")
    call.output(idx[0] + x[1:])


def index_add(call: AxisCall) -> None:
    x, src = call.axes("self"), call.axes("source")
    assert x is not None and src is not None
    dim = call.arg("dim") % len(x)
    call.pin(x[dim], "rows picked by value")
    for d, (a, b) in enumerate(zip(x, src, strict=True)):
        if d != dim:
            call.unify(a, b)
    call.output(x)


def like(call: AxisCall) -> None:
    """zeros_like and friends: the output has the input's shape, so its channels."""
    x = call.axes("self")
    assert x is not None
    call.output(x)


_ACTIVATIONS = ("gelu silu relu relu6 tanh sigmoid hardswish hardsigmoid mish elu selu celu "
                "leaky_relu softplus dropout native_dropout to _to_copy clone contiguous "
                "detach alias lift_fresh_copy softmax _softmax log_softmax _log_softmax "
                "where masked_fill pow rsqrt exp neg abs")


def _table() -> dict[str, AxisRule]:
    rules: dict[str, AxisRule] = {k: pointwise for k in POINTWISE if k.count(".") == 1}
    groups: tuple[tuple[str, AxisRule], ...] = (
        (_ACTIVATIONS, pointwise),
        ("view _unsafe_view reshape flatten unflatten squeeze unsqueeze view_as", reshape),
        ("t transpose permute", transpose), ("expand expand_as", expand),
        ("slice narrow", slice_), ("split split_with_sizes chunk unsafe_split", split),
        ("select unbind", select), ("cat concat", cat), ("stack", stack),
        ("linear", linear), ("mm bmm matmul addmm baddbmm", matmul),
        ("embedding", embedding), ("layer_norm native_layer_norm rms_norm", layer_norm),
        ("batch_norm native_batch_norm _native_batch_norm_legit_no_training "
         "_native_batch_norm_legit", batch_norm),
        ("convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d "
         "conv_transpose3d", convolution),
        ("max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d "
         "adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool2d "
         "max_pool2d_with_indices _adaptive_avg_pool2d", pooling),
        ("scaled_dot_product_attention _scaled_dot_product_flash_attention_for_cpu "
         "_scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention",
         attention),
        ("sum mean amax amin prod var std", reduction), ("topk sort", topk),
        ("index", index), ("index_add", index_add),
        ("zeros_like ones_like empty_like full_like rand_like randn_like", like),
    )
    for names, rule in groups:
        rules.update(dict.fromkeys(_aten(names), rule))
    return rules


AXIS_RULES: Mapping[str, AxisRule] = _table()

# --- modules after slicing ---------------------------------------------------------------------

_HEAD_COUNTS = ("num_heads", "num_attention_heads", "n_head", "n_heads")
_KV_COUNTS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")


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
    widths = {name: child.out_features for name, child in module.named_children()
              if isinstance(child, nn.Linear)}
    query = next((widths[n] for n in ("q_proj", "query", "q", "wq") if n in widths), None)
    key = next((widths[n] for n in ("k_proj", "key", "k", "wk") if n in widths), None)
    fixes: dict[str, Any] = {}
    if query is not None:
        fixes.update({n: query // head_dim for n in _HEAD_COUNTS if hasattr(module, n)})
        if hasattr(module, "all_head_size"):
            fixes["all_head_size"] = query
    if key is not None:
        fixes.update({n: key // head_dim for n in _KV_COUNTS if hasattr(module, n)})
    return fixes


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


def _scale_types() -> tuple[str, ...]:
    return BATCH_NORM_TYPES


def knowledge() -> PruneKnowledge:
    return PruneKnowledge(
        axis_rules=AXIS_RULES,
        ignored_ops=frozenset(METADATA_OPS),
        attribute_fixes=attribute_fixes,
        scale_types=_scale_types(),
        residual_ops=frozenset(RESIDUAL_OPS),
        alignments=KERNEL_ALIGNMENTS,
        resize_args=resize_args,
    )

