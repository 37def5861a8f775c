"""Cost rules for pooling, interpolation (upsample, grid_sample) and pixel (un)shuffle.

Legend: ``N, C, *S`` batch, channels and the ``d`` spatial dims (L / H, W / D, H, W), read
from the op's name (``max_pool2d`` → d = 2); ``K`` a pooling window's elements; ``T`` the
taps an interpolated output element reads.

FLOPs:
- max pooling: ``numel(out)·K`` compares (K = prod(kernel_size); dilation does not change
  it); avg pooling ``numel(out)·(K + 1)`` (adds and a divide). Adaptive pooling sums its
  actual windows (PyTorch's ``floor(i·In/Out) .. ceil((i+1)·In/Out)`` per dim, so overlap
  is counted), + a divide per output for avg. Global average pooling written as ``mean``
  is reduction.py's.
- pooling backward: max ``numel(grad_output)`` (one scatter-add each); avg the forward's
  count (each gradient divided once and added to its K inputs).
- interpolation, per output element, evaluated directly: ``T = t^d`` taps (nearest 1,
  linear 2 per dim, cubic 4 per dim), ``2·T - 1`` multiply-adds plus ``T·(d - 1)`` products
  of per-dim weights: nearest 0, linear1d 3, bilinear 11, trilinear 31, bicubic 47.
  NB: weights and source indices are per output position and shared across ``N·C``; a
  kernel computes them once, so the weight products are an over-count on a few-channel
  tensor and a small term otherwise — they are counted per element for one simple rule.
- anti-aliased (``_upsample_*_aa``) as PyTorch's separable kernel: a horizontal pass over
  ``(N, C, H_in, W_out)`` then a vertical pass over the output, each ``2·t - 1`` per element
  with ``t = 2·ceil(support) + 1`` taps, ``support = (interp/2)·max(in/out, 1)``
  (interp 2 bilinear, 4 bicubic); a pass whose size does not change is skipped.
- interpolation backward: nearest 1 per grad_output element (an add); others the forward
  count + 1 (each tap gets a multiply and an add). AA backward as its forward.
- grid_sampler: the interpolation count per output element (mode 0 bilinear/trilinear,
  1 nearest, 2 bicubic) + 4 per grid point (unnormalise each coordinate, a multiply-add
  each); backward = the forward count for each requested gradient (input, grid).
- pixel_shuffle, pixel_unshuffle, channel_shuffle, max_unpool: 0 FLOPs (data movement).

Bytes: the default (input read once, output and indices written once), except backward ops
that take ``self`` only for its shape: they read grad_output (and indices), not ``self``.
"""

from __future__ import annotations

import math
import re

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, RuleError, cost_rule, numel
from fxlens.analyzer.core.graph import TensorSpec

aten = torch.ops.aten

TAPS_PER_DIM = {"nearest": 1, "linear": 2, "cubic": 4}
GRID_POINT_FLOPS = 4
GRID_MODES = {0: "linear", 1: "nearest", 2: "cubic"}  # GridSamplerInterpolation


def _spatial_dims(call: OpCall) -> int:
    """d from the op's name: ``aten.max_pool2d_with_indices.default`` → 2."""
    found = re.search(r"(\d)d(?:_|$)", call.node.packet)
    if not found:
        raise RuleError(f"{call.target}: no spatial rank in the op name")
    return int(found.group(1))


def _expand(value: int | list[int] | tuple[int, ...], d: int) -> tuple[int, ...]:
    """An ``int[d]`` schema argument given as an int or a 1-list, broadcast to d dims."""
    values = [value] if isinstance(value, int) else list(value)
    return tuple(values * d if len(values) == 1 else values)


def _window(call: OpCall) -> int:
    return math.prod(_expand(call.arg("kernel_size"), _spatial_dims(call)))


def _grad_only(call: OpCall, *extra: str) -> int:
    """Bytes read by a backward op that needs ``self`` only for its shape."""
    return sum(call.tensor(name).storage_bytes for name in ("grad_output", *extra))


# ---- max / avg pooling -------------------------------------------------------------------


