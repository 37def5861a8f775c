"""Pooling and interpolation rules: closed forms on synthetic calls (fxlens/rules/pooling.py).

Per output element: max pool K compares, avg pool K + 1; interpolation with T taps over d
dims ``2·T - 1 + T·(d - 1)``: nearest 0, linear 3, bilinear 11, trilinear 31, bicubic 47.
"""

from __future__ import annotations

from typing import Any

import pytest

from fxlens.rules.pooling import interpolation_flops
from tests.helpers import T, cost_of

i64 = "int64"
FB, IB = 4, 8  # bytes per float32 / int64 element
N, C = 2, 3
img = N * C * 8 * 8        # a (2, 3, 8, 8) image
half = N * C * 4 * 4       # its 2×2-pooled output
GRID_POINT = 4

CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    ("aten.max_pool2d.default", (T(N, C, 8, 8), [2, 2]), {}, half * 4),
    ("aten.max_pool2d.default", (T(N, C, 8, 8), [3, 3], [2, 2], [1, 1]), {}, half * 9),
    ("aten.max_pool2d.default",  # dilation widens the window, not the work per output
     (T(N, C, 8, 8), [2, 2], [1, 1], [0, 0], [2, 2]), {}, N * C * 6 * 6 * 4),
    ("aten.max_pool2d_with_indices.default", (T(N, C, 8, 8), [2, 2]), {}, half * 4),
    ("aten.max_pool2d_with_indices.default", (T(N, C, 8, 8), 2), {}, half * 4),  # int[2] as 2
    ("aten.max_pool1d.default", (T(N, C, 16), [3]), {}, N * C * 5 * 3),
    ("aten.max_pool1d_with_indices.default", (T(N, C, 16), [4], [2]), {}, N * C * 7 * 4),
    ("aten.max_pool3d_with_indices.default", (T(1, 2, 4, 4, 4), [2, 2, 2]), {}, 1 * 2 * 8 * 8),
    ("aten.fractional_max_pool2d.default", (T(N, C, 8, 8), [2, 2], [4, 4], T(N, C, 2)), {},
     half * 4),
    ("aten.avg_pool2d.default", (T(N, C, 8, 8), [2, 2]), {}, half * (4 + 1)),
    ("aten.avg_pool2d.default", (T(N, C, 8, 8), [2, 2], [2, 2], [0, 0], False, False, 3), {},
     half * (4 + 1)),
    ("aten.avg_pool1d.default", (T(N, C, 16), [4]), {}, N * C * 4 * (4 + 1)),
    ("aten.avg_pool3d.default", (T(1, 2, 4, 4, 4), [2, 2, 2]), {}, 1 * 2 * 8 * (8 + 1)),
    # adaptive: the sum of PyTorch's actual windows, + a divide per output for avg
    ("aten.adaptive_avg_pool2d.default", (T(N, C, 8, 8), [1, 1]), {}, img + N * C),
    ("aten._adaptive_avg_pool2d.default", (T(N, C, 8, 8), [4, 4]), {}, img + half),
    ("aten._adaptive_avg_pool2d.default",  # 7 → 3: windows [0,3) [2,5) [4,7), overlapping
     (T(N, C, 7, 7), [3, 3]), {}, N * C * (3 + 3 + 3) ** 2 + N * C * 9),
    ("aten.adaptive_avg_pool1d.default",  # 5 → 3: windows [0,2) [1,4) [3,5)
     (T(1, 1, 5), [3]), {}, (2 + 3 + 2) + 3),
    ("aten._adaptive_avg_pool3d.default", (T(1, 2, 4, 4, 4), [2, 2, 2]), {}, 128 + 16),
    ("aten.adaptive_max_pool2d.default", (T(N, C, 8, 8), [2, 2]), {}, img),
    ("aten.adaptive_max_pool1d.default", (T(1, 1, 5), [3]), {}, 2 + 3 + 2),
    ("aten.adaptive_max_pool3d.default", (T(1, 2, 4, 4, 4), [1, 1, 1]), {}, 128),
    # interpolation per output element
    ("aten.upsample_nearest2d.default", (T(N, C, 4, 4), [8, 8]), {}, 0),
    ("aten.upsample_nearest2d.vec", (T(N, C, 4, 4), None, [2.0, 2.0]), {}, 0),
    ("aten._upsample_nearest_exact1d.vec", (T(N, C, 4), [8], None), {}, 0),
    ("aten.upsample_nearest3d.default", (T(1, 1, 2, 2, 2), [4, 4, 4]), {}, 0),
    ("aten.upsample_linear1d.default", (T(N, C, 4), [8], False), {}, N * C * 8 * 3),
    ("aten.upsample_bilinear2d.default", (T(N, C, 4, 4), [8, 8], False), {}, img * 11),
    ("aten.upsample_bilinear2d.vec", (T(N, C, 4, 4), None, True, [2.0, 2.0]), {}, img * 11),
    ("aten.upsample_trilinear3d.vec", (T(1, 2, 2, 2, 2), [4, 4, 4], False, None), {},
     128 * 31),
    ("aten.upsample_bicubic2d.default", (T(N, C, 4, 4), [8, 8], False), {}, img * 47),
    # anti-aliased, separable: horizontal pass to (N, C, H_in, W_out), vertical to the output;
    # taps 2·ceil(support) + 1 with support = interp/2 · max(in/out, 1)
    ("aten._upsample_bilinear2d_aa.default", (T(N, C, 8, 8), [4, 4], False), {},  # support 2
     N * C * 8 * 4 * (2 * 5 - 1) + half * (2 * 5 - 1)),
    ("aten._upsample_bilinear2d_aa.vec", (T(N, C, 4, 4), [8, 8], False, None), {},  # support 1
     N * C * 4 * 8 * (2 * 3 - 1) + img * (2 * 3 - 1)),
    ("aten._upsample_bilinear2d_aa.default", (T(1, 1, 4, 8), [4, 4], False), {},  # width only
     1 * 4 * 4 * (2 * 5 - 1)),
    ("aten._upsample_bicubic2d_aa.default", (T(1, 1, 8, 8), [4, 4], False), {},  # support 4
     1 * 8 * 4 * (2 * 9 - 1) + 1 * 4 * 4 * (2 * 9 - 1)),
    # grid sampling: interpolation per output element + unnormalising each grid point
    ("aten.grid_sampler_2d.default", (T(N, C, 8, 8), T(N, 5, 6, 2), 0, 0, False), {},
     N * C * 30 * 11 + GRID_POINT * N * 30),
    ("aten.grid_sampler_2d.default", (T(N, C, 8, 8), T(N, 5, 6, 2), 1, 0, False), {},
     GRID_POINT * N * 30),
    ("aten.grid_sampler_2d.default", (T(N, C, 8, 8), T(N, 5, 6, 2), 2, 1, True), {},
     N * C * 30 * 47 + GRID_POINT * N * 30),
    ("aten.grid_sampler.default", (T(N, C, 8, 8), T(N, 5, 6, 2), 0, 0, False), {},
     N * C * 30 * 11 + GRID_POINT * N * 30),
    ("aten.grid_sampler_3d.default", (T(1, 2, 4, 4, 4), T(1, 2, 3, 3, 3), 0, 0, False), {},
     1 * 2 * 18 * 31 + GRID_POINT * 18),
    # pure data movement
    ("aten.pixel_shuffle.default", (T(1, 8, 4, 4), 2), {}, 0),
    ("aten.pixel_unshuffle.default", (T(1, 2, 8, 8), 2), {}, 0),
    ("aten.channel_shuffle.default", (T(1, 8, 4, 4), 2), {}, 0),
    ("aten.max_unpool2d.default", (T(N, C, 4, 4), T(N, C, 4, 4, dtype=i64), [8, 8]), {}, 0),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES)
