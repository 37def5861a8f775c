"""Views and metadata are free; reshape-like ops are free only when the strides allow a view."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fxlens.analyzer.core.costs import Cost
from fxlens.analyzer.core.graph import Node, NodeKind, TensorSpec
from fxlens.rules import load_rules
from fxlens.rules.views import METADATA_OPS, SYMBOLIC_OPS, VIEW_OPS, can_view
from tests.helpers import T, cost_of, op_call

m, n, k = 3, 4, 5
F32 = 4  # bytes per float32 element
FREE = Cost(flops=0, bytes_read=0, bytes_written=0)


def transposed(rows: int, cols: int) -> TensorSpec:
    """The (rows, cols) transpose of a contiguous (cols, rows) tensor: not contiguous."""
    return TensorSpec((rows, cols), "float32", (1, rows))


def expanded(rows: int, cols: int) -> TensorSpec:
    """A (cols,) row broadcast to (rows, cols): stride 0, storage of one row."""
    return TensorSpec((rows, cols), "float32", (0, 1))


FREE_CALLS: list[tuple[str, tuple[Any, ...]]] = [
    ("aten.view.default", (T(m, n), [n, m])),
    ("aten._unsafe_view.default", (T(m, n), [m * n])),
    ("aten.as_strided.default", (T(m, n), [n, m], [1, n])),
    ("aten.expand.default", (T(1, n), [m, n])),
    ("aten.broadcast_to.default", (T(1, n), [m, n])),  # Falcon's rotary embedding
    ("aten.permute.default", (T(m, n, k), [2, 0, 1])),
    ("aten.transpose.int", (T(m, n), 0, 1)),
    ("aten.t.default", (T(m, n),)),
    ("aten.unsqueeze.default", (T(m, n), 1)),
    ("aten.squeeze.default", (T(m, 1, n),)),
    ("aten.squeeze.dim", (T(m, 1, n), 1)),
    ("aten.squeeze.dims", (T(m, 1, n), [1])),
    ("aten.slice.Tensor", (T(m, n), 1, 0, 2)),
    ("aten.select.int", (T(m, n), 0, 1)),
    ("aten.split.Tensor", (T(m, n), 2, 1)),
    ("aten.split_with_sizes.default", (T(m, n), [1, 3], 1)),
    ("aten.chunk.default", (T(m, n), 2, 1)),
    ("aten.unbind.int", (T(m, n), 0)),
    ("aten.narrow.default", (T(m, n), 1, 1, 2)),
    ("aten.alias.default", (T(m, n),)),
    ("aten.detach.default", (T(m, n),)),
    ("aten.unflatten.int", (T(m, n * k), 1, [n, k])),
    ("aten.movedim.int", (T(m, n, k), 0, 2)),
    ("aten.diagonal.default", (T(n, n),)),
    ("aten.view_as_real.default", (T(m, n, dtype="complex64"),)),
    ("aten.view_as_complex.default", (T(m, 2),)),
    ("aten.unfold.default", (T(m, n), 1, 2, 1)),
    ("aten.lift_fresh.default", (T(m, n),)),
    ("aten.expand_as.default", (T(1, n), T(m, n))),
    ("aten.transpose_.default", (T(m, n), 0, 1)),
    ("aten.unsafe_split.Tensor", (T(m, n), 2, 1)),
    ("aten._assert_tensor_metadata.default", (T(m, n),)),
    ("aten.sym_size.int", (T(m, n), 0)),
]


@pytest.mark.parametrize(("target", "args"), FREE_CALLS, ids=[c[0] for c in FREE_CALLS])
def test_views_and_metadata_are_declared_free(target: str, args: tuple[Any, ...]) -> None:
    rule = load_rules().lookup(op_call(target, *args).node)
    assert isinstance(rule, str), f"{target} is not declared free: {rule!r}"


HOST_TARGETS = [
    "aten._local_scalar_dense.default", "aten.item.default", "aten._assert_async.msg",
    "aten._assert_scalar.default", "aten.sym_numel.default", "aten.sym_stride.int",
    "aten.sym_storage_offset.default", "prim.device.default", "_operator.getitem",
    "_operator.mul", "torch.sym_max",
]


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_host_side_targets_are_free(target: str) -> None:
    """Ops that need real data on the meta device are checked by name."""
    node = Node(0, NodeKind.CALL, target, {}, ())
    assert isinstance(load_rules().lookup(node), str)


# Overloads whose schema drops the alias annotation although they return a view of `self`.
UNANNOTATED_VIEWS = {"aten._unsafe_view", "aten.unsafe_split", "aten.unsafe_chunk",
                     "aten.unsafe_split_with_sizes", "aten.lift"}


@pytest.mark.parametrize("key", sorted(VIEW_OPS - UNANNOTATED_VIEWS))
def test_view_ops_alias_their_input_in_the_schema(key: str) -> None:
    """Every tensor a VIEW_OPS packet returns is annotated ``Tensor(a)``: no copy hides here."""
    packet = getattr(torch.ops.aten, key.removeprefix("aten."))
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        for ret in schema.returns:
            if "Tensor" in str(ret.type):
                assert ret.alias_info is not None, f"{key}.{overload} returns a fresh tensor"


@pytest.mark.parametrize("key", sorted(VIEW_OPS | METADATA_OPS))
def test_free_keys_name_real_ops(key: str) -> None:
    namespace, name = key.split(".")
    assert hasattr(getattr(torch.ops, namespace), name), key


def test_reshapes_that_may_copy_are_not_declared_free() -> None:
    assert not {"aten.reshape", "aten.flatten", "aten.contiguous", "aten.to"} & VIEW_OPS
    assert "_operator.getitem" in SYMBOLIC_OPS


RESHAPES: list[tuple[str, tuple[Any, ...], Cost]] = [
    # contiguous input: a view, free
    ("aten.reshape.default", (T(m, n), [n, m]), FREE),
    ("aten.flatten.using_ints", (T(m, n, k),), FREE),
    ("aten.ravel.default", (T(m, n),), FREE),
    # only dims 1..2 merged, and those are contiguous within the permuted tensor: still a view
    ("aten.flatten.using_ints", (TensorSpec((m, n, k), "float32", (1, k * m, m)), 1, 2), FREE),
    # non-contiguous input: clone + view, read the input and write the output once
    ("aten.reshape.default", (transposed(m, n), [m * n]),
     Cost(bytes_read=m * n * F32, bytes_written=m * n * F32)),
    ("aten.flatten.using_ints", (transposed(m, n),),
     Cost(bytes_read=m * n * F32, bytes_written=m * n * F32)),
    # an expanded input reads only its storage (one row) but writes every element
    ("aten.reshape.default", (expanded(m, n), [m * n]),
     Cost(bytes_read=n * F32, bytes_written=m * n * F32)),
    # reshape_as reads self only, never `other`
    ("aten.reshape_as.default", (transposed(m, n), T(m * n)),
     Cost(bytes_read=m * n * F32, bytes_written=m * n * F32)),
    ("aten.reshape_as.default", (T(m, n), T(m * n)), FREE),
]


@pytest.mark.parametrize(("target", "args", "expected"), RESHAPES)
def test_reshape_is_free_only_when_it_is_a_view(target: str, args: tuple[Any, ...],
                                                expected: Cost) -> None:
    assert cost_of(target, *args) == expected


def test_can_view_follows_torch() -> None:
    assert can_view(T(m, n), (n, m))
    assert not can_view(transposed(m, n), (m * n,))
    assert can_view(transposed(m, n), (m, 1, n))
