"""Axis rules of the ops that move, view and combine tensors without parameters: pointwise and
broadcasting ops, views and reshapes, transposes, slices, splits, concatenation, reductions,
padding, and the ops that create tensors from sizes alone.

What couples channels here: a broadcasting op (a residual add, a gate's multiply) unifies every
operand's axis of the output's size; a view keeps units through the reshape
(`fxlens.analyzer.prune.trace`); a slice and a ``cat`` cut and join spaces at their offsets.
What pins: an axis an op picks entries of by value (``select``, ``gather``, ``topk``), pads,
scans (``cumsum``) or repeats, and every axis of a tensor made from sizes (``arange``,
``zeros``): its length is written in the op's arguments, which pruning does not change.
"""

from __future__ import annotations

from fxlens.analyzer.prune.types import Axes, AxisCall, AxisRule


def tensor_args(call: AxisCall) -> list[Axes | None]:
    return [call.axes(name) for name in call.node.args]


def pointwise(call: AxisCall) -> None:
    """Every output of the output's shape broadcasts every tensor operand."""
    operands = [a for a in tensor_args(call) if a is not None]
    for i, spec in enumerate(call.node.outputs):
        if spec is not None:
            call.output(call.broadcast(spec.shape, *operands), i)


def reshape(call: AxisCall) -> None:
    axes, shape = call.axes("self"), call.shape("self")
    assert axes is not None and shape is not None
    call.output(call.reshape(axes, shape, call.out_shape()))


def transpose(call: AxisCall) -> None:
    """t / transpose / permute / numpy_T (every dim reversed)."""
    axes = call.axes("self")
    assert axes is not None
    order = list(range(len(axes)))
    if call.node.packet == "aten.permute":
        order = [d % len(axes) for d in call.arg("dims")]
    elif call.node.packet == "aten.numpy_T" or (len(axes) == 2 and call.node.packet == "aten.t"):
        order.reverse()
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


def reduction(call: AxisCall) -> None:
    """sum / mean / amax / min … over `dim` (all dims without one): reduced dims go (or stay
    as 1); a min/max over every dim gives a scalar."""
    x = call.axes("self")
    assert x is not None
    if call.axes("other") is not None:                   # max/min of two tensors
        pointwise(call)
        return
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


def along(reason: str) -> AxisRule:
    """An op whose output has the input's shape, mixing entries along `dim` (cumsum,
    cumprod): that axis pinned, the others kept."""
    def rule(call: AxisCall) -> None:
        x = call.axes("self")
        assert x is not None
        dim = call.arg("dim", -1) % len(x)
        call.pin(x[dim], reason)
        for i, spec in enumerate(call.node.outputs):
            if spec is not None:
                call.output(x, i)
    return rule


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


def _picked_along_dim(call: AxisCall, other: str, reason: str) -> tuple[Axes, Axes]:
    """``self`` and `other`, whose dims meet but for ``dim``, along which `self`'s entries
    are picked by value (pinned for `reason`)."""
    x, y = call.axes("self"), call.axes(other)
    assert x is not None and y is not None
    dim = call.arg("dim") % len(x)
    call.pin(x[dim], reason)
    for d, (a, b) in enumerate(zip(x, y, strict=True)):
        if d != dim:
            call.unify(a, b)
    return x, y


def index_add(call: AxisCall) -> None:
    x, _ = _picked_along_dim(call, "source", "rows picked by value")
    call.output(x)


def gather(call: AxisCall) -> None:
    """``gather(x, dim, index)``: the output has the index's shape; x's `dim` is picked by
    value, its other dims meet the index's."""
    _, idx = _picked_along_dim(call, "index", "entries picked by value")
    call.output(idx)


def like(call: AxisCall) -> None:
    """zeros_like and friends: the output has the input's shape, so its channels."""
    x = call.axes("self")
    assert x is not None
    call.output(x)


def pad(call: AxisCall) -> None:
    """pad / constant_pad_nd: ``pad`` holds (before, after) pairs from the last dim backwards;
    a padded axis is pinned (its length is written in the op), the others are kept."""
    x = call.axes("self")
    assert x is not None
    pads = list(call.arg("pad", ()))
    out = list(x)
    for k in range(len(pads) // 2):
        dim = len(x) - 1 - k
        if pads[2 * k] or pads[2 * k + 1]:
            call.pin(x[dim], "padded")
            out[dim] = call.fresh(call.out_shape()[dim], "padded")
    call.output(tuple(out))


def created(call: AxisCall) -> None:
    """arange, zeros, ones, full, new_ones…: sizes written in the arguments, never pruned;
    any tensor argument (``new_*``'s template) is read for its dtype only."""
    for i, spec in enumerate(call.node.outputs):
        if spec is not None:
            call.output(tuple(call.fresh(n, f"made by {call.node.packet}") for n in spec.shape),
                        i)


def pinned_all(reason: str) -> AxisRule:
    """An op that moves entries across axes in ways units do not follow (repeat, roll):
    its inputs and outputs pinned, with `reason`."""
    def rule(call: AxisCall) -> None:
        for axes in tensor_args(call):
            for layout in axes or ():
                call.pin(layout, reason)
        for i, spec in enumerate(call.node.outputs):
            if spec is not None:
                call.output(tuple(call.fresh(n, reason) for n in spec.shape), i)
    return rule

