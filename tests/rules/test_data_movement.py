"""Casts, copies, creation, random draws and dropout: bytes moved, (almost) no FLOPs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fxlens.analyzer.core.costs import Cost
from fxlens.analyzer.core.graph import TensorSpec
from fxlens.rules.data_movement import same_layout
from fxlens.rules.pointwise import S
from tests.helpers import T, cost_of

m, n, c, h, w = 3, 5, 4, 6, 7
N = m * n
F32, F16, BOOL = 4, 2, 1
FREE = Cost(flops=0, bytes_read=0, bytes_written=0)
DEFAULT = Cost()  # 0 FLOPs, the engine's default bytes

x = T(m, n)
transposed = TensorSpec((m, n), "float32", (1, m))
expanded = TensorSpec((m, n), "float32", (0, 1))  # one row of n broadcast to m rows
nchw = T(2, c, h, w)

CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], Cost]] = [
    # casts: free when nothing changes, else read self and write the output
    ("aten.to.dtype", (x, torch.float32), {}, FREE),
    ("aten.to.dtype", (x, torch.float32), {"copy": True}, Cost(bytes_read=N * F32)),
    ("aten.to.dtype", (x, torch.float16), {}, Cost(bytes_read=N * F32)),
    ("aten.to.dtype_layout", (x,), {"dtype": torch.float32}, FREE),
    ("aten.to.other", (x, T(1, dtype="float16")), {}, Cost(bytes_read=N * F32)),
    ("aten.to.other", (x, T(1)), {}, FREE),
    ("aten.to.dtype", (nchw, torch.float32), {"memory_format": torch.channels_last},
     Cost(bytes_read=nchw.nbytes)),
    ("aten.type_as.default", (x, T(m, n, dtype="float16")), {}, Cost(bytes_read=N * F32)),
    ("aten.type_as.default", (x, T(m, n)), {}, FREE),
    ("aten._to_copy.default", (x,), {"dtype": torch.float16}, DEFAULT),
    ("aten._to_copy.default", (x,), {}, DEFAULT),  # always a new tensor
    ("aten.contiguous.default", (x,), {}, FREE),
    ("aten.contiguous.default", (T(m, 1, n),), {}, FREE),
    ("aten.contiguous.default", (transposed,), {}, Cost(bytes_read=N * F32)),
    ("aten.contiguous.default", (nchw,), {"memory_format": torch.channels_last},
     Cost(bytes_read=nchw.nbytes)),
    # copies: the default bytes, 0 FLOPs
    ("aten.clone.default", (x,), {}, DEFAULT),
    ("aten.lift_fresh_copy.default", (x,), {}, DEFAULT),
    ("aten.cat.default", ([x, T(2, n)],), {}, DEFAULT),
    ("aten.stack.default", ([x, x],), {}, DEFAULT),
    ("aten.constant_pad_nd.default", (x, [1, 1]), {}, DEFAULT),
    ("aten.pad.default", (T(1, m, n), [1, 1], "reflect"), {}, DEFAULT),
    ("aten.repeat.default", (x, [2, 1]), {}, DEFAULT),
    ("aten.roll.default", (x, [1], [0]), {}, DEFAULT),
    ("aten.flip.default", (x, [0]), {}, DEFAULT),
    ("aten.tril.default", (x,), {}, DEFAULT),
    ("aten.slice_backward.default", (T(m, 2), [m, n], 1, 0, 2, 1), {}, DEFAULT),
    ("aten.slice_scatter.default", (x, T(m, 2), 1, 0, 2), {}, DEFAULT),
    ("aten.reflection_pad1d_backward.default", (T(1, m, n + 3), T(1, m, n), [1, 2]), {},
     Cost(flops=m * 3)),  # 3 padded columns per row, each added into an interior column
    ("aten.replication_pad2d_backward.default", (T(1, c, h + 2, w + 2), T(1, c, h, w),
                                                 [1, 1, 1, 1]), {},
     Cost(flops=c * ((h + 2) * (w + 2) - h * w))),
    ("aten.cat.out", ([x, x],), {"out": T(2 * m, n)}, Cost(bytes_read=2 * N * F32)),
    # src is read, the destination only gives shape and dtype
    ("aten.copy.default", (x, expanded), {}, Cost(bytes_read=n * F32)),
    ("aten.copy_.default", (x, expanded), {}, Cost(bytes_read=n * F32)),
    # materialised views read what the output holds, at most the source's storage
    ("aten.select_copy.int", (x, 0, 1), {}, Cost(bytes_read=n * F32)),
    ("aten.slice_copy.Tensor", (x, 1, 0, 2), {}, Cost(bytes_read=m * 2 * F32)),
    ("aten.expand_copy.default", (T(1, n), [m, n]), {}, Cost(bytes_read=n * F32)),
    ("aten.permute_copy.default", (x, [1, 0]), {}, Cost(bytes_read=N * F32)),
    ("aten.view_copy.default", (x, [N]), {}, Cost(bytes_read=N * F32)),
    # creation: nothing read, the output written (empty: allocation only)
    ("aten.zeros.default", ([m, n],), {}, Cost(bytes_read=0)),
    ("aten.full.default", ([m, n], 2.0), {}, Cost(bytes_read=0)),
    ("aten.zeros_like.default", (x,), {}, Cost(bytes_read=0)),
    ("aten.new_ones.default", (x, [n]), {}, Cost(bytes_read=0)),
    ("aten.scalar_tensor.default", (1.0,), {}, Cost(bytes_read=0)),
    ("aten.fill.Scalar", (x, 1.0), {}, Cost(bytes_read=0)),
    ("aten.fill_.Tensor", (x, T()), {}, Cost(bytes_read=1 * F32)),
    ("aten.zero_.default", (x,), {}, Cost(bytes_read=0)),
    ("aten.empty.memory_format", ([m, n],), {}, FREE),
    ("aten.empty_like.default", (x,), {}, FREE),
    ("aten.new_empty_strided.default", (x, [m, n], [n, 1]), {}, FREE),
    ("aten.arange.default", (n,), {}, Cost(flops=n * 2, bytes_read=0)),  # start + i·step
    ("aten.arange.start_step", (0, 2 * n, 2), {}, Cost(flops=n * 2, bytes_read=0)),
    ("aten.linspace.default", (0.0, 1.0, n), {}, Cost(flops=n * 2, bytes_read=0)),
    ("aten.logspace.default", (0.0, 1.0, n), {}, Cost(flops=n * (2 + S + 1), bytes_read=0)),
    # random draws: no FLOPs, parameter tensors read
    ("aten.rand.default", ([m, n],), {}, Cost(bytes_read=0)),
    ("aten.randn_like.default", (x,), {}, Cost(bytes_read=0)),
    ("aten.uniform_.default", (x,), {}, Cost(bytes_read=0)),
    ("aten.bernoulli.default", (x,), {}, Cost(bytes_read=N * F32)),  # x holds the probabilities
    ("aten.bernoulli.p", (x, 0.3), {}, Cost(bytes_read=0)),
    ("aten.bernoulli_.float", (x, 0.3), {}, Cost(bytes_read=0)),
    ("aten.bernoulli_.Tensor", (x, T(1, n)), {}, Cost(bytes_read=n * F32)),
    ("aten.normal.Tensor_Tensor", (x, x), {}, Cost(bytes_read=2 * N * F32)),
    # dropout: 1 FLOP per element in training, a bool mask written
    ("aten.native_dropout.default", (x, 0.1, True), {}, Cost(flops=N * 1)),
    ("aten.native_dropout.default", (x, 0.1, False), {}, DEFAULT),
    ("aten.native_dropout.default", (x, 0.0, True), {}, DEFAULT),
    ("aten.dropout.default", (x, 0.1, False), {}, FREE),
    ("aten.dropout.default", (x, 0.1, True), {},
     Cost(flops=N * 1, bytes_read=N * F32, bytes_written=N * F32 + N * BOOL)),
    ("aten.feature_dropout.default", (nchw, 0.1, True), {},
     Cost(flops=nchw.numel, bytes_read=nchw.nbytes, bytes_written=nchw.nbytes + 2 * c * BOOL)),
    ("aten.alpha_dropout.default", (x, 0.1, True), {},
     Cost(flops=N * 2, bytes_read=N * F32, bytes_written=N * F32 + N * BOOL)),
    # in place: nothing when not training, else the same work written over the input
    ("aten.dropout_.default", (x, 0.1, False), {}, FREE),
    ("aten.dropout_.default", (x, 0.0, True), {}, FREE),
    ("aten.dropout_.default", (x, 0.1, True), {},
     Cost(flops=N * 1, bytes_read=N * F32, bytes_written=N * F32 + N * BOOL)),
    ("aten.feature_dropout_.default", (nchw, 0.1, True), {},
     Cost(flops=nchw.numel, bytes_read=nchw.nbytes, bytes_written=nchw.nbytes + 2 * c * BOOL)),
    ("aten.alpha_dropout_.default", (x, 0.1, True), {},
     Cost(flops=N * 2, bytes_read=N * F32, bytes_written=N * F32 + N * BOOL)),
    ("aten.feature_alpha_dropout_.default", (nchw, 0.1, True), {},
     Cost(flops=2 * nchw.numel, bytes_read=nchw.nbytes,
          bytes_written=nchw.nbytes + 2 * c * BOOL)),
    ("aten.feature_alpha_dropout_.default", (nchw, 0.1, False), {}, FREE),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_cost(target: str, args: tuple[Any, ...], kwargs: dict[str, Any],
              expected: Cost) -> None:
    assert cost_of(target, *args, **kwargs) == expected


def test_half_precision_cast_reads_four_bytes_and_writes_two() -> None:
    """The default write is the fp16 output: the read side is what the rule states."""
    cost = cost_of("aten.to.dtype", x, torch.float16)
    assert cost.bytes_read == N * F32
    assert T(m, n, dtype="float16").nbytes == N * F16


@pytest.mark.parametrize(("a", "b", "same"), [
    (x, T(m, n), True),
    (T(m, 1, n), TensorSpec((m, 1, n), "float32", (n, 1, 1)), True),  # size-1 stride ignored
    (x, transposed, False),
    (x, T(m, n, dtype="float16"), False),
    (x, TensorSpec((m, n), "float32", (n, 1), "cpu"), False),
])
def test_same_layout(a: TensorSpec, b: TensorSpec, same: bool) -> None:
    assert same_layout(a, b) is same
