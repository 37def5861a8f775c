"""Ops that move or create bytes but do (almost) no arithmetic: casts, copies, concatenation,
padding, repeats, flips, triangular masks, tensor creation, random draws and dropout.

Conventions:
- Casts and copies: 0 FLOPs; read the source's storage bytes once, write the output once. A
  ``to``/``type_as``/``contiguous`` that returns its input unchanged (same dtype, device and
  strides, ``copy=False``; decided from the output spec against the input spec) is free.
  ``_to_copy`` always materialises a new tensor, so it is always a copy.
- Materialised views (``view_copy``, ``slice_copy``, ``expand_copy``...): read at most what
  the output holds and at most the source's storage, ``min(input storage, output bytes)``:
  a ``select_copy`` reads one slice, an ``expand_copy`` reads the small source once.
- Creation (``zeros``, ``full``, ``*_like``, ``new_*``, ``fill``, ``scalar_tensor``...): 0
  FLOPs, nothing read (a ``*_like``/``new_*`` source lends only its metadata), the output
  written. ``empty*`` only allocates: 0 bytes. ``arange``/``linspace`` count 2 FLOPs per
  element (``start + i·step``, one multiply-add); ``logspace`` adds ``base ** t`` (exp and
  mul: S + 1, S from pointwise.py).
- Random draws (``rand*``, ``normal``, ``uniform_``, ``bernoulli``...) are not FLOPs: the
  generator and its transform to the requested distribution (a range, a mean and std, the
  compare against ``p``) are counted as data creation. A tensor of probabilities, means or
  stds is read.
- Dropout in training: the mask is a draw (free) written as one byte per element (``bool``),
  plus 1 FLOP per element: ``mask ? x · 1/(1-p) : 0``, a multiply with the select folded.
  Alpha dropout adds a shift: 2. Not training (or ``p == 0``): the composite ``dropout``
  returns its input (free), ``native_dropout`` returns a copy and an all-true mask. In place
  (``dropout_``..., ``nn.Dropout(inplace=True)``): the same FLOPs and mask, the result
  written over the input; not training, nothing at all.
- Concatenation, padding, repeats, rolls, flips, ``tril``/``triu``, ``complex``,
  ``slice_backward``/``select_backward``/``diagonal_backward`` and the functional writes into
  a view (``slice_scatter``, ``select_scatter``, ``diagonal_scatter``, ``as_strided_scatter``:
  a copy of ``self`` with ``src`` in place): 0 FLOPs, the default bytes (every input read
  once, the output written once). Backward of reflection/replication padding adds each
  padded element's gradient into the element it copied: 1 FLOP per padded element.

Alias checks for the memory pass (`fxlens.analyzer.core.costs.alias_rule`): a no-op
``to``/``type_as``/``contiguous`` and a dropout that is not training hand back their input, so
their output shares its storage; otherwise the output is a fresh tensor.

Known limitations: the one-byte mask of dropout is the CUDA/CPU kernels' ``bool``; a fused
kernel that regenerates the mask from the RNG state in backward writes none. Feature dropout
masks are taken as one element per (N, C) pair.
"""

from __future__ import annotations

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, alias_rule, cost_rule
from fxlens.analyzer.core.graph import TensorSpec
from fxlens.rules.pointwise import SPECIAL_FUNCTION_FLOPS, out_numel, reads_except_out

aten = torch.ops.aten

ARANGE_FLOPS_PER_ELEMENT = 2
LOGSPACE_FLOPS_PER_ELEMENT = ARANGE_FLOPS_PER_ELEMENT + SPECIAL_FUNCTION_FLOPS + 1
DROPOUT_FLOPS_PER_ELEMENT = 1
ALPHA_DROPOUT_FLOPS_PER_ELEMENT = 2
MASK_BYTES_PER_ELEMENT = 1  # bool

FREE = Cost(flops=0, bytes_read=0, bytes_written=0)


def same_layout(a: TensorSpec, b: TensorSpec) -> bool:
    """Same shape, dtype, device and strides (strides of size-1 dims do not matter)."""
    if (a.shape, a.dtype, a.device) != (b.shape, b.dtype, b.device):
        return False
    if not a.stride or not b.stride:
        return a.stride == b.stride
    return all(x == y for n, x, y in zip(a.shape, a.stride, b.stride, strict=True) if n > 1)


def is_noop_cast(call: OpCall) -> bool:
    """A ``to``/``type_as``/``contiguous`` that hands back its input unchanged."""
    return not call.arg("copy", False) and same_layout(call.tensor("self"), call.out)


# ---- casts and copies ---------------------------------------------------------------------