@cost_rule(aten.max_pool1d, aten.max_pool2d, aten.max_pool3d, aten.max_pool1d_with_indices,
           aten.max_pool2d_with_indices, aten.max_pool3d_with_indices,
           aten.fractional_max_pool2d, aten.fractional_max_pool3d)
def max_pool(call: OpCall) -> Cost:
    return Cost(flops=call.out.numel * _window(call))


@cost_rule(aten.max_pool2d_with_indices_backward, aten.max_pool3d_with_indices_backward,
           aten.fractional_max_pool2d_backward, aten.fractional_max_pool3d_backward)
def max_pool_backward(call: OpCall) -> Cost:
    """Each gradient added at its argmax into a zero-filled grad_input."""
    grad = call.tensor("grad_output")
    return Cost(flops=grad.numel, bytes_read=_grad_only(call, "indices"))


@cost_rule(aten.avg_pool1d, aten.avg_pool2d, aten.avg_pool3d)
def avg_pool(call: OpCall) -> Cost:
    return Cost(flops=call.out.numel * (_window(call) + 1))


@cost_rule(aten.avg_pool2d_backward, aten.avg_pool3d_backward)
def avg_pool_backward(call: OpCall) -> Cost:
    grad = call.tensor("grad_output")
    return Cost(flops=grad.numel * (_window(call) + 1), bytes_read=_grad_only(call))


# ---- adaptive pooling --------------------------------------------------------------------


def _adaptive_window_total(x: TensorSpec, out_shape: tuple[int, ...], d: int) -> int:
    """Σ over outputs of their window sizes, exactly as PyTorch places adaptive windows."""
    total = numel(x.shape[:-d])
    for size_in, size_out in zip(x.shape[-d:], out_shape[-d:], strict=True):
        total *= sum(
            math.ceil((i + 1) * size_in / size_out) - (i * size_in) // size_out
            for i in range(size_out)
        )
    return total


@cost_rule(aten.adaptive_avg_pool1d, aten.adaptive_avg_pool2d, aten.adaptive_avg_pool3d,
           aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d)
def adaptive_avg_pool(call: OpCall) -> Cost:
    windows = _adaptive_window_total(call.tensor("self"), call.out.shape, _spatial_dims(call))
    return Cost(flops=windows + call.out.numel)


@cost_rule(aten._adaptive_avg_pool2d_backward, aten._adaptive_avg_pool3d_backward)
def adaptive_avg_pool_backward(call: OpCall) -> Cost:
    grad = call.tensor("grad_output")
    windows = _adaptive_window_total(call.tensor("self"), grad.shape, _spatial_dims(call))
    return Cost(flops=windows + grad.numel, bytes_read=_grad_only(call))


@cost_rule(aten.adaptive_max_pool1d, aten.adaptive_max_pool2d, aten.adaptive_max_pool3d)
def adaptive_max_pool(call: OpCall) -> Cost:
    windows = _adaptive_window_total(call.tensor("self"), call.out.shape, _spatial_dims(call))
    return Cost(flops=windows)


@cost_rule(aten.adaptive_max_pool2d_backward, aten.adaptive_max_pool3d_backward)
def adaptive_max_pool_backward(call: OpCall) -> Cost:
    grad = call.tensor("grad_output")
    return Cost(flops=grad.numel, bytes_read=_grad_only(call, "indices"))


# ---- interpolation -----------------------------------------------------------------------


def interpolation_flops(kind: str, d: int) -> int:
    """FLOPs per output element of direct `kind` interpolation over `d` dims."""
    taps = TAPS_PER_DIM[kind] ** d
    return 0 if taps == 1 else 2 * taps - 1 + taps * (d - 1)


def _kind(call: OpCall) -> str:
    """nearest, cubic or linear, from the op's name (bilinear and trilinear are linear)."""
    return next((k for k in ("nearest", "cubic") if k in call.node.packet), "linear")


UPSAMPLE_NEAREST = (
    aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d,
    aten._upsample_nearest_exact1d, aten._upsample_nearest_exact2d,
    aten._upsample_nearest_exact3d,
)
UPSAMPLE_INTERPOLATING = (
    aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_trilinear3d,
    aten.upsample_bicubic2d,
)


