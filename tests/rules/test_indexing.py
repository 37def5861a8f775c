"""Gather/scatter/embedding/mask rules: FLOPs and, above all, bytes that follow the elements
actually gathered or scattered (fxlens/rules/indexing.py).

Itemsizes: float32 4, int64 8, bool 1. Out-of-place scatters also copy ``self`` whole.
"""

from __future__ import annotations

from typing import Any

import pytest

from fxlens.analyzer.core.graph import TensorSpec
from fxlens.rules import load_rules
from tests.helpers import T, cost_of

i64, f32 = "int64", "float32"
FB, IB = 4, 8  # bytes per float32 / int64 element


def test_embedding_reads_only_the_looked_up_rows():
    """8 tokens from a 32000×4096 table: 8 rows and the indices, not 500 MiB."""
    vocab, dim, tokens = 32000, 4096, 8
    cost = cost_of("aten.embedding.default", T(vocab, dim), T(1, tokens, dtype=i64))
    assert cost.flops == 0
    assert cost.bytes_read == tokens * IB + tokens * dim * FB
    assert cost.bytes_read < vocab * dim * FB // 1000
    assert cost.bytes_written is None  # the default: the (1, 8, 4096) output


def test_embedding_bytes_use_the_table_dtype():
    cost = cost_of("aten.embedding.default", T(100, 64, dtype="bfloat16"), T(5, dtype="int32"))
    assert cost.bytes_read == 5 * 4 + 5 * 64 * 2


# (target, args, kwargs, flops, bytes_read, bytes_written); None = the engine's default
GATHERS: list[tuple[str, tuple[Any, ...], dict[str, Any], int, int | None, int | None]] = [
    ("aten.index.Tensor", (T(10, 20, 30), [T(4, dtype=i64), None, T(4, dtype=i64)]), {},
     0, 2 * 4 * IB + 4 * 20 * FB, None),
    ("aten.index.Tensor", (T(10, 20, 30), [T(4, 1, dtype=i64), T(1, 5, dtype=i64)]), {},
     0, (4 + 5) * IB + 4 * 5 * 30 * FB, None),
    ("aten._unsafe_index.Tensor", (T(2, 3, 4, 4), [None, None, T(8, 1, dtype=i64),
                                                   T(8, dtype=i64)]), {},
     0, (8 + 8) * IB + 2 * 3 * 8 * 8 * FB, None),
    ("aten.index_select.default", (T(10, 20), 0, T(3, dtype=i64)), {}, 0, 3 * IB + 3 * 20 * FB,
     None),
    ("aten.index_select.default", (T(10, 20), -1, T(3, dtype=i64)), {}, 0,
     3 * IB + 10 * 3 * FB, None),
    ("aten.gather.default", (T(4, 8), -1, T(4, 2, dtype=i64)), {}, 0, 8 * IB + 8 * FB, None),
    ("aten.take.default", (T(4, 8), T(3, dtype=i64)), {}, 0, 3 * IB + 3 * FB, None),
    ("aten.take_along_dim.default", (T(4, 8), T(4, 1, dtype=i64), 1), {}, 0,
     4 * IB + 4 * FB, None),
    # embedding bags: 12 indices into a 50×8 table, 3 bags
    ("aten._embedding_bag.default", (T(50, 8), T(12, dtype=i64), T(3, dtype=i64)), {},
     12 * 8, (12 + 3) * IB + 12 * 8 * FB, None),
    ("aten._embedding_bag.default",
     (T(50, 8), T(12, dtype=i64), T(3, dtype=i64), False, 1), {},  # mode mean
     12 * 8 + 3 * 8, (12 + 3) * IB + 12 * 8 * FB, None),
    ("aten.embedding_bag.padding_idx",
     (T(50, 8), T(12, dtype=i64), T(3, dtype=i64), False, 0, False, T(12), False, None), {},
     2 * 12 * 8, (12 + 3) * IB + 12 * FB + 12 * 8 * FB, None),
    # scatter-add of each gradient element into the zero-filled table (the default write)
    ("aten.embedding_dense_backward.default", (T(2, 4, 8), T(2, 4, dtype=i64), 50, -1, False),
     {}, 64, 64 * FB + 8 * IB, None),
    ("aten.embedding_dense_backward.default", (T(2, 4, 8), T(2, 4, dtype=i64), 50, -1, True),
     {}, 2 * 64, 64 * FB + 8 * IB, None),
    ("aten._embedding_bag_dense_backward.default",
     (T(3, 8), T(12, dtype=i64), T(12, dtype=i64), T(3, dtype=i64), T(3, 8, dtype=i64), 50,
      False, 0, None), {}, 12 * 8, None, None),
    ("aten._embedding_bag_per_sample_weights_backward.default",
     (T(3, 8), T(50, 8), T(12, dtype=i64), T(3, dtype=i64), T(12, dtype=i64), 0), {},
     2 * 12 * 8, 3 * 8 * FB + (12 + 3 + 12) * IB + 12 * 8 * FB, None),
]

