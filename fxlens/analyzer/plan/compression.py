"""Communication compression what-ifs: what a compressed gradient or weight collective moves,
the buffers it adds and the compute it costs.

- ``gradq=int8`` / ``gradq=fp8``: gradient all-reduces and reduce-scatters in 8-bit elements
  with one fp32 scale per block of `SCALE_BLOCK` (the blockwise quantization of ZeRO++ and of
  8-bit communication libraries): ``n·(1 + 4/256)`` bytes for n elements. Buffer: the quantized
  copy of one unit's gradients.
- ``powersgd=r`` (DDP only: PyTorch's ``powerSGD_hook``, Vogels et al. 2019): each gradient
  matrix n × m is all-reduced as its rank-r factors P (n × r) and Q (m × r); vectors (biases,
  norms) go whole. Buffers: the error-feedback copy of the local gradients and P, Q. Compute:
  P = MQ and Q = MᵀP, 4·n·m·r FLOPs, and P's orthogonalisation, 2·n·r², per matrix per step.
- ``zeropp`` (ZeRO-3 only: ZeRO++, Wang et al. 2023): the forward's weight all-gather in int8
  (qwZ), the backward's from a secondary copy of the weights sharded inside the node (hpZ:
  NVLink only, its shard held on every GPU), and gradient reduce-scatters in int4 (qgZ).

A collective that compute already hides gains nothing from compression; the layout then says
so (`fxlens.analyzer.plan.estimate`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

SCALE_BLOCK = 256       # elements per fp32 scale
SCALE_BYTES = 4


@dataclass(frozen=True)
class Matrix:
    """Gradient matrices of one shape in a unit: `count` of `rows` × `cols`."""

    rows: int
    cols: int
    count: int
    kind: str           # "split" (over tp), "whole" or "expert" (over ep·etp)


def gradient_matrices(params: Iterable[tuple[tuple[int, ...], str]]) -> tuple[Matrix, ...]:
    """The gradient matrices of parameters given as (shape, kind): ≥ 2-D ones as rows × the
    rest; a 3-D expert weight as one matrix per expert."""
    counts: dict[tuple[int, int, str], int] = {}
    for shape, kind in params:
        if len(shape) == 3 and kind == "expert":
            key, n = (shape[1], shape[2], kind), shape[0]
        elif len(shape) >= 2:
            key, n = (shape[0], math.prod(shape[1:]), kind), 1
        else:
            continue
        counts[key] = counts.get(key, 0) + n
    return tuple(Matrix(r, c, n, k) for (r, c, k), n in sorted(counts.items()))


def quantized_bytes(nbytes: float, element_bytes: float, bits: int) -> float:
    """`nbytes` of `element_bytes`-wide elements sent as `bits`-bit ones with block scales."""
    return nbytes / element_bytes * (bits / 8 + SCALE_BYTES / SCALE_BLOCK)


def powersgd_bytes(matrices: Iterable[Matrix], grad_bytes: float, element_bytes: float,
                   rank: int) -> float:
    """What a rank-`rank` PowerSGD all-reduce moves for `grad_bytes` of local gradients whose
    matrices (this GPU's share) are `matrices`: P and Q of each matrix too big to gain from
    the factors, the rest (vectors, small matrices) whole."""
    sent = grad_bytes
    for m in matrices:
        factors = rank * (m.rows + m.cols)
        if factors < m.rows * m.cols:
            sent -= m.count * (m.rows * m.cols - factors) * element_bytes
    return sent


def powersgd_flops(matrices: Iterable[Matrix], rank: int) -> float:
    return sum(m.count * (4 * m.rows * m.cols * rank + 2 * m.rows * rank * rank)
               for m in matrices if rank * (m.rows + m.cols) < m.rows * m.cols)


def on_gpu(matrices: Iterable[Matrix], tp: int, experts_split: int) -> list[Matrix]:
    """This GPU's share: split matrices over tp (their rows), expert matrices over ep·etp
    (their count)."""
    out = []
    for m in matrices:
        if m.kind == "split":
            out.append(Matrix(max(1, m.rows // tp), m.cols, m.count, m.kind))
        elif m.kind == "expert":
            out.append(Matrix(m.rows, m.cols, max(1, m.count // experts_split), m.kind))
        else:
            out.append(m)
    return out
