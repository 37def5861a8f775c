"""Cost rules for convolutions (1-, 2- and 3-d, grouped, transposed) and their backward.

Legend: ``N, C, *S`` for a batch of images with spatial dims ``S`` (L / H, W / D, H, W);
weight ``(C_out, C_in/groups, *K)``, or ``(C_in, C_out/groups, *K)`` when transposed.

FLOPs, with one multiply-add = ``FLOPS_PER_MAC`` (2):
- convolution: ``2·N·C_out·prod(S_out)·(C_in/groups)·prod(K)`` = ``2·N·prod(S_out)·numel(W)``:
  every output position applies the whole (grouped) weight once;
- transposed: counted on the *input* grid, ``2·N·prod(S_in)·C_in·(C_out/groups)·prod(K)``
  = ``2·N·prod(S_in)·numel(W)`` (each input position scatters through the whole weight);
- the bias add is not counted (an epilogue; conventions.py, as FlopCounterMode);
- padding and dilation are not discounted: taps that read padding count as work, as they do
  in dense kernels.

convolution_backward (as torch.utils.flop_counter): grad_input is a transposed convolution of
grad_output with the weight (a plain one for a transposed forward), grad_weight a convolution
of the input with grad_output; each does exactly the forward's multiply-adds, so each costs
the forward FLOPs when its ``output_mask`` bit is set. grad_bias, a sum of grad_output over all
but the channel dim, costs 1 FLOP per grad_output element.

Known divergence: for ``groups > 1`` FlopCounterMode counts grad_weight ``groups`` times too
much (it treats the input's full channel dim as the batch of that convolution); we do not.
Unbatched inputs (``(C, *S)``) count as N = 1.
"""

from __future__ import annotations

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule, numel
from fxlens.analyzer.core.graph import TensorSpec
from fxlens.rules.conventions import FLOPS_PER_MAC

aten = torch.ops.aten


def conv_flops(x: TensorSpec, w: TensorSpec, out: TensorSpec, transposed: bool) -> int:
    """FLOPs of one convolution: the weight applied once per batch × grid position."""
    spatial = len(w.shape) - 2
    batch = x.shape[0] if len(x.shape) == len(w.shape) else 1
    grid = (x if transposed else out).shape[-spatial:]
    return FLOPS_PER_MAC * batch * numel(grid) * w.numel


def _conv(call: OpCall, transposed: bool) -> Cost:
    return Cost(flops=conv_flops(call.tensor("input"), call.tensor("weight"), call.out, transposed))


@cost_rule(aten.convolution, aten._convolution)
def convolution(call: OpCall) -> Cost:
    """Any convolution; `transposed` says which grid the weight sweeps."""
    return _conv(call, transposed=bool(call.arg("transposed")))


@cost_rule(aten.conv1d, aten.conv2d, aten.conv3d)
def conv(call: OpCall) -> Cost:
    """conv{1,2,3}d, including the ``.padding`` (string padding) overloads."""
    return _conv(call, transposed=False)


@cost_rule(aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d)
def conv_transpose(call: OpCall) -> Cost:
    """conv_transpose{1,2,3}d, counted on the input grid."""
    return _conv(call, transposed=True)


@cost_rule(aten.convolution_backward)
def convolution_backward(call: OpCall) -> Cost:
    """grad_input and grad_weight each redo the forward's MACs; grad_bias sums grad_output."""
    grad_out, x, w = (call.tensor(n) for n in ("grad_output", "input", "weight"))
    forward = conv_flops(x, w, grad_out, bool(call.arg("transposed")))
    mask = call.arg("output_mask")
    return Cost(flops=forward * (bool(mask[0]) + bool(mask[1])) + grad_out.numel * bool(mask[2]))
