"""Axis rules of the ops that hold parameters or contract channels: linear layers and matmuls,
embeddings, norms, convolutions (grouped and depthwise), pooling and resampling, attention.

What couples channels:
- a contraction unifies the contracted axes (linear, mm, addmm, bmm, matmul: ``x[..., K]`` with
  ``W[:, K]``), so a layer's output channels meet the next layer's input channels;
- norms over the channel axis unify their weight with it (batch norm on dim 1, layer/RMS norm on
  the trailing dims); the weight is a member of the group;
- a convolution ties its weight's out axis to the output's dim 1 and its in axis to the input's;
  a depthwise convolution (``groups == C_in``, one input channel per group) ties output to input
  channels (``C_out = m·C_in``); any other grouped convolution (``G`` groups) repeats one space
  of ``C/G`` units in every group on both sides: removing unit ``j`` removes channel ``j`` of
  every group, so the groups stay equal (as Torch-Pruning's pruner does for group convs);
- attention unifies Q's and K's heads and feature dims, K's and V's heads and keys; with
  ``enable_gqa`` one KV head serves ``Hq / Hkv`` query heads, so the unit becomes a KV group;
- an embedding's rows are picked by value and are pinned; its columns are the stream's channels.

Legend for shapes: ``N, C, H, W`` (convs), ``…, M, K, N`` (contractions), ``B, H, T, E``
(attention).
"""

from __future__ import annotations

from fxlens.analyzer.prune.types import AxisCall, entries


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
    """Weight ``(C_out, C_in/G, k…)``, transposed ``(C_in, C_out/G, k…)``; see the module
    docstring for how groups couple."""
    x, w, b = call.axes("input"), call.axes("weight"), call.axes("bias")
    assert x is not None and w is not None
    transposed = bool(call.arg("transposed", False)) or "transpose" in call.node.packet
    groups = int(call.arg("groups", 1))
    if groups == 1:
        call.unify(x[1], w[0] if transposed else w[1])
        out = w[1] if transposed else w[0]
    elif not transposed and entries(w[1]) == 1 and entries(x[1]) == groups:
        out = w[0]                                            # depthwise: C_out = m·C_in
        call.unify(out, call.widen(x[1], entries(w[0]) // groups))
    elif transposed:
        call.unify(w[0], call.fresh(entries(w[0]) // groups) * groups)
        call.unify(x[1], w[0])
        out = w[1] * groups
    else:
        call.unify(x[1], w[1] * groups)
        call.unify(w[0], call.fresh(entries(w[0]) // groups) * groups)
        out = w[0]
    if b is not None:
        call.unify(b[0], out)
    for window in w[2:]:
        call.pin(window, "convolution window")
    spatial = tuple(call.fresh(n, "spatial") for n in call.out_shape()[2:])
    call.output((x[0], out) + spatial)


def pooling(call: AxisCall) -> None:
    """Pools and resampling (upsample, interpolate) keep the leading (batch, channel) axes;
    spatial axes are new."""
    x, shape = call.axes("self") or call.axes("input"), call.shape("self") or call.shape("input")
    assert x is not None and shape is not None
    name = call.node.packet.removesuffix("_aa")
    spatial = int(name[-2]) if name[-2].isdigit() else 2
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
