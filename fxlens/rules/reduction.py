"""Cost rules for reductions, softmax, scans, sorting/selection and the whole-op losses.

Legend: ``n`` input elements, ``m`` output elements, ``L`` the length of the reduced, scanned
or sorted dim, ``R = n / L`` the independent rows along it.

FLOPs per input element (every count is a stated convention, not a measurement):
- folds (sum, amax, amin, max/min, argmax, argmin, prod, any, all, count_nonzero, and
  ``_is_all_true``/``_is_any_true``, the whole-tensor checks behind ``torch._check``): 1 (one
  add, compare or multiply); aminmax and nansum 2. NB: folding ``L`` values takes ``L - 1``
  ops; we count ``L``, as the usual teaching material does. ``max.other``/``min.other`` are
  binary pointwise ops and are deliberately not registered here.
- mean: 1, plus one divide per output.
- var / std (and their ``_mean`` twins): ``MEAN_FLOPS_PER_ELEMENT`` (1) for the mean pass plus
  ``VARIANCE_FLOPS_PER_ELEMENT`` (3: subtract the mean, square, accumulate) = 4; per output two
  divides (mean, variance by ``L - correction``), std one square root more. norm.py reuses
  these two constants, so a layer norm's statistics cost what ``var_mean`` costs.
- vector norms by order: 2 → 2 (square-accumulate) + a root per output; 1 and ±inf → 2 (abs,
  add/max); 0 → 2 (compare, add); any other p → 3 (abs, pow, add) + a root per output.
- logsumexp: 4 (max, subtract, exp, sum) + 2 per output (log, add back the max).
- softmax: ``SOFTMAX_FLOPS_PER_ELEMENT`` (5: max, subtract, exp, sum, divide; conventions.py);
  log_softmax the same 5 (the divide becomes a subtract) + one log per row; ``_safe_softmax``
  (the all-masked-row guard of SDPA's math path) 3 more (compare to -inf, row reduce, select).
  Backward: 4 each (softmax: g·y, row sum, subtract, multiply; log_softmax: row sum of g, exp,
  multiply, subtract).
- scans: cumsum, cumprod, cummax, cummin 1; logcumsumexp 5 (the stable logaddexp: subtract,
  exp, log1p, max, add).
- sort / argsort / msort: ``L·ceil(log2 L)`` comparisons per row (a comparison sort), topk
  ``L + k·ceil(log2 k)`` per row (one selection pass, then the k winners sorted), kthvalue and
  median ``L`` per row (quickselect's expected linear pass), mode a sort plus a run count.
  unique: a sort plus one adjacent compare per element (the unsorted CPU hash path is counted
  the same); unique_consecutive only the compares.
- histc 3 (scale to a bin as a multiply-add, increment), 2 more when min == max asks for a
  range pass; bincount 1.
- losses, per element before the reduction (which adds 1 per element, and a divide for mean):
  mse 2 (subtract, square), l1 2, smooth_l1/huber 5 (subtract, abs, compare, the quadratic or
  linear branch), kl_div 3, binary_cross_entropy 10 (two logs, two clamps, two complements,
  two products, add, negate; weight +1), binary_cross_entropy_with_logits 11 (the stable
  ``(1-y)·x + max(-x,0) + log(exp(-max) + exp(-x-max))``; pos_weight +4, weight +1).
  Backward: mse 3, smooth_l1/huber 4, binary_cross_entropy 6 (+1 weight).
  nll_loss is a gather: per target 1 (negate-accumulate), +1 with class weights, and for mean
  one more per target (total weight) and a divide. NB: targets equal to ``ignore_index`` are
  counted too (which ones are is data-dependent). cross_entropy_loss, when it survives
  whole, is a log_softmax over the class dim plus that nll_loss (label smoothing: +1 per
  element; class-probability targets: 2 per element instead of the gather).

Bytes: the engine's default (inputs read once, outputs written once), except for nll_loss,
which reads the targets and only the log-probabilities (and class weights) they gather, and
its backward, which reads grad_output, targets and total_weight but not ``self`` (only its
shape is used) and writes the whole zero-filled gradient (the default write). This is the
gather principle of indexing.py: a 6-token loss over a 32000-word vocabulary reads 6 values.

Known limitations: data-dependent outputs (unique, bincount) are costed by their input.
Packet registrations also cover each op's ``.out`` overloads with the same formulas.
"""

