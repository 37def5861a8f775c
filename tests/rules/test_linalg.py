"""Linear-algebra rules against the scalar operations of the algorithms themselves.

FlopCounterMode has no formulas for these ops (it counts 0). The oracle here runs each textbook
algorithm in plain Python on a small matrix, counting every arithmetic operation (a multiply,
an add or subtract, a division, a square root: one FLOP each), checks that its result equals
torch's, and compares the count with the rule's FLOPs for the same call captured from torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.cost.engine import analyze
from fxlens.rules import load_rules


class Counted:
    """Python floats with every arithmetic operation counted."""

    ops = 0

    def __init__(self, value: float) -> None:
        self.value = value

    def _op(self, value: float) -> Counted:
        Counted.ops += 1
        return Counted(value)

    def __sub__(self, other: Counted) -> Counted:
        return self._op(self.value - other.value)

    def __mul__(self, other: Counted) -> Counted:
        return self._op(self.value * other.value)

    def __truediv__(self, other: Counted) -> Counted:
        return self._op(self.value / other.value)

    def sqrt(self) -> Counted:
        return self._op(math.sqrt(self.value))


Matrix = list[list[Counted]]


def counted(t: torch.Tensor) -> Matrix:
    return [[Counted(float(x)) for x in row] for row in t.tolist()]


def plain(m: Matrix) -> torch.Tensor:
    return torch.tensor([[x.value for x in row] for row in m], dtype=torch.float64)


def forward_substitution(lower: Matrix, b: Matrix, unit: bool) -> Matrix:
    """X with L·X = B, column by column."""
    n, k = len(lower), len(b[0])
    x = [[Counted(0.0)] * k for _ in range(n)]
    for c in range(k):
        for i in range(n):
            s = b[i][c]
            for j in range(i):
                s = s - lower[i][j] * x[j][c]
            x[i][c] = s if unit else s / lower[i][i]
    return x


def lu_in_place(a: Matrix) -> Matrix:
    """Doolittle LU without pivoting (pivoting only swaps rows): L below, U on and above."""
    n = len(a)
    for k in range(n):
        for i in range(k + 1, n):
            a[i][k] = a[i][k] / a[k][k]
            for j in range(k + 1, n):
                a[i][j] = a[i][j] - a[i][k] * a[k][j]
    return a


def cholesky_in_place(a: Matrix) -> Matrix:
    """Right-looking Cholesky: the lower triangle becomes L."""
    n = len(a)
    for k in range(n):
        a[k][k] = a[k][k].sqrt()
        for i in range(k + 1, n):
            a[i][k] = a[i][k] / a[k][k]
        for j in range(k + 1, n):
            for i in range(j, n):
                a[i][j] = a[i][j] - a[i][k] * a[j][k]
    return a


def ops_of(algorithm: Callable[[], Matrix]) -> tuple[int, torch.Tensor]:
    Counted.ops = 0
    result = algorithm()
    return Counted.ops, plain(result)


def our_flops(fn: Callable[..., object], *inputs: torch.Tensor) -> int:
    class Call(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> object:
            return fn(*xs)

    registry = load_rules()
    graph = capture(Call(), inputs, registry, methods=("make_fx",))
    report = analyze(graph, registry, strict=True)
    return sum(n.flops for n in report.nodes)


def well_conditioned(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, n, generator=g, dtype=torch.float64)
    return noise + n * torch.eye(n, dtype=torch.float64)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 7), k=st.integers(1, 4), batch=st.integers(1, 3), unit=st.booleans(),
       left=st.booleans(), seed=st.integers(0, 99))
def test_solve_triangular_counts_the_substitution(n: int, k: int, batch: int, unit: bool,
                                                  left: bool, seed: int) -> None:
    a = well_conditioned(n, seed).tril()
    b = torch.randn(n, k, generator=torch.Generator().manual_seed(seed + 1),
                    dtype=torch.float64)
    ops, x = ops_of(lambda: forward_substitution(counted(a), counted(b), unit))
    expected = torch.linalg.solve_triangular(a, b, upper=False, unitriangular=unit)
    assert torch.allclose(x, expected)
    # X·Aᵀ = Bᵀ (left=False) is the same substitution per row of Bᵀ
    rhs = b if left else b.mT
    flops = our_flops(lambda a, b: torch.linalg.solve_triangular(
        a if left else a.mT, b, upper=not left, left=left, unitriangular=unit),
        a.expand(batch, n, n), rhs.expand(batch, *rhs.shape))
    assert flops == batch * ops


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_lu_cholesky_solve_and_inverse_count_their_algorithms(n: int) -> None:
    a = well_conditioned(n, n)
    spd = a @ a.mT + n * torch.eye(n, dtype=torch.float64)
    b = torch.randn(n, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64)

    lu_ops, lu = ops_of(lambda: lu_in_place(counted(a)))
    lower, upper = lu.tril(-1) + torch.eye(n, dtype=torch.float64), lu.triu()
    assert torch.allclose(lower @ upper, a)
    assert our_flops(lambda m: torch.linalg.lu_factor(m), a) == lu_ops

    chol_ops, chol = ops_of(lambda: cholesky_in_place(counted(spd)))
    assert torch.allclose(chol.tril(), torch.linalg.cholesky(spd))
    assert our_flops(lambda m: torch.linalg.cholesky(m), spd) == chol_ops

    def lu_then_substitutions(rhs: torch.Tensor) -> int:
        ops, _ = ops_of(lambda: lu_in_place(counted(a)))
        y_ops, y = ops_of(lambda: forward_substitution(counted(lower), counted(rhs), True))
        flipped = counted(upper.flip(0, 1))          # U·X = Y is L'·X' = Y' reversed
        x_ops, x = ops_of(lambda: forward_substitution(flipped, counted(y.flip(0)), False))
        assert torch.allclose(x.flip(0), torch.linalg.solve(a, rhs))
        return ops + y_ops + x_ops

    assert our_flops(lambda m, r: torch.linalg.solve(m, r), a, b) == lu_then_substitutions(b)
    identity = torch.eye(n, dtype=torch.float64)
    assert our_flops(lambda m: torch.linalg.inv(m), a) == lu_then_substitutions(identity)


def test_a_vector_right_hand_side_is_one_column() -> None:
    a, b = well_conditioned(6, 1).expand(4, 6, 6), torch.randn(4, 6, dtype=torch.float64)
    assert our_flops(lambda m, v: torch.linalg.solve(m, v), a, b) == \
        our_flops(lambda m, v: torch.linalg.solve(m, v[..., None]), a, b)
