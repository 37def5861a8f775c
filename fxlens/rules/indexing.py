"""Cost rules for gathers, scatters, embeddings, masking and index search.

Principle: bytes follow the elements actually gathered or scattered, never the whole source.
An embedding lookup of 8 tokens in a 32000×4096 table reads 8 rows (and the indices), not
the table. Index tensors are read whole (their storage bytes).

Legend: ``k`` the elements gathered or scattered, ``D`` an embedding row's width.

- Gathers (embedding, index.Tensor, _unsafe_index, index_select, gather, take,
  take_along_dim): 0 FLOPs; read the indices + ``numel(out)`` source elements, write ``out``.
- Scatters (scatter, scatter_add, scatter_reduce, index_put, _unsafe_index_put, index_add,
  index_copy, index_fill, index_reduce, masked index put): read the indices and the ``k``
  source values, write ``k`` elements; accumulating forms read the ``k`` destinations too
  (read-modify-write) and cost 1 FLOP per scattered element (index_add with alpha != 1: 2;
  mean reductions: + 1 count per element and a divide per output).
  Choice: the out-of-place (functional) forms also copy ``self`` whole (read once, written
  once) before scattering, as their eager kernels do; in-place forms (``op_``) do not.
  ``k`` is ``numel(index)`` for scatter*, ``numel(source)`` for index_add/copy/reduce, the
  indexed slices for index_fill, and for index_put the broadcast index shape times the
  untouched dims. NB: a boolean mask in index_put is counted as if all true (an upper
  bound; its true count is data-dependent).
- Embedding bags: 1 FLOP per gathered element (sum/max), +1 with per-sample weights, + a
  divide per output for mean; bytes as a gather of ``numel(indices)`` rows.
- embedding_dense_backward: a scatter-add, 1 FLOP per gradient element (+1 per element to
  scale by frequency); reads the gradient and the indices, writes the whole zero-filled
  gradient table (the default write). NB: the accumulations into touched rows are not
  counted again.
- masked_fill, masked_scatter, masked_select, _unsafe_masked_index: 1 FLOP per element (a
  select), default bytes (masked_scatter reads all of ``source``: an upper bound).
- nonzero, argwhere, where(condition), nonzero_static: 1 per input element (the test); the
  data-dependent output is costed as captured.
- searchsorted, bucketize: ``ceil(log2(L + 1))`` comparisons per query for ``L`` boundaries.

Known limitations: repeated indices are counted at each occurrence (cache reuse of hot rows
is not modelled); sorted index hints (``sorter``, ``unique_indices``) are ignored.
"""

from __future__ import annotations

import math

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule, numel
from fxlens.analyzer.core.graph import TensorSpec, dtype_bytes

aten = torch.ops.aten


def _elements_bytes(spec: TensorSpec, count: int) -> int:
    """Bytes of `count` elements of `spec`'s dtype."""
    return int(count * dtype_bytes(spec.dtype))


def _index_bytes(call: OpCall, *names: str) -> int:
    """Storage bytes of the named index tensors (single tensors or lists, None skipped)."""
    total = 0
    for name in names:
        value = call.arg(name)
        specs = value if isinstance(value, (list, tuple)) else [value]
        total += sum(s.storage_bytes for s in specs if isinstance(s, TensorSpec))
    return total


def _gather(call: OpCall, source: str, *indices: str) -> Cost:
    gathered = _elements_bytes(call.tensor(source), call.out.numel)
    return Cost(flops=0, bytes_read=_index_bytes(call, *indices) + gathered)


def _scatter(call: OpCall, k: int, flops: int, *, source: str | None, indices: tuple[str, ...],
             accumulate: bool, inplace: bool) -> Cost:
    """Scatter `k` elements of `source` into ``self``; see the module docstring."""
    dest = call.tensor("self")
    scattered = _elements_bytes(dest, k)
    read = _index_bytes(call, *indices) + (scattered if accumulate else 0)
    if source is not None:
        src = call.tensor(source)
        read += min(_elements_bytes(src, k), src.storage_bytes)
    written = scattered
    if not inplace:
        read += dest.storage_bytes
        written += call.out.nbytes
    return Cost(flops=flops, bytes_read=read, bytes_written=written)


def _inplace(call: OpCall) -> bool:
    return call.node.packet.endswith("_")


# ---- gathers -----------------------------------------------------------------------------


@cost_rule(aten.embedding)
def embedding(call: OpCall) -> Cost:
    """Only the looked-up rows are read."""
    return _gather(call, "weight", "indices")


