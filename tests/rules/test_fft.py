"""FFT rules: 5·N·log2 N real FLOPs per complex transform of N points, half for a real input
or output, plus one FLOP per real output value when normalised (fxlens/rules/fft.py).

FlopCounterMode has no FFT formulas (it counts 0), so the expectations are the derivation.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxlens.rules.fft import fft_flops
from tests.helpers import T, cost_of

B, N, H, W = 3, 16, 8, 4
c64 = "complex64"
NONE, ORTHO, BY_N = 0, 1, 2   # aten's `normalization` enum (none, 1/sqrt(n), 1/n)


def complex_fft(points: int, batch: int = 1) -> float:
    return 5 * points * math.log2(points) * batch


CASES: list[tuple[str, tuple[Any, ...], int]] = [
    # rfft: real input, half a complex transform; onesided or not, same work
    ("aten._fft_r2c.default", (T(B, N), [1], NONE, True), round(complex_fft(N, B) / 2)),
    ("aten._fft_r2c.default", (T(B, N), [1], NONE, False), round(complex_fft(N, B) / 2)),
    # fft of a complex tensor: a full transform; ifft normalises by 1/N (2 FLOPs per element)
    ("aten._fft_c2c.default", (T(B, N, dtype=c64), [1], NONE, True), round(complex_fft(N, B))),
    ("aten._fft_c2c.default", (T(B, N, dtype=c64), [1], BY_N, False),
     round(complex_fft(N, B)) + 2 * B * N),
    # irfft to N real points from N/2 + 1 complex ones: half a transform of N, 1/N scaling
    ("aten._fft_c2r.default", (T(B, N // 2 + 1, dtype=c64), [1], BY_N, N),
     round(complex_fft(N, B) / 2) + B * N),
    # a 2-D rfft over (H, W): N = H·W points per transform, B transforms; ortho scaling
    ("aten._fft_r2c.default", (T(B, H, W), [1, 2], ORTHO, True),
     round(complex_fft(H * W, B) / 2) + 2 * B * H * (W // 2 + 1)),
    # over a leading dim: the other dims are the batch
    ("aten._fft_c2c.default", (T(N, B, dtype=c64), [0], NONE, True), round(complex_fft(N, B))),
    # a length-1 transform is a copy; a non-power-of-two length keeps log2 N
    ("aten._fft_c2c.default", (T(B, 1, dtype=c64), [1], NONE, True), 0),
    ("aten._fft_c2c.default", (T(B, 12, dtype=c64), [1], NONE, True),
     round(complex_fft(12, B))),
]


@pytest.mark.parametrize(("target", "args", "expected"), CASES)
def test_fft_closed_forms(target: str, args: tuple[Any, ...], expected: int) -> None:
    assert cost_of(target, *args).flops == expected


def test_real_transforms_cost_half_a_complex_one() -> None:
    assert fft_flops(4, 1024, real=True) * 2 == fft_flops(4, 1024, real=False)
    assert fft_flops(1, 1024, real=False) == 5 * 1024 * 10


@pytest.mark.parametrize(("fn", "target"), [
    (lambda x: torch.fft.rfft(x), "aten._fft_r2c.default"),
    (lambda x: torch.fft.irfft(x.to(torch.complex64)), "aten._fft_c2r.default"),
    (lambda x: torch.fft.fft(x.to(torch.complex64)), "aten._fft_c2c.default"),
])
def test_torch_fft_reaches_the_ops_we_cost(fn: Any, target: str) -> None:
    """torch.fft.rfft / irfft / fft trace to the three aten ops the rules cover."""
    gm = make_fx(fn, tracing_mode="fake")(torch.randn(B, N))
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert target in targets