from __future__ import annotations

import math

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.analyzer.core.graph import TensorSpec, dtype_bytes
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT

aten = torch.ops.aten

MEAN_FLOPS_PER_ELEMENT = 1
VARIANCE_FLOPS_PER_ELEMENT = 3
SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT = 4
SAFE_SOFTMAX_GUARD_FLOPS_PER_ELEMENT = 3
LOGCUMSUMEXP_FLOPS_PER_ELEMENT = 5
HISTC_FLOPS_PER_ELEMENT = 3

REDUCTION_NONE, REDUCTION_MEAN, REDUCTION_SUM = 0, 1, 2  # torch's loss ``reduction`` enum


def _reduce(call: OpCall, per_element: int, per_output: int = 0) -> Cost:
    return Cost(flops=per_element * call.tensor("self").numel + per_output * call.out.numel)


def _along(call: OpCall, dim: int | None) -> tuple[int, int]:
    """(rows R, length L) of ``self`` along `dim` (negative allowed; None: the flattened tensor)."""
    x = call.tensor("self")
    if dim is None or not x.shape:
        return 1, x.numel
    length = x.shape[dim % len(x.shape)]
    return (x.numel // length if length else 0), length


def _n_log2_n(n: int) -> int:
    return n * math.ceil(math.log2(n)) if n > 1 else 0


# ---- folds -------------------------------------------------------------------------------

FOLDS = (
    aten.sum, aten.amax, aten.amin, aten.max.default, aten.max.dim, aten.max.dim_max,
    aten.max.unary_out, aten.min.default, aten.min.dim, aten.min.dim_min, aten.min.unary_out,
    aten.argmax, aten.argmin, aten.prod, aten.any, aten.all, aten.count_nonzero,
    aten._is_all_true, aten._is_any_true,
)


@cost_rule(*FOLDS)
def fold(call: OpCall) -> Cost:
    """One add, compare or multiply per input element (max/min ``.other`` are pointwise)."""
    return _reduce(call, 1)


@cost_rule(aten.aminmax, aten.nansum)
def fold_twice(call: OpCall) -> Cost:
    """aminmax: two compares; nansum: a NaN test and an add."""
    return _reduce(call, 2)


@cost_rule(aten.mean, aten.nanmean)
def mean(call: OpCall) -> Cost:
    """Sum, then one divide per output (nanmean's NaN test is not counted)."""
    return _reduce(call, MEAN_FLOPS_PER_ELEMENT, per_output=1)


@cost_rule(aten.var, aten.var_mean)
def var(call: OpCall) -> Cost:
    """Mean pass + subtract, square, accumulate; divides for the mean and the variance."""
    return _reduce(call, MEAN_FLOPS_PER_ELEMENT + VARIANCE_FLOPS_PER_ELEMENT, per_output=2)


@cost_rule(aten.std, aten.std_mean)
def std(call: OpCall) -> Cost:
    """As var, plus a square root per output."""
    return _reduce(call, MEAN_FLOPS_PER_ELEMENT + VARIANCE_FLOPS_PER_ELEMENT, per_output=3)


def _vector_norm(call: OpCall, order: float | None) -> Cost:
    p = 2.0 if order is None else float(order)
    if p == 2:
        return _reduce(call, 2, per_output=1)
    if p in (1, 0, math.inf, -math.inf):
        return _reduce(call, 2)
    return _reduce(call, 3, per_output=1)


@cost_rule(aten.norm)
def norm(call: OpCall) -> Cost:
    """Vector p-norm (``p`` None means 2)."""
    return _vector_norm(call, call.arg("p"))


@cost_rule(aten.linalg_vector_norm)
def linalg_vector_norm(call: OpCall) -> Cost:
    return _vector_norm(call, call.arg("ord"))


@cost_rule(aten.logsumexp)
def logsumexp(call: OpCall) -> Cost:
    """max, subtract, exp, sum per element; log and the max added back per output."""
    return _reduce(call, 4, per_output=2)


# ---- softmax -----------------------------------------------------------------------------


@cost_rule(aten.softmax.int, aten._softmax, aten.special_softmax)
def softmax(call: OpCall) -> Cost:
    return _reduce(call, SOFTMAX_FLOPS_PER_ELEMENT)


@cost_rule(aten._safe_softmax)
def safe_softmax(call: OpCall) -> Cost:
    """Softmax that returns 0 on fully masked rows: the guard costs 3 more per element."""
    return _reduce(call, SOFTMAX_FLOPS_PER_ELEMENT + SAFE_SOFTMAX_GUARD_FLOPS_PER_ELEMENT)


@cost_rule(aten.log_softmax.int, aten._log_softmax, aten.special_log_softmax)
def log_softmax(call: OpCall) -> Cost:
    """5 per element, one log per row."""
    rows, _ = _along(call, call.arg("dim"))
    return Cost(flops=SOFTMAX_FLOPS_PER_ELEMENT * call.tensor("self").numel + rows)


@cost_rule(aten._softmax_backward_data, aten._log_softmax_backward_data)
def softmax_backward(call: OpCall) -> Cost:
    return Cost(flops=SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT * call.tensor("grad_output").numel)


# ---- scans -------------------------------------------------------------------------------


@cost_rule(aten.cumsum, aten.cumprod, aten.cummax, aten.cummin)
def scan(call: OpCall) -> Cost:
    return _reduce(call, 1)


@cost_rule(aten.logcumsumexp, aten._logcumsumexp)
def logcumsumexp(call: OpCall) -> Cost:
    return _reduce(call, LOGCUMSUMEXP_FLOPS_PER_ELEMENT)


# ---- sorting and selection ---------------------------------------------------------------


@cost_rule(aten.sort, aten.argsort)
def sort(call: OpCall) -> Cost:
    """A comparison sort of each row: L·ceil(log2 L) comparisons."""
    rows, length = _along(call, call.arg("dim", -1))
    return Cost(flops=rows * _n_log2_n(length))


@cost_rule(aten.msort)
def msort(call: OpCall) -> Cost:
    """sort along dim 0."""
    rows, length = _along(call, 0)
    return Cost(flops=rows * _n_log2_n(length))


@cost_rule(aten.topk)
def topk(call: OpCall) -> Cost:
    """One selection pass over the row, then the k winners sorted."""
    rows, length = _along(call, call.arg("dim", -1))
    return Cost(flops=rows * (length + _n_log2_n(int(call.arg("k")))))


@cost_rule(aten.kthvalue, aten.median.dim, aten.nanmedian.dim)
def select_along(call: OpCall) -> Cost:
    """Quickselect: an expected linear pass per row."""
    rows, length = _along(call, call.arg("dim", -1))
    return Cost(flops=rows * length)


@cost_rule(aten.median.default, aten.nanmedian.default)
def median_all(call: OpCall) -> Cost:
    return _reduce(call, 1)


@cost_rule(aten.mode)
def mode(call: OpCall) -> Cost:
    """Sort each row, then count runs."""
    rows, length = _along(call, call.arg("dim", -1))
    return Cost(flops=rows * (_n_log2_n(length) + length))


@cost_rule(aten._unique, aten._unique2, aten.unique_dim)
def unique(call: OpCall) -> Cost:
    """Sort (of elements, or of the slices along ``dim`` at slice-width per compare), then
    one adjacent compare per element."""
    rows, length = _along(call, call.arg("dim"))
    return Cost(flops=rows * _n_log2_n(length) + call.tensor("self").numel)


@cost_rule(aten.unique_consecutive, aten.unique_dim_consecutive)
def unique_consecutive(call: OpCall) -> Cost:
    return _reduce(call, 1)


@cost_rule(aten.histc)
def histc(call: OpCall) -> Cost:
    """Bin each element; min == max asks for a min/max pass first."""
    ranged = call.arg("min", 0) == call.arg("max", 0)
    return _reduce(call, HISTC_FLOPS_PER_ELEMENT + (2 if ranged else 0))


@cost_rule(aten.bincount)
def bincount(call: OpCall) -> Cost:
    return _reduce(call, 1)


# ---- losses ------------------------------------------------------------------------------


def _loss(call: OpCall, per_element: int) -> Cost:
    """`per_element` FLOPs, then the reduction: 1 add per element, a divide for mean."""
    n = call.tensor("self").numel
    reduction = call.arg("reduction", REDUCTION_MEAN)
    folded = 0 if reduction == REDUCTION_NONE else n + (reduction == REDUCTION_MEAN)
    return Cost(flops=per_element * n + folded)


def _elementwise_backward(call: OpCall, per_element: int) -> Cost:
    return Cost(flops=per_element * call.tensor("self").numel)


@cost_rule(aten.mse_loss, aten.l1_loss)
def mse_loss(call: OpCall) -> Cost:
    """Subtract, then square (mse) or abs (l1)."""
    return _loss(call, 2)


@cost_rule(aten.mse_loss_backward)
def mse_loss_backward(call: OpCall) -> Cost:
    """2·(x - y)·g (/N): subtract, two multiplies."""
    return _elementwise_backward(call, 3)


@cost_rule(aten.smooth_l1_loss, aten.huber_loss)
def smooth_l1_loss(call: OpCall) -> Cost:
    return _loss(call, 5)


@cost_rule(aten.smooth_l1_loss_backward, aten.huber_loss_backward)
def smooth_l1_loss_backward(call: OpCall) -> Cost:
    return _elementwise_backward(call, 4)


@cost_rule(aten.kl_div)
def kl_div(call: OpCall) -> Cost:
    """y·(log y - x), or exp(y)·(y - x) with log_target: 3 per element."""
    return _loss(call, 3)


@cost_rule(aten.binary_cross_entropy)
def binary_cross_entropy(call: OpCall) -> Cost:
    return _loss(call, 10 + call.has("weight"))


@cost_rule(aten.binary_cross_entropy_backward)
def binary_cross_entropy_backward(call: OpCall) -> Cost:
    """g·(x - y) / max(x·(1 - x), eps)."""
    return _elementwise_backward(call, 6 + call.has("weight"))


@cost_rule(aten.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(call: OpCall) -> Cost:
    return _loss(call, 11 + 4 * call.has("pos_weight") + call.has("weight"))


def _nll_flops(call: OpCall, targets: int) -> int:
    weighted = call.has("weight")
    mean = call.arg("reduction", REDUCTION_MEAN) == REDUCTION_MEAN
    return targets * (1 + weighted) + (targets + 1 if mean else 0)


def _gathered_bytes(spec: TensorSpec, count: int) -> int:
    return int(count * dtype_bytes(spec.dtype))


@cost_rule(aten.nll_loss_forward, aten.nll_loss2d_forward, aten.nll_loss, aten.nll_loss_nd,
           aten.nll_loss2d)
def nll_loss(call: OpCall) -> Cost:
    """A gather of one log-probability (and class weight) per target: only those are read."""
    target = call.tensor("target")
    read = target.storage_bytes + _gathered_bytes(call.tensor("self"), target.numel)
    if call.has("weight"):
        read += _gathered_bytes(call.tensor("weight"), target.numel)
    return Cost(flops=_nll_flops(call, target.numel), bytes_read=read)


@cost_rule(aten.nll_loss_backward, aten.nll_loss2d_backward)
def nll_loss_backward(call: OpCall) -> Cost:
    """A zero-filled gradient with one scattered value per target; ``self`` is only a shape."""
    target = call.tensor("target")
    read = sum(call.tensor(name).storage_bytes for name in ("grad_output", "total_weight"))
    read += target.storage_bytes
    if call.has("weight"):
        read += _gathered_bytes(call.tensor("weight"), target.numel)
    mean = call.arg("reduction", REDUCTION_MEAN) == REDUCTION_MEAN
    flops = target.numel * (1 + call.has("weight")) + mean
    return Cost(flops=flops, bytes_read=read)


@cost_rule(aten.cross_entropy_loss)
def cross_entropy_loss(call: OpCall) -> Cost:
    """log_softmax over the class dim (1, or 0 when unbatched) then nll_loss or, for
    class-probability targets, -Σ y·log p; label smoothing adds the row sum of -log p."""
    x, target = call.tensor("self"), call.tensor("target")
    rows, _ = _along(call, 1 if len(x.shape) > 1 else 0)
    flops = SOFTMAX_FLOPS_PER_ELEMENT * x.numel + rows
    if target.shape == x.shape and target.dtype.startswith(("float", "bfloat")):
        flops += 2 * x.numel
    else:
        flops += _nll_flops(call, target.numel)
    if call.arg("label_smoothing", 0.0) > 0:
        flops += x.numel
    return Cost(flops=flops)