@cost_rule(aten.to, aten.type_as, aten.contiguous)
def cast(call: OpCall) -> Cost:
    """Free when nothing changes; else read self (never ``other``) and write the output."""
    if is_noop_cast(call):
        return FREE
    return Cost(bytes_read=call.tensor("self").storage_bytes)


@alias_rule(aten.to, aten.type_as, aten.contiguous)
def cast_is_alias(call: OpCall) -> bool:
    """Returns its input exactly when it is a no-op."""
    return is_noop_cast(call)


@cost_rule(
    aten._to_copy, aten.clone, aten.lift_fresh_copy,
    aten.cat, aten.stack, aten.hstack, aten.vstack, aten.dstack, aten.column_stack,
    aten.concat, aten.concatenate,
    aten.constant_pad_nd, aten.pad, aten._pad_circular, aten._pad_enum,
    aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d,
    aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d,
    aten.repeat, aten.tile, aten.repeat_interleave, aten.roll, aten.flip, aten.fliplr,
    aten.flipud, aten.rot90, aten.tril, aten.triu, aten.complex,
    aten.slice_backward, aten.select_backward, aten.diagonal_backward,
    aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter, aten.as_strided_scatter,
)
def materialize(call: OpCall) -> Cost:
    """0 FLOPs; every input read once, the output written once."""
    return Cost(bytes_read=reads_except_out(call))


@cost_rule(
    aten.reflection_pad1d_backward, aten.reflection_pad2d_backward,
    aten.reflection_pad3d_backward, aten.replication_pad1d_backward,
    aten.replication_pad2d_backward, aten.replication_pad3d_backward,
)
def pad_backward(call: OpCall) -> Cost:
    """Each padded element's gradient is added into the element it copied: one add each."""
    grad = call.tensor("grad_output")
    return Cost(flops=grad.numel - out_numel(call), bytes_read=reads_except_out(call))


@cost_rule(aten.copy, aten.copy_)
def copy_into(call: OpCall) -> Cost:
    """``self`` only gives the destination's shape and dtype: read ``src``, write the output."""
    src = call.arg("src", call.arg("other"))
    return Cost(bytes_read=src.storage_bytes if isinstance(src, TensorSpec) else 0)


@cost_rule(
    aten.view_copy, aten._reshape_copy, aten.unsqueeze_copy, aten.squeeze_copy,
    aten.t_copy, aten.transpose_copy, aten.permute_copy, aten.expand_copy, aten.slice_copy,
    aten.select_copy, aten.narrow_copy, aten.split_copy, aten.split_with_sizes_copy,
    aten.unbind_copy, aten.as_strided_copy, aten.diagonal_copy, aten.unfold_copy,
    aten.detach_copy, aten.alias_copy, aten.view_as_real_copy, aten.view_as_complex_copy,
)
def view_copy(call: OpCall) -> Cost:
    """A view materialised: read what the output holds, at most the source's storage."""
    return Cost(bytes_read=min(call.default_bytes_read, call.default_bytes_written))


# ---- creation -----------------------------------------------------------------------------

@cost_rule(
    aten.zeros, aten.ones, aten.full, aten.scalar_tensor, aten.eye, aten.tril_indices,
    aten.triu_indices, aten.zeros_like, aten.ones_like, aten.full_like, aten.new_zeros,
    aten.new_ones, aten.new_full, aten.zero, aten.zero_,
    aten.rand, aten.randn, aten.randint, aten.randperm, aten.rand_like, aten.randn_like,
    aten.randint_like, aten.uniform, aten.uniform_, aten.normal_, aten.random_,
    aten.exponential_, aten.cauchy_, aten.log_normal_, aten.geometric_,
)
def create(call: OpCall) -> Cost:
    """Nothing read (sources lend metadata only), the output written."""
    return Cost(bytes_read=0)


@cost_rule(aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
           aten.new_empty_strided, aten.empty_permuted)
def allocate(call: OpCall) -> Cost:
    """Allocation only: no bytes moved."""
    return FREE


@cost_rule(aten.fill, aten.fill_)
def fill(call: OpCall) -> Cost:
    """Write the output; read only a 0-dim ``value`` tensor if one is given."""
    value = call.arg("value")
    return Cost(bytes_read=value.storage_bytes if isinstance(value, TensorSpec) else 0)


@cost_rule(aten.arange, aten.linspace)
def arange(call: OpCall) -> Cost:
    """start + i·step per element: one multiply-add."""
    return Cost(flops=ARANGE_FLOPS_PER_ELEMENT * out_numel(call), bytes_read=0)


