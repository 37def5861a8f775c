"""Cost rules for normalisation layers: layer, RMS, batch, group and instance norm, their
native/functional/backend variants and backward ops, and weight norm.

Legend: ``n`` input elements; ``G`` statistic groups (rows of a layer/RMS norm, channels
``C`` of a batch norm, ``N·groups`` of a group norm, ``N·C`` of an instance norm).

FLOPs per element (the statistics are counted as reduction.py counts ``var_mean``):
- statistics: mean ``MEAN_FLOPS_PER_ELEMENT`` (1) + variance ``VARIANCE_FLOPS_PER_ELEMENT``
  (3: subtract, square, accumulate), and per group 4 (two divides, + eps, rsqrt);
- normalise 2 (``(x - mean)·rstd``); affine 1 for the weight and 1 for the bias, each only
  when present. Layer/group/instance norm and training batch norm: 6 to 8.
- RMS norm: square 1, sum 1, scale 1, weight 1 (when present); per group 3 (divide, + eps,
  rsqrt). 3 to 4.
- batch norm in eval: normalise 2 + affine (2–4), per channel 2 for ``rsqrt(var + eps)``.
  Training adds the statistics, and when running stats are given their update: 7 per
  channel (two lerps of 3, the unbiased correction).
- backward (``output_mask`` picks the gradients): grad_input of a mean/variance norm is
  ``rstd·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂))`` with ``ĝ = g·w``: x̂ recomputed 2, then 7 (+1 for ĝ
  when weighted) and 2 divides per group; grad_weight ``Σ g·x̂`` 2; grad_bias ``Σ g`` 1.
  Eval batch norm's grad_input is ``g·(w·rstd)``: 1 per element, 2 per channel. RMS:
  x̂ 1, grad_input 5 (+1 weighted) and a divide per group, grad_weight 2.
- weight norm ``w = g·v/‖v‖``: 3 per element (square-accumulate, scale), 2 per slice (sqrt,
  divide); its backward 5 per element, 4 per slice.

Bytes: the engine's default (input, weight, bias and running stats read once; the output and
the saved mean/rstd written once).

NB: the in-place running-stat update of ``native_batch_norm``/``_native_batch_norm_legit``
writes ``2·C`` elements the default does not count (they are not outputs); negligible.
NB: instance norm's running-stat update (the batch average of per-instance statistics) is
not counted; it is ``O(N·C)``.
"""

from __future__ import annotations

import math

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.analyzer.core.graph import TensorSpec
from fxlens.rules.reduction import MEAN_FLOPS_PER_ELEMENT, VARIANCE_FLOPS_PER_ELEMENT

aten = torch.ops.aten

STATS_FLOPS_PER_ELEMENT = MEAN_FLOPS_PER_ELEMENT + VARIANCE_FLOPS_PER_ELEMENT
STATS_FLOPS_PER_GROUP = 4
NORMALISE_FLOPS_PER_ELEMENT = 2
EVAL_RSTD_FLOPS_PER_CHANNEL = 2
RUNNING_STATS_FLOPS_PER_CHANNEL = 7
RMS_FLOPS_PER_ELEMENT = 3
RMS_FLOPS_PER_GROUP = 3
XHAT_FLOPS_PER_ELEMENT = 2
GRAD_INPUT_FLOPS_PER_ELEMENT = 7
GRAD_WEIGHT_FLOPS_PER_ELEMENT = 2
GRAD_BIAS_FLOPS_PER_ELEMENT = 1
RMS_GRAD_INPUT_FLOPS_PER_ELEMENT = 5


def _affine(call: OpCall) -> int:
    return int(call.has("weight")) + int(call.has("bias"))


def _channels(x: TensorSpec) -> int:
    return x.shape[1] if len(x.shape) > 1 else 1


def _standardise(call: OpCall, groups: int) -> Cost:
    """Mean/variance statistics over `groups`, normalise, optional affine."""
    n = call.tensor("input").numel
    per_element = STATS_FLOPS_PER_ELEMENT + NORMALISE_FLOPS_PER_ELEMENT + _affine(call)
    return Cost(flops=per_element * n + STATS_FLOPS_PER_GROUP * groups)


def _rows(call: OpCall) -> int:
    """Layer/RMS norm statistic groups: one per row of the trailing normalized_shape."""
    normalized = math.prod(call.arg("normalized_shape"))
    return call.tensor("input").numel // normalized if normalized else 0


# ---- layer norm and RMS norm -------------------------------------------------------------


@cost_rule(aten.layer_norm, aten.native_layer_norm)
def layer_norm(call: OpCall) -> Cost:
    return _standardise(call, _rows(call))


@cost_rule(aten.rms_norm, aten._fused_rms_norm)
def rms_norm(call: OpCall) -> Cost:
    n = call.tensor("input").numel
    per_element = RMS_FLOPS_PER_ELEMENT + int(call.has("weight"))
    return Cost(flops=per_element * n + RMS_FLOPS_PER_GROUP * _rows(call))


# ---- batch, group and instance norm ------------------------------------------------------


def _batch_norm(call: OpCall, training: bool) -> Cost:
    x = call.tensor("input")
    channels = _channels(x)
    if training:
        cost = _standardise(call, channels)
        update = RUNNING_STATS_FLOPS_PER_CHANNEL * channels if call.has("running_mean") else 0
        return Cost(flops=cost.flops + update)
    per_element = NORMALISE_FLOPS_PER_ELEMENT + _affine(call)
    return Cost(flops=per_element * x.numel + EVAL_RSTD_FLOPS_PER_CHANNEL * channels)