SELF = 4 * 8 * FB  # a (4, 8) float32 destination, copied whole by out-of-place scatters
BIG = 10 * 8 * FB  # a (10, 8) one

SCATTERS: list[tuple[str, tuple[Any, ...], dict[str, Any], int, int | None, int | None]] = [
    # k = numel(index) = 8 elements of a (4, 8) tensor
    ("aten.scatter.src", (T(4, 8), 1, T(4, 2, dtype=i64), T(4, 8)), {},
     0, 8 * IB + 8 * FB + SELF, 8 * FB + SELF),
    ("aten.scatter_.src", (T(4, 8), 1, T(4, 2, dtype=i64), T(4, 8)), {},
     0, 8 * IB + 8 * FB, 8 * FB),
    ("aten.scatter.value", (T(4, 8), 1, T(4, 2, dtype=i64), 1.0), {},
     0, 8 * IB + SELF, 8 * FB + SELF),
    ("aten.scatter_.value", (T(4, 8), 1, T(4, 2, dtype=i64), 1.0), {}, 0, 8 * IB, 8 * FB),
    ("aten.scatter.reduce", (T(4, 8), 1, T(4, 2, dtype=i64), T(4, 8)), {"reduce": "add"},
     8, 8 * IB + 8 * FB + 8 * FB + SELF, 8 * FB + SELF),
    ("aten.scatter_add.default", (T(4, 8), 0, T(2, 8, dtype=i64), T(2, 8)), {},
     16, 16 * IB + 16 * FB + 16 * FB + SELF, 16 * FB + SELF),
    ("aten.scatter_add_.default", (T(4, 8), 0, T(2, 8, dtype=i64), T(2, 8)), {},
     16, 16 * IB + 16 * FB + 16 * FB, 16 * FB),
    ("aten.scatter_reduce.two", (T(4, 8), 0, T(2, 8, dtype=i64), T(2, 8), "amax"), {},
     16, 16 * IB + 16 * FB + 16 * FB + SELF, 16 * FB + SELF),
    ("aten.scatter_reduce.two", (T(4, 8), 0, T(2, 8, dtype=i64), T(2, 8), "mean"), {},
     16 + 16 + 32, 16 * IB + 16 * FB + 16 * FB + SELF, 16 * FB + SELF),
    # index_put: k = broadcast(index shapes) × untouched dims
    ("aten.index_put.default", (T(10, 8), [T(3, dtype=i64)], T(3, 8)), {},
     0, 3 * IB + 24 * FB + BIG, 24 * FB + BIG),
    ("aten.index_put.default", (T(10, 8), [T(3, dtype=i64)], T(3, 8), True), {},
     24, 3 * IB + 24 * FB + 24 * FB + BIG, 24 * FB + BIG),
    ("aten.index_put_.default", (T(10, 8), [T(3, dtype=i64)], T(3, 8)), {},
     0, 3 * IB + 24 * FB, 24 * FB),
    ("aten._index_put_impl_.default", (T(10, 8), [T(3, dtype=i64)], T(3, 8), True), {},
     24, 3 * IB + 24 * FB + 24 * FB, 24 * FB),
    ("aten._unsafe_index_put.default", (T(4, 8, 6), [None, T(3, dtype=i64)], T(4, 3, 6)), {},
     0, 3 * IB + 72 * FB + 4 * 8 * 6 * FB, 72 * FB + 4 * 8 * 6 * FB),
    ("aten.index_put_.default",  # a broadcast scalar value: its storage is read once
     (T(10, 8), [T(3, dtype=i64)], TensorSpec((3, 8), f32, (0, 0))), {},
     0, 3 * IB + FB, 24 * FB),
    ("aten.index_put_.default",  # NB: a boolean mask counts as all true (upper bound)
     (T(4, 8), [T(4, 8, dtype="bool")], T(1)), {}, 0, 32 + FB, 32 * FB),
    # index_add / copy / reduce: k = numel(source) = 3 rows of 8
    ("aten.index_add.default", (T(10, 8), 0, T(3, dtype=i64), T(3, 8)), {},
     24, 3 * IB + 24 * FB + 24 * FB + BIG, 24 * FB + BIG),
    ("aten.index_add.default", (T(10, 8), 0, T(3, dtype=i64), T(3, 8)), {"alpha": 2},
     48, 3 * IB + 24 * FB + 24 * FB + BIG, 24 * FB + BIG),
    ("aten.index_add_.default", (T(10, 8), 0, T(3, dtype=i64), T(3, 8)), {},
     24, 3 * IB + 24 * FB + 24 * FB, 24 * FB),
    ("aten.index_copy.default", (T(10, 8), 0, T(3, dtype=i64), T(3, 8)), {},
     0, 3 * IB + 24 * FB + BIG, 24 * FB + BIG),
    ("aten.index_copy_.default", (T(10, 8), 0, T(3, dtype=i64), T(3, 8)), {},
     0, 3 * IB + 24 * FB, 24 * FB),
    ("aten.index_reduce.default", (T(10, 8), 0, T(3, dtype=i64), T(3, 8), "prod"), {},
     24, 3 * IB + 24 * FB + 24 * FB + BIG, 24 * FB + BIG),
    # index_fill: numel(index) slices along dim, each numel(self) / size(dim)
    ("aten.index_fill.int_Scalar", (T(10, 8), -1, T(2, dtype=i64), 0.0), {},
     0, 2 * IB + BIG, 2 * 10 * FB + BIG),
    ("aten.index_fill_.int_Tensor", (T(10, 8), 0, T(2, dtype=i64), T()), {},
     0, 2 * IB + FB, 2 * 8 * FB),
    ("aten._unsafe_masked_index_put_accumulate.default",
     (T(4, 8), T(4, 1, dtype="bool"), [T(4, 1, dtype=i64), None], T(4, 4, 8)), {},
     128, 4 + 4 * IB + 128 * FB + 128 * FB + SELF, 128 * FB + SELF),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "flops", "read", "written"),
                         GATHERS + SCATTERS)