def test_closed_forms(target: str, args: tuple[Any, ...], kwargs: dict[str, Any], expected: int):
    assert cost_of(target, *args, **kwargs).flops == expected


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES)
def test_forward_bytes_left_to_the_default(target: str, args: tuple, kwargs: dict,
                                           expected: int):
    cost = cost_of(target, *args, **kwargs)
    assert (cost.bytes_read, cost.bytes_written) == (None, None)


def test_interpolation_counts():
    counts = {(kind, d): interpolation_flops(kind, d) for kind, d in
              [("nearest", 2), ("linear", 1), ("linear", 2), ("linear", 3), ("cubic", 2)]}
    assert counts == {("nearest", 2): 0, ("linear", 1): 3, ("linear", 2): 11, ("linear", 3): 31,
                      ("cubic", 2): 47}


GRAD, X = T(N, C, 4, 4), T(N, C, 8, 8)  # a 2×2 pooling's gradient and input
IDX = T(N, C, 4, 4, dtype=i64)

# (target, args, flops, bytes_read); backward ops read grad_output (and indices), not self
BACKWARD: list[tuple[str, tuple[Any, ...], int, int | None]] = [
    ("aten.max_pool2d_with_indices_backward.default",
     (GRAD, X, [2, 2], [2, 2], [0, 0], [1, 1], False, IDX), half, half * (FB + IB)),
    ("aten.max_pool3d_with_indices_backward.default",
     (T(1, 2, 2, 2, 2), T(1, 2, 4, 4, 4), [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False,
      T(1, 2, 2, 2, 2, dtype=i64)), 16, 16 * (FB + IB)),
    ("aten.fractional_max_pool2d_backward.default", (GRAD, X, [2, 2], [4, 4], IDX),
     half, half * (FB + IB)),
    ("aten.avg_pool2d_backward.default", (GRAD, X, [2, 2], [2, 2], [0, 0], False, True, None),
     half * (4 + 1), half * FB),
    ("aten.avg_pool3d_backward.default",
     (T(1, 2, 2, 2, 2), T(1, 2, 4, 4, 4), [2, 2, 2], [2, 2, 2], [0, 0, 0], False, True, None),
     16 * (8 + 1), 16 * FB),
    ("aten._adaptive_avg_pool2d_backward.default", (GRAD, X), img + half, half * FB),
    ("aten._adaptive_avg_pool3d_backward.default", (T(1, 2, 2, 2, 2), T(1, 2, 4, 4, 4)),
     128 + 16, 16 * FB),
    ("aten.adaptive_max_pool2d_backward.default", (GRAD, X, IDX), half, half * (FB + IB)),
    ("aten.adaptive_max_pool3d_backward.default",
     (T(1, 2, 2, 2, 2), T(1, 2, 4, 4, 4), T(1, 2, 2, 2, 2, dtype=i64)), 16, 16 * (FB + IB)),
    # interpolation backward: nearest one add per gradient element, others forward + 1
    ("aten.upsample_nearest2d_backward.default", (X, [8, 8], [N, C, 4, 4]), img, None),
    ("aten._upsample_nearest_exact2d_backward.default", (X, [8, 8], [N, C, 4, 4]), img, None),
    ("aten.upsample_linear1d_backward.default", (T(N, C, 8), [8], [N, C, 4], False),
     N * C * 8 * 4, None),
    ("aten.upsample_bilinear2d_backward.default", (X, [8, 8], [N, C, 4, 4], False),
     img * 12, None),
    ("aten.upsample_trilinear3d_backward.default",
     (T(1, 2, 4, 4, 4), [4, 4, 4], [1, 2, 2, 2, 2], False), 128 * 32, None),
    ("aten.upsample_bicubic2d_backward.default", (X, [8, 8], [N, C, 4, 4], True),
     img * 48, None),
    ("aten._upsample_bilinear2d_aa_backward.default", (GRAD, [4, 4], [N, C, 8, 8], False),
     N * C * 8 * 4 * 9 + half * 9, None),
    ("aten.grid_sampler_2d_backward.default",
     (T(N, C, 5, 6), X, T(N, 5, 6, 2), 0, 0, False, [True, True]),
     2 * (N * C * 30 * 11 + GRID_POINT * N * 30), None),
    ("aten.grid_sampler_2d_backward.default",
     (T(N, C, 5, 6), X, T(N, 5, 6, 2), 0, 0, False, [False, True]),
     N * C * 30 * 11 + GRID_POINT * N * 30, None),
]


@pytest.mark.parametrize(("target", "args", "flops", "read"), BACKWARD)
def test_backward(target: str, args: tuple[Any, ...], flops: int, read: int | None):
    cost = cost_of(target, *args)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (flops, read, None)


def test_pooling_is_linear_in_batch():
    one = cost_of("aten.avg_pool2d.default", T(1, C, 8, 8), [2, 2]).flops
    four = cost_of("aten.avg_pool2d.default", T(4, C, 8, 8), [2, 2]).flops
    assert four == 4 * one