@cost_rule(aten.batch_norm, aten.native_batch_norm, aten._native_batch_norm_legit,
           aten._native_batch_norm_legit_functional, aten._batch_norm_impl_index,
           aten.cudnn_batch_norm, aten.miopen_batch_norm)
def batch_norm(call: OpCall) -> Cost:
    """Statistics of the batch when ``training``, else the running ones."""
    return _batch_norm(call, training=bool(call.arg("training")))


@cost_rule(aten._batch_norm_with_update, aten._batch_norm_with_update_functional)
def batch_norm_with_update(call: OpCall) -> Cost:
    return _batch_norm(call, training=True)


@cost_rule(aten._native_batch_norm_legit_no_training, aten._batch_norm_no_update)
def batch_norm_eval(call: OpCall) -> Cost:
    return _batch_norm(call, training=False)


@cost_rule(aten.group_norm)
def group_norm(call: OpCall) -> Cost:
    x = call.tensor("input")
    return _standardise(call, x.shape[0] * call.arg("num_groups"))


@cost_rule(aten.native_group_norm)
def native_group_norm(call: OpCall) -> Cost:
    return _standardise(call, call.arg("N") * call.arg("group"))


@cost_rule(aten.instance_norm)
def instance_norm(call: OpCall) -> Cost:
    """Per-instance statistics (``use_input_stats``), else an eval batch norm."""
    x = call.tensor("input")
    if call.arg("use_input_stats"):
        return _standardise(call, x.shape[0] * _channels(x))
    return _batch_norm(call, training=False)


# ---- backward ----------------------------------------------------------------------------


def _standardise_backward(
    call: OpCall, groups: int, mask: list[bool], weighted: bool, training: bool = True
) -> Cost:
    """Gradients of a mean/variance norm; `mask` = (input, weight, bias)."""
    n = call.tensor("grad_out" if call.has("grad_out") else "grad_output").numel
    d_input, d_weight, d_bias = (bool(b) for b in mask)
    flops = 0
    if d_input and training:
        per_element = GRAD_INPUT_FLOPS_PER_ELEMENT + int(weighted)
        flops += per_element * n + 2 * groups
    elif d_input:
        flops += n + EVAL_RSTD_FLOPS_PER_CHANNEL * groups
    if d_weight or (d_input and training):
        flops += XHAT_FLOPS_PER_ELEMENT * n
    flops += GRAD_WEIGHT_FLOPS_PER_ELEMENT * n * d_weight + GRAD_BIAS_FLOPS_PER_ELEMENT * n * d_bias
    return Cost(flops=flops)


@cost_rule(aten.native_layer_norm_backward)
def layer_norm_backward(call: OpCall) -> Cost:
    return _standardise_backward(call, _rows(call), call.arg("output_mask"), call.has("weight"))


@cost_rule(aten.native_group_norm_backward)
def group_norm_backward(call: OpCall) -> Cost:
    groups = call.arg("N") * call.arg("group")
    return _standardise_backward(call, groups, call.arg("output_mask"), call.has("weight"))


@cost_rule(aten.native_batch_norm_backward, aten._batch_norm_impl_index_backward)
def batch_norm_backward(call: OpCall) -> Cost:
    channels = _channels(call.tensor("input"))
    return _standardise_backward(
        call, channels, call.arg("output_mask"), call.has("weight"), bool(call.arg("train"))
    )


@cost_rule(aten.batch_norm_backward)
def batch_norm_backward_update(call: OpCall) -> Cost:
    """The ``_batch_norm_with_update`` family's backward; ``update`` means training."""
    channels = _channels(call.tensor("input"))
    return _standardise_backward(
        call, channels, call.arg("output_mask"), call.has("weight"), bool(call.arg("update"))
    )


@cost_rule(aten.cudnn_batch_norm_backward, aten.miopen_batch_norm_backward)
def backend_batch_norm_backward(call: OpCall) -> Cost:
    """Training-mode kernels that always produce all three gradients."""
    channels = _channels(call.tensor("input"))
    return _standardise_backward(call, channels, [True] * 3, weighted=True)


@cost_rule(aten._fused_rms_norm_backward)
def rms_norm_backward(call: OpCall) -> Cost:
    n = call.tensor("grad_out").numel
    d_input, d_weight = (bool(b) for b in call.arg("output_mask"))
    flops = n if (d_input or d_weight) else 0  # x̂ = x·rstd
    if d_input:
        flops += (RMS_GRAD_INPUT_FLOPS_PER_ELEMENT + int(call.has("weight"))) * n + _rows(call)
    if d_weight:
        flops += GRAD_WEIGHT_FLOPS_PER_ELEMENT * n
    return Cost(flops=flops)


# ---- weight norm -------------------------------------------------------------------------


def _weight_norm_slices(v: TensorSpec, dim: int) -> int:
    """Norms are taken over every dim but `dim`; dim -1 means one norm of the whole tensor."""
    return 1 if dim == -1 or not v.shape else v.shape[dim]


@cost_rule(aten._weight_norm, aten._weight_norm_interface)
def weight_norm(call: OpCall) -> Cost:
    v = call.tensor("v")
    return Cost(flops=3 * v.numel + 2 * _weight_norm_slices(v, call.arg("dim", 0)))


@cost_rule(aten._weight_norm_interface_backward)
def weight_norm_backward(call: OpCall) -> Cost:
    v = call.tensor("saved_v")
    return Cost(flops=5 * v.numel + 4 * _weight_norm_slices(v, call.arg("dim")))
