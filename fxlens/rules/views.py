"""Ops that cost nothing: views, shape metadata, asserts and symbolic-shape arithmetic.

A view returns a tensor that aliases its input's storage: no FLOPs, no bytes moved; the cost
of touching the data lands on whichever op reads the view (pointwise rules read an expanded
view's *storage* bytes, see `TensorSpec.storage_bytes`). The sets are named once here and
meant to be imported (the memory pass treats `VIEW_OPS` outputs as aliases of their base):

- `VIEW_OPS`: packets whose every overload returns an alias of its input (``Tensor(a)`` in the
  schema; ``_unsafe_view``, ``unsafe_split*``/``unsafe_chunk`` and ``lift`` alias without the
  annotation), in-place metadata changes (``transpose_``, ``unsqueeze_``...) included.
- `METADATA_OPS`: ops that read only sizes/strides or assert on them, and ``item``
  (``_local_scalar_dense``, one element copied to the host; NB: its device sync is not a cost
  we model).
- `SYMBOLIC_OPS`: Python-level targets a capture records for symbolic-shape arithmetic and
  tuple indexing, keyed ``module.name`` of the callable (``_operator.getitem``).

Ops that are a view only sometimes are *not* declared free; a rule decides per call:
``reshape``/``flatten``/``ravel``/``reshape_as`` are free when the input's strides allow a
view, else they are a copy (read the input's storage once, write the output once).
``contiguous``, ``to`` and ``dropout(train=False)`` live with the copies in data_movement.py.
The same decision is registered as an alias check (`fxlens.analyzer.core.costs.alias_rule`) for the
memory pass, with ``_unsafe_view``/``unsafe_split*``/``unsafe_chunk``/``lift``, which share
their input's storage although their schemas carry no alias annotation.

Known limitations: ``resolve_conj``/``resolve_neg`` (copy only when a lazy bit is set) are not
covered; the viewability of a reshape is decided on the meta device from the input's strides.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from fxlens.analyzer.core.aten import meta_tensor
from fxlens.analyzer.core.costs import Cost, OpCall, alias_rule, cost_rule, declare_free
from fxlens.analyzer.core.graph import TensorSpec

VIEW_OPS: frozenset[str] = frozenset(f"aten.{name}" for name in (
    # reshaping views (always views: the output shape is chosen to fit the strides)
    "view", "_unsafe_view", "_reshape_alias", "view_as", "unflatten", "as_strided",
    "expand", "expand_as", "broadcast_to", "unsqueeze", "squeeze",
    # dimension reorders
    "permute", "transpose", "t", "movedim", "moveaxis", "swapaxes", "swapdims", "adjoint",
    "numpy_T", "mT", "mH", "matrix_H",
    # sub-tensors
    "slice", "select", "narrow", "diagonal", "unfold", "split", "split_with_sizes",
    "tensor_split", "hsplit", "vsplit", "dsplit", "chunk", "unbind", "unsafe_split",
    "unsafe_split_with_sizes", "unsafe_chunk",
    # reinterpretations and aliases
    "view_as_real", "view_as_complex", "real", "imag", "conj", "_conj", "_neg_view",
    "positive", "alias", "detach", "lift", "lift_fresh",
    # in-place metadata changes: the same storage under a new shape or stride
    "transpose_", "t_", "squeeze_", "unsqueeze_", "as_strided_", "swapaxes_", "swapdims_",
    "detach_",
))

METADATA_OPS: frozenset[str] = frozenset(f"aten.{name}" for name in (
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "numel",
    "dim", "storage_offset", "is_contiguous", "is_same_size", "is_floating_point",
    "is_complex", "is_nonzero", "_local_scalar_dense", "item",
    "_assert_tensor_metadata", "_assert_async", "_assert_scalar", "_functional_assert_async",
    "_functional_assert_scalar", "_functional_sym_constrain_range",
    "_functional_sym_constrain_range_for_size", "sym_constrain_range",
    "sym_constrain_range_for_size", "_make_dep_token",
)) | {"prim.device", "prim.dtype", "prim.layout"}  # the recorder sees ``x.device``, ``x.dtype``

_SYMBOLIC_CALLABLES: tuple[Callable[..., Any], ...] = (
    operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
    operator.truediv, operator.mod, operator.pow, operator.neg, operator.eq, operator.ne,
    operator.lt, operator.le, operator.gt, operator.ge, operator.and_, operator.or_,
    operator.not_, math.ceil, math.floor, math.trunc, math.sqrt,
    torch.sym_max, torch.sym_min, torch.sym_float, torch.sym_int, torch.sym_not,
    torch.sym_ite, torch.sym_sum, torch.sym_sqrt,
)

SYMBOLIC_OPS: frozenset[str] = frozenset(
    f"{fn.__module__}.{fn.__name__}" for fn in _SYMBOLIC_CALLABLES
)

declare_free(VIEW_OPS, "view: aliases its input's storage")
declare_free(METADATA_OPS, "metadata: reads sizes/strides or asserts on them")
declare_free(SYMBOLIC_OPS, "host-side shape arithmetic or tuple indexing")

aten = torch.ops.aten


def can_view(spec: TensorSpec, shape: tuple[int, ...]) -> bool:
    """Whether a tensor with `spec`'s strides can be reshaped to `shape` without a copy."""
    try:
        meta_tensor(spec).view(shape)
    except RuntimeError:
        return False
    return True


def _view_or_copy(call: OpCall, source: str) -> Cost:
    """Free when the input's strides allow a view; else a copy of `source` into the output."""
    src = call.tensor(source)
    if can_view(src, call.out.shape):
        return Cost(bytes_read=0, bytes_written=0)
    return Cost(bytes_read=src.storage_bytes, bytes_written=call.out.storage_bytes)


@cost_rule(aten.reshape, aten.flatten, aten.ravel, aten.reshape_as)
def reshape(call: OpCall) -> Cost:
    """A view when the strides allow it (no cost), else clone + view: read input, write out."""
    return _view_or_copy(call, "self")


@alias_rule(aten.reshape, aten.flatten, aten.ravel, aten.reshape_as)
def reshape_is_view(call: OpCall) -> bool:
    """The output shares the input's storage exactly when the strides allow a view."""
    return can_view(call.tensor("self"), call.out.shape)


@alias_rule(aten._unsafe_view, aten.unsafe_split, aten.unsafe_split_with_sizes,
            aten.unsafe_chunk, aten.lift)
def unannotated_view(call: OpCall) -> bool:
    """Views whose schemas carry no alias annotation."""
    return True