@cost_rule(aten.index.Tensor, aten.index.Tensor_hacked_twin, aten._unsafe_index)
def index(call: OpCall) -> Cost:
    return _gather(call, "self", "indices")


@cost_rule(aten.index_select, aten.gather, aten.take)
def index_select(call: OpCall) -> Cost:
    return _gather(call, "self", "index")


@cost_rule(aten.take_along_dim)
def take_along_dim(call: OpCall) -> Cost:
    return _gather(call, "self", "indices")


@cost_rule(aten._unsafe_masked_index)
def unsafe_masked_index(call: OpCall) -> Cost:
    """A gather with a select of ``fill`` where the mask is off."""
    cost = _gather(call, "self", "mask", "indices")
    return Cost(flops=call.out.numel, bytes_read=cost.bytes_read)


# ---- embedding bags and embedding backward -----------------------------------------------


def _bag_flops(call: OpCall, gathered: int) -> int:
    mean = call.arg("mode", 0) == 1
    return gathered * (1 + call.has("per_sample_weights")) + (call.out.numel if mean else 0)


@cost_rule(aten.embedding_bag, aten._embedding_bag, aten._embedding_bag_forward_only)
def embedding_bag(call: OpCall) -> Cost:
    """Gather ``numel(indices)`` rows, fold them per bag."""
    weight = call.tensor("weight")
    gathered = call.tensor("indices").numel * weight.shape[-1]
    read = _index_bytes(call, "indices", "offsets", "per_sample_weights")
    read += _elements_bytes(weight, gathered)
    return Cost(flops=_bag_flops(call, gathered), bytes_read=read)


@cost_rule(aten.embedding_dense_backward, aten.embedding_backward)
def embedding_backward(call: OpCall) -> Cost:
    """Scatter-add each gradient row into the zero-filled table gradient."""
    grad = call.tensor("grad_output" if call.has("grad_output") else "grad")
    per_element = 1 + bool(call.arg("scale_grad_by_freq"))
    return Cost(flops=per_element * grad.numel, bytes_read=_index_bytes(call, "indices") +
                grad.storage_bytes)


@cost_rule(aten._embedding_bag_backward, aten._embedding_bag_dense_backward)
def embedding_bag_backward(call: OpCall) -> Cost:
    """Each index's bag gradient row scatter-added (and weighted) into the table gradient."""
    scattered = call.tensor("indices").numel * call.tensor("grad").shape[-1]
    return Cost(flops=scattered * (1 + call.has("per_sample_weights")))


@cost_rule(aten._embedding_bag_per_sample_weights_backward)
def embedding_bag_per_sample_weights_backward(call: OpCall) -> Cost:
    """A dot product of each index's bag gradient and weight row (only those rows read)."""
    weight = call.tensor("weight")
    gathered = call.tensor("indices").numel * weight.shape[-1]
    read = _index_bytes(call, "grad", "indices", "offsets", "offset2bag")
    return Cost(flops=2 * gathered, bytes_read=read + _elements_bytes(weight, gathered))


# ---- scatters ----------------------------------------------------------------------------


@cost_rule(aten.scatter, aten.scatter_)
def scatter(call: OpCall) -> Cost:
    """Overwrite, or with ``reduce`` ("add"/"multiply") accumulate, at ``numel(index)``."""
    k = call.tensor("index").numel
    reducing = call.has("reduce")
    source = "src" if isinstance(call.arg("src"), TensorSpec) else None
    return _scatter(call, k, k if reducing else 0, source=source, indices=("index",),
                    accumulate=reducing, inplace=_inplace(call))


@cost_rule(aten.scatter_add, aten.scatter_add_)
def scatter_add(call: OpCall) -> Cost:
    k = call.tensor("index").numel
    return _scatter(call, k, k, source="src", indices=("index",), accumulate=True,
                    inplace=_inplace(call))


@cost_rule(aten.scatter_reduce, aten.scatter_reduce_)
def scatter_reduce(call: OpCall) -> Cost:
    """sum/prod/amax/amin 1 per element; mean also counts and divides."""
    k = call.tensor("index").numel
    flops = k + (k + call.out.numel if call.arg("reduce") == "mean" else 0)
    return _scatter(call, k, flops, source="src", indices=("index",), accumulate=True,
                    inplace=_inplace(call))


