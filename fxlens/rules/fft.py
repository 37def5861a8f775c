"""Cost rules for the FFTs (``torch.fft.*``, which reach aten as ``_fft_r2c``, ``_fft_c2r``
and ``_fft_c2c``).

Legend: ``N`` the number of points of one transform (the product of the transformed dims'
lengths, on the complex side for c2c and on the real side for r2c/c2r), ``B`` the number of
independent transforms (every other dim).

Convention (the classic radix-2 Cooley–Tukey count, as FFTW's benchmarks state it): one
complex transform of N points costs ``5·N·log2 N`` real FLOPs — ``N/2·log2 N`` butterflies of
one complex multiply (6) and two complex adds (4). A multi-dimensional transform of
``N = N1·…·Nk`` points costs the same ``5·N·log2 N`` (Σ over dims of ``5·N·log2 Ni``). A
transform with a real input (r2c: ``rfft``, and ``fft`` of a real tensor) or a real output
(c2r: ``irfft``) costs half, ``2.5·N·log2 N``; filling in the redundant half of a two-sided
spectrum (``onesided=False``) is a conjugate copy, not counted. Normalisation
(``normalization`` 1: by 1/√N, 2: by 1/N; 0: none) adds one FLOP per real output value (two
per complex element). FLOPs are rounded to integers.

NB: lengths that are not powers of two use ``log2 N`` all the same; real libraries switch to
mixed-radix or Bluestein algorithms there, costing a small constant factor more.
Bytes: the engine's default (input read once, output written once).
"""

from __future__ import annotations

import math

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.analyzer.core.graph import TensorSpec

aten = torch.ops.aten

COMPLEX_FFT_FLOPS_PER_POINT_LOG2 = 5   # 5·N·log2 N per complex transform of N points
REAL_FFT_FACTOR = 0.5                   # a real input or output halves it


def fft_flops(batch: int, points: int, real: bool) -> int:
    """`batch` transforms of `points` points each (see the module docstring)."""
    if points <= 1:
        return 0
    per_transform = COMPLEX_FFT_FLOPS_PER_POINT_LOG2 * points * math.log2(points)
    return round(batch * per_transform * (REAL_FFT_FACTOR if real else 1.0))


def _split(spec: TensorSpec, dims: list[int], last: int | None = None) -> tuple[int, int]:
    """(B, N): transforms and points per transform of `spec` over `dims`; `last` replaces
    the length of the last transformed dim (c2r's real output length)."""
    lengths = [spec.shape[d % len(spec.shape)] for d in dims]
    if last is not None and lengths:
        lengths[-1] = last
    points = math.prod(lengths)
    others = spec.numel // max(math.prod(spec.shape[d % len(spec.shape)] for d in dims), 1)
    return others, points


def _normalisation(call: OpCall) -> int:
    if not int(call.arg("normalization", 0)):
        return 0
    out = call.out
    return out.numel * (2 if out.dtype.startswith("complex") else 1)


@cost_rule(aten._fft_r2c)
def fft_r2c(call: OpCall) -> Cost:
    """Real → complex (rfft, fft of a real tensor): half a complex transform."""
    batch, points = _split(call.tensor("self"), list(call.arg("dim")))
    return Cost(flops=fft_flops(batch, points, real=True) + _normalisation(call))


@cost_rule(aten._fft_c2r)
def fft_c2r(call: OpCall) -> Cost:
    """Complex → real (irfft): half a complex transform of the real output's length."""
    dims = list(call.arg("dim"))
    batch, points = _split(call.tensor("self"), dims, last=int(call.arg("last_dim_size")))
    return Cost(flops=fft_flops(batch, points, real=True) + _normalisation(call))


@cost_rule(aten._fft_c2c)
def fft_c2c(call: OpCall) -> Cost:
    """Complex → complex (fft, ifft of a complex tensor): a full transform."""
    batch, points = _split(call.tensor("self"), list(call.arg("dim")))
    return Cost(flops=fft_flops(batch, points, real=False) + _normalisation(call))
