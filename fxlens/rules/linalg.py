"""Cost rules for dense linear algebra: triangular solves, factorisations, solves and inverses
(``torch.linalg.*``), as the reference paths of linear-attention layers use them (gated
DeltaNet solves each chunk's unit lower-triangular system with ``solve_triangular``).

Legend: ``n`` the order of the square matrix A, ``k`` the right-hand sides (columns of B, or
rows when ``left=False``), ``batch`` the broadcast batch of A and B.

Convention (the scalar operations of the textbook algorithms LAPACK implements, one
multiply-add = 2 FLOPs, every term kept; pivot searches and row swaps are comparisons and
copies, not FLOPs):
- triangular solve (``trsm``), per right-hand side: substitution is n(n−1)/2 multiply-adds
  and n divisions, ``n²``; a unit diagonal (``unitriangular``) skips the divisions:
  ``n·(n−1)``.
- LU (``getrf``): per column k, m = n−k−1 divisions and m² multiply-adds:
  ``n(n−1)/2 + n(n−1)(2n−1)/3`` (leading term 2n³/3).
- Cholesky (``potrf``): per column, a square root, m divisions and m(m+1)/2 multiply-adds:
  ``n² + n(n−1)(2n−1)/6`` (leading term n³/3).
- solve (``gesv``): LU, then per right-hand side a unit-lower and an upper substitution; from
  given LU factors (``lu_solve``) only the substitutions.
- inverse: as torch computes it, a solve against the identity (n right-hand sides):
  ``LU + n·(2n² − n)``, leading term 8n³/3 (LAPACK's ``getri`` needs 2n³ in all).
Bytes: the engine's default (inputs read once, outputs written once). Backwards are recorded
as the ops autograd runs (solves and matmuls again).
"""

from __future__ import annotations

import math

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule, declare_free
from fxlens.analyzer.core.graph import TensorSpec

aten = torch.ops.aten

declare_free(frozenset({"aten._linalg_check_errors"}),
             "checks a factorisation's info codes (raises on a singular matrix)")


def _order_and_batch(a: TensorSpec, out: TensorSpec) -> tuple[int, int]:
    """(n, batch): the order of A and the number of systems (the output's batch dims)."""
    return a.shape[-1], math.prod(out.shape[:-2])


def triangular_solve_flops(n: int, rhs: int, batch: int, unit: bool) -> int:
    """Substitution over `rhs` right-hand sides of an order-`n` triangular system."""
    return batch * rhs * (n * (n - 1) + (0 if unit else n))


def _rhs(out: TensorSpec, left: bool) -> int:
    return out.shape[-1] if left else out.shape[-2]


@cost_rule(aten.linalg_solve_triangular)
def solve_triangular(call: OpCall) -> Cost:
    """X with A·X = B (``left``) or X·A = B: substitution per right-hand side."""
    left = bool(call.arg("left", True))
    n, batch = _order_and_batch(call.tensor("self"), call.out)
    return Cost(flops=triangular_solve_flops(n, _rhs(call.out, left), batch,
                                             bool(call.arg("unitriangular", False))))


@cost_rule(aten.triangular_solve)
def legacy_triangular_solve(call: OpCall) -> Cost:
    """``torch.triangular_solve(B, A)``: the same substitution (A is the second argument)."""
    out = call.outputs[0]
    n, batch = _order_and_batch(call.tensor("A"), out)
    return Cost(flops=triangular_solve_flops(n, out.shape[-1], batch,
                                             bool(call.arg("unitriangular", False))))


def lu_flops(n: int) -> int:
    return n * (n - 1) // 2 + n * (n - 1) * (2 * n - 1) // 3


def cholesky_flops(n: int) -> int:
    return n * n + n * (n - 1) * (2 * n - 1) // 6


@cost_rule(aten.linalg_cholesky_ex)
def cholesky(call: OpCall) -> Cost:
    n, batch = _order_and_batch(call.tensor("self"), call.outputs[0])
    return Cost(flops=batch * cholesky_flops(n))


@cost_rule(aten.linalg_lu_factor_ex)
def lu_factor(call: OpCall) -> Cost:
    n, batch = _order_and_batch(call.tensor("A"), call.outputs[0])
    return Cost(flops=batch * lu_flops(n))


def _lu_solves(n: int, rhs: int, batch: int) -> int:
    """The two substitutions after LU: L (unit diagonal), then U."""
    return (triangular_solve_flops(n, rhs, batch, unit=True)
            + triangular_solve_flops(n, rhs, batch, unit=False))


@cost_rule(aten.linalg_solve_ex, aten._linalg_solve_ex)
def solve(call: OpCall) -> Cost:
    """LU of each A, then the two triangular solves per system (B a vector: one right-hand
    side)."""
    a, out = call.shape("A"), call.outputs[0]
    n, factorised = a[-1], math.prod(a[:-2])
    if len(out.shape) == len(a) - 1:       # B of shape (…, n)
        rhs, systems = 1, math.prod(out.shape[:-1])
    else:
        rhs, systems = _rhs(out, bool(call.arg("left", True))), math.prod(out.shape[:-2])
    return Cost(flops=factorised * lu_flops(n) + _lu_solves(n, rhs, systems))


@cost_rule(aten.linalg_lu_solve)
def lu_solve(call: OpCall) -> Cost:
    out = call.out
    n, batch = _order_and_batch(call.tensor("LU"), out)
    return Cost(flops=_lu_solves(n, _rhs(out, bool(call.arg("left", True))), batch))


@cost_rule(aten.linalg_inv_ex)
def inverse(call: OpCall) -> Cost:
    """As torch computes it: LU, then a solve against the identity's n columns."""
    n, batch = _order_and_batch(call.tensor("A"), call.outputs[0])
    return Cost(flops=batch * lu_flops(n) + _lu_solves(n, n, batch))