def _indexed_count(shape: tuple[int, ...], indices: list[TensorSpec | None]) -> int:
    """Elements addressed by advanced indexing of `shape` (boolean masks counted all true)."""
    index_shapes: list[tuple[int, ...]] = []
    untouched, dim = 1, 0
    for idx in indices:
        if idx is None:
            untouched *= shape[dim]
            dim += 1
        elif idx.dtype in ("bool", "uint8"):
            index_shapes.append((idx.numel,))
            dim += max(len(idx.shape), 1)
        else:
            index_shapes.append(idx.shape)
            dim += 1
    broadcast = tuple(torch.broadcast_shapes(*index_shapes)) if index_shapes else ()
    return numel(broadcast) * untouched * numel(shape[dim:])


@cost_rule(aten.index_put, aten.index_put_, aten._index_put_impl_, aten._unsafe_index_put)
def index_put(call: OpCall) -> Cost:
    """``self[indices] = values`` (``+=`` with accumulate)."""
    k = _indexed_count(call.shape("self"), call.arg("indices"))
    accumulate = bool(call.arg("accumulate"))
    return _scatter(call, k, k if accumulate else 0, source="values", indices=("indices",),
                    accumulate=accumulate, inplace=_inplace(call))


@cost_rule(aten._unsafe_masked_index_put_accumulate)
def unsafe_masked_index_put_accumulate(call: OpCall) -> Cost:
    k = call.tensor("values").numel
    return _scatter(call, k, k, source="values", indices=("mask", "indices"), accumulate=True,
                    inplace=False)


@cost_rule(aten.index_add, aten.index_add_)
def index_add(call: OpCall) -> Cost:
    """``self.index_add(dim, index, source, alpha)``: an add (and a scale) per source element."""
    k = call.tensor("source").numel
    flops = k * (1 + (call.arg("alpha", 1) != 1))
    return _scatter(call, k, flops, source="source", indices=("index",), accumulate=True,
                    inplace=_inplace(call))


@cost_rule(aten.index_copy, aten.index_copy_)
def index_copy(call: OpCall) -> Cost:
    k = call.tensor("source").numel
    return _scatter(call, k, 0, source="source", indices=("index",), accumulate=False,
                    inplace=_inplace(call))


@cost_rule(aten.index_reduce, aten.index_reduce_)
def index_reduce(call: OpCall) -> Cost:
    k = call.tensor("source").numel
    flops = k + (k + call.out.numel if call.arg("reduce") == "mean" else 0)
    return _scatter(call, k, flops, source="source", indices=("index",), accumulate=True,
                    inplace=_inplace(call))


@cost_rule(aten.index_fill, aten.index_fill_)
def index_fill(call: OpCall) -> Cost:
    """Fill the ``numel(index)`` slices along ``dim`` with one value."""
    shape = call.shape("self")
    slice_numel = numel(shape) // shape[call.arg("dim") % len(shape)] if shape else 1
    k = call.tensor("index").numel * slice_numel
    return _scatter(call, k, 0, source=None, indices=("index", "value"), accumulate=False,
                    inplace=_inplace(call))


# ---- masks and searches ------------------------------------------------------------------


@cost_rule(aten.masked_fill, aten.masked_fill_, aten.masked_scatter, aten.masked_scatter_)
def masked_fill(call: OpCall) -> Cost:
    """One select per output element."""
    return Cost(flops=call.out.numel)


@cost_rule(aten.masked_select)
def masked_select(call: OpCall) -> Cost:
    """One test per element of the broadcast of ``self`` and ``mask``."""
    shape = torch.broadcast_shapes(call.shape("self"), call.shape("mask"))
    return Cost(flops=numel(shape))


@cost_rule(aten.masked_scatter_backward)
def masked_scatter_backward(call: OpCall) -> Cost:
    return Cost(flops=call.tensor("grad_output").numel)


@cost_rule(aten.nonzero, aten.nonzero_static, aten.argwhere)
def nonzero(call: OpCall) -> Cost:
    return Cost(flops=call.tensor("self").numel)


@cost_rule(aten.where.default)
def where_condition(call: OpCall) -> Cost:
    """``torch.where(condition)``, i.e. nonzero; the 3-argument forms are pointwise."""
    return Cost(flops=call.tensor("condition").numel)


def _binary_search(call: OpCall, boundaries: str) -> Cost:
    length = call.shape(boundaries)[-1] if call.shape(boundaries) else 1
    return Cost(flops=call.out.numel * math.ceil(math.log2(length + 1)))


@cost_rule(aten.searchsorted)
def searchsorted(call: OpCall) -> Cost:
    return _binary_search(call, "sorted_sequence")


@cost_rule(aten.bucketize)
def bucketize(call: OpCall) -> Cost:
    return _binary_search(call, "boundaries")