def test_flops_and_bytes(target: str, args: tuple[Any, ...], kwargs: dict[str, Any], flops: int,
                         read: int | None, written: int | None):
    cost = cost_of(target, *args, **kwargs)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (flops, read, written)


def test_gather_bytes_do_not_grow_with_the_source():
    small = cost_of("aten.index_select.default", T(10, 64), 0, T(4, dtype=i64))
    huge = cost_of("aten.index_select.default", T(100_000, 64), 0, T(4, dtype=i64))
    assert small == huge


def test_inplace_scatter_saves_exactly_the_clone():
    args = (T(10, 8), 0, T(3, dtype=i64), T(3, 8))
    functional = cost_of("aten.index_add.default", *args)
    inplace = cost_of("aten.index_add_.default", *args)
    assert functional.flops == inplace.flops
    assert functional.bytes_read - inplace.bytes_read == BIG
    assert functional.bytes_written - inplace.bytes_written == BIG


MASKS: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    ("aten.masked_fill.Scalar", (T(4, 8), T(4, 8, dtype="bool"), 0.0), {}, 32),
    ("aten.masked_fill.Scalar", (T(4, 8), T(8, dtype="bool"), 0.0), {}, 32),
    ("aten.masked_fill_.Tensor", (T(4, 8), T(4, 8, dtype="bool"), T()), {}, 32),
    ("aten.masked_scatter.default", (T(4, 8), T(4, 8, dtype="bool"), T(40)), {}, 32),
    ("aten.masked_scatter_backward.default", (T(4, 8), T(4, 8, dtype="bool"), [40]), {}, 32),
    ("aten.nonzero_static.default", (T(4, 8),), {"size": 5}, 32),
    ("aten._unsafe_masked_index.default",
     (T(4, 8), T(4, 1, dtype="bool"), [T(4, 1, dtype=i64), None], 0.0), {}, 4 * 4 * 8),
    # binary search: ceil(log2(L + 1)) compares per query
    ("aten.searchsorted.Tensor", (T(10), T(4, 8)), {}, 32 * 4),
    ("aten.searchsorted.Tensor", (T(4, 7), T(4, 8)), {"right": True}, 32 * 3),
    ("aten.bucketize.Tensor", (T(4, 8), T(7)), {}, 32 * 3),
    ("aten.bucketize.Tensor", (T(4, 8), T(8)), {}, 32 * 4),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), MASKS)
def test_masks_and_searches(target: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                            expected: int):
    cost = cost_of(target, *args, **kwargs)
    assert cost.flops == expected
    assert cost.bytes_written is None


# ---- ops whose output shape is data-dependent (no meta kernel) ---------------------------


@pytest.mark.parametrize(("target", "kwargs", "expected"), [
    ("aten.nonzero.default", {"self": T(4, 8)}, 32),
    ("aten.argwhere.default", {"self": T(4, 8)}, 32),
    ("aten.where.default", {"condition": T(4, 8, dtype="bool")}, 32),
    ("aten.masked_select.default", {"self": T(1, 8), "mask": T(4, 1, dtype="bool")}, 32),
])
def test_data_dependent_outputs_are_costed_by_the_input(target: str, kwargs: dict,
                                                        expected: int):
    assert cost_of(target, given_outputs=(T(5, 2, dtype=i64),), **kwargs).flops == expected


def test_where_with_three_arguments_is_not_ours():
    keys = load_rules().keys
    assert "indexing.py" in keys["aten.where.default"]
    assert "indexing.py" not in keys.get("aten.where.self", "")