@cost_rule(aten.logspace)
def logspace(call: OpCall) -> Cost:
    """base ** (start + i·step): a multiply-add, then exp(t · log base)."""
    return Cost(flops=LOGSPACE_FLOPS_PER_ELEMENT * out_numel(call), bytes_read=0)


@cost_rule(aten.bernoulli, aten.bernoulli_, aten.normal)
def random_from_tensors(call: OpCall) -> Cost:
    """A draw (0 FLOPs) that reads its parameter tensors: ``p``, ``mean``, ``std``, or
    ``self`` when ``bernoulli(self)`` draws with probabilities ``self``."""
    names = ("p", "mean", "std")
    params = [v for v in map(call.arg, names) if isinstance(v, TensorSpec)]
    if call.target.startswith("aten.bernoulli.") and not call.has("p"):
        params.append(call.tensor("self"))
    return Cost(bytes_read=sum(p.storage_bytes for p in params))


# ---- dropout ------------------------------------------------------------------------------

def _training(call: OpCall) -> bool:
    return call.arg("train") is not False and call.arg("p", 0.5) > 0


@cost_rule(aten.native_dropout)
def native_dropout(call: OpCall) -> Cost:
    """Training: the scaled multiply; (output, bool mask) written. Else a copy and a mask."""
    per_element = DROPOUT_FLOPS_PER_ELEMENT if _training(call) else 0
    return Cost(flops=per_element * out_numel(call))


def _dropout(call: OpCall, flops_per_element: int, mask_elements: int) -> Cost:
    if not _training(call):
        return FREE
    x = call.tensor("input")
    return Cost(flops=flops_per_element * x.numel, bytes_read=x.storage_bytes,
                bytes_written=call.out.nbytes + MASK_BYTES_PER_ELEMENT * mask_elements)


def _feature_mask(x: TensorSpec) -> int:
    """One mask element per (N, C) pair (per C for an unbatched input)."""
    return x.shape[0] * x.shape[1] if len(x.shape) > 2 else x.shape[0]


@alias_rule(aten.dropout, aten.feature_dropout, aten.alpha_dropout,
            aten.feature_alpha_dropout)
def dropout_is_alias(call: OpCall) -> bool:
    """Not training (or ``p == 0``), the composite dropouts return their input itself."""
    return not _training(call)


@cost_rule(aten.dropout)
def dropout(call: OpCall) -> Cost:
    """The composite op: the identity when not training."""
    return _dropout(call, DROPOUT_FLOPS_PER_ELEMENT, call.tensor("input").numel)


@cost_rule(aten.feature_dropout)
def feature_dropout(call: OpCall) -> Cost:
    """Whole channels dropped: the mask has one element per channel."""
    x = call.tensor("input")
    return _dropout(call, DROPOUT_FLOPS_PER_ELEMENT, _feature_mask(x))


@cost_rule(aten.alpha_dropout)
def alpha_dropout(call: OpCall) -> Cost:
    """x · mask · a + b: multiply and shift."""
    return _dropout(call, ALPHA_DROPOUT_FLOPS_PER_ELEMENT, call.tensor("input").numel)


@cost_rule(aten.feature_alpha_dropout)
def feature_alpha_dropout(call: OpCall) -> Cost:
    x = call.tensor("input")
    return _dropout(call, ALPHA_DROPOUT_FLOPS_PER_ELEMENT, _feature_mask(x))


_IN_PLACE_DROPOUT = {  # op: (FLOPs per element, one mask element per (N, C) pair)
    "aten.dropout_": (DROPOUT_FLOPS_PER_ELEMENT, False),
    "aten.feature_dropout_": (DROPOUT_FLOPS_PER_ELEMENT, True),
    "aten.alpha_dropout_": (ALPHA_DROPOUT_FLOPS_PER_ELEMENT, False),
    "aten.feature_alpha_dropout_": (ALPHA_DROPOUT_FLOPS_PER_ELEMENT, True),
}


@cost_rule(aten.dropout_, aten.feature_dropout_, aten.alpha_dropout_,
           aten.feature_alpha_dropout_)
def dropout_in_place(call: OpCall) -> Cost:
    """In place (``nn.Dropout(inplace=True)``): free when not training (the input is left as
    it is); training, the out-of-place work with the result written over the input."""
    if not _training(call):
        return FREE
    x = call.tensor("self")
    per_element, per_channel = _IN_PLACE_DROPOUT[call.node.packet]
    mask = _feature_mask(x) if per_channel else x.numel
    return Cost(flops=per_element * x.numel, bytes_read=x.storage_bytes,
                bytes_written=x.nbytes + MASK_BYTES_PER_ELEMENT * mask)