@cost_rule(*UPSAMPLE_NEAREST, *UPSAMPLE_INTERPOLATING)
def upsample(call: OpCall) -> Cost:
    """Any size or scale overload (``.default``/``.vec``): the count times numel(out)."""
    return Cost(flops=call.out.numel * interpolation_flops(_kind(call), _spatial_dims(call)))


@cost_rule(aten.upsample_nearest1d_backward, aten.upsample_nearest2d_backward,
           aten.upsample_nearest3d_backward, aten._upsample_nearest_exact1d_backward,
           aten._upsample_nearest_exact2d_backward, aten._upsample_nearest_exact3d_backward,
           aten.upsample_linear1d_backward, aten.upsample_bilinear2d_backward,
           aten.upsample_trilinear3d_backward, aten.upsample_bicubic2d_backward)
def upsample_backward(call: OpCall) -> Cost:
    """Each gradient element scattered to its taps: forward count + 1."""
    per_element = interpolation_flops(_kind(call), _spatial_dims(call)) + 1
    return Cost(flops=call.tensor("grad_output").numel * per_element)


def _aa_taps(size_in: int, size_out: int, interp: int) -> int:
    support = interp / 2 * max(size_in / size_out, 1.0)
    return 2 * math.ceil(support) + 1


def _aa_flops(in_shape: tuple[int, ...], out_shape: tuple[int, ...], interp: int) -> int:
    """Separable: horizontal pass to (N, C, H_in, W_out), vertical pass to the output."""
    (*lead, h_in, w_in), (h_out, w_out) = in_shape, out_shape[-2:]
    flops = 0
    if w_in != w_out:
        flops += numel(lead) * h_in * w_out * (2 * _aa_taps(w_in, w_out, interp) - 1)
    if h_in != h_out:
        flops += numel(lead) * h_out * w_out * (2 * _aa_taps(h_in, h_out, interp) - 1)
    return flops


def _aa_interp(call: OpCall) -> int:
    return 4 if "bicubic" in call.node.packet else 2


@cost_rule(aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa)
def upsample_aa(call: OpCall) -> Cost:
    x = call.tensor("input" if call.has("input") else "self")
    return Cost(flops=_aa_flops(x.shape, call.out.shape, _aa_interp(call)))


@cost_rule(aten._upsample_bilinear2d_aa_backward, aten._upsample_bicubic2d_aa_backward)
def upsample_aa_backward(call: OpCall) -> Cost:
    in_shape = tuple(call.arg("input_size"))
    return Cost(flops=_aa_flops(in_shape, call.shape("grad_output"), _aa_interp(call)))


def _grid_sample_flops(call: OpCall, out_numel: int) -> int:
    """The grid is (N, *S_out, d): its last dim gives the rank."""
    grid = call.tensor("grid")
    d = grid.shape[-1]
    kind = GRID_MODES[call.arg("interpolation_mode")]
    return out_numel * interpolation_flops(kind, d) + GRID_POINT_FLOPS * (grid.numel // d)


@cost_rule(aten.grid_sampler, aten.grid_sampler_2d, aten.grid_sampler_3d)
def grid_sampler(call: OpCall) -> Cost:
    return Cost(flops=_grid_sample_flops(call, call.out.numel))


@cost_rule(aten.grid_sampler_2d_backward, aten.grid_sampler_3d_backward)
def grid_sampler_backward(call: OpCall) -> Cost:
    """Input and grid gradients each cost about a forward."""
    forward = _grid_sample_flops(call, call.tensor("grad_output").numel)
    return Cost(flops=forward * sum(bool(b) for b in call.arg("output_mask")))


# ---- data movement -----------------------------------------------------------------------


@cost_rule(aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle,
           aten.native_channel_shuffle, aten.max_unpool2d, aten.max_unpool3d)
def rearrange(call: OpCall) -> Cost:
    """A permuting copy: no arithmetic, the default bytes."""
    return Cost(flops=0)
