"""Normalisation rules: closed forms on synthetic calls (FlopCounterMode counts 0 for these).

Per element (fxlens/rules/norm.py): statistics 1 + 3, normalise 2, weight 1, bias 1; per
statistic group 4. RMS: 3 + weight, 3 per group. Eval batch norm: 2 + affine, 2 per channel.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import T, cost_of

STATS, NORMALISE, GROUP = 1 + 3, 2, 4
RUNNING = 7                      # running-stat update per channel
B, S, D = 2, 3, 8                # layer-norm activations (B, S, D)
ln = B * S * D
N, C, H, W = 2, 4, 5, 5          # batch-norm images
bn = N * C * H * W
G = 2                            # group-norm groups (over 2·C channels)
gn = N * 2 * C * H * W

CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    # layer norm: rows = B·S
    ("aten.layer_norm.default", (T(B, S, D), [D], T(D), T(D)), {},
     (STATS + NORMALISE + 2) * ln + GROUP * B * S),
    ("aten.layer_norm.default", (T(B, S, D), [D]), {}, (STATS + NORMALISE) * ln + GROUP * B * S),
    ("aten.layer_norm.default", (T(B, S, D), [D], T(D)), {},
     (STATS + NORMALISE + 1) * ln + GROUP * B * S),
    ("aten.native_layer_norm.default", (T(B, S, D), [S, D], T(S, D), T(S, D), 1e-5), {},
     (STATS + NORMALISE + 2) * ln + GROUP * B),
    # RMS norm: square, sum, scale (+ weight); divide, + eps, rsqrt per row
    ("aten.rms_norm.default", (T(B, S, D), [D], T(D)), {}, 4 * ln + 3 * B * S),
    ("aten.rms_norm.default", (T(B, S, D), [D]), {}, 3 * ln + 3 * B * S),
    ("aten._fused_rms_norm.default", (T(B, S, D), [D], T(D), 1e-6), {}, 4 * ln + 3 * B * S),
    # batch norm: eval uses running stats; training adds statistics and their update
    ("aten.batch_norm.default",
     (T(N, C, H, W), T(C), T(C), T(C), T(C), False, 0.1, 1e-5, False), {},
     (NORMALISE + 2) * bn + 2 * C),
    ("aten.batch_norm.default",
     (T(N, C, H, W), T(C), T(C), T(C), T(C), True, 0.1, 1e-5, False), {},
     (STATS + NORMALISE + 2) * bn + GROUP * C + RUNNING * C),
    ("aten.batch_norm.default",  # BatchNorm1d on (N, C): channels are dim 1
     (T(6, C), None, None, T(C), T(C), True, 0.1, 1e-5, False), {},
     (STATS + NORMALISE) * 6 * C + GROUP * C + RUNNING * C),
    ("aten.native_batch_norm.default",
     (T(N, C, H, W), T(C), T(C), None, None, True, 0.1, 1e-5), {},
     (STATS + NORMALISE + 2) * bn + GROUP * C),
    ("aten._native_batch_norm_legit_no_training.default",
     (T(N, C, H, W), T(C), T(C), T(C), T(C), 0.1, 1e-5), {}, (NORMALISE + 2) * bn + 2 * C),
    ("aten._native_batch_norm_legit.default",
     (T(N, C, H, W), T(C), None, T(C), T(C), True, 0.1, 1e-5), {},
     (STATS + NORMALISE + 1) * bn + GROUP * C + RUNNING * C),
    ("aten._native_batch_norm_legit.no_stats",
     (T(N, C, H, W), None, None, True, 0.1, 1e-5), {}, (STATS + NORMALISE) * bn + GROUP * C),
    ("aten._native_batch_norm_legit_functional.default",
     (T(N, C, H, W), T(C), T(C), T(C), T(C), True, 0.1, 1e-5), {},
     (STATS + NORMALISE + 2) * bn + GROUP * C + RUNNING * C),
    ("aten._batch_norm_with_update.default",
     (T(N, C, H, W), T(C), T(C), T(C), T(C), 0.1, 1e-5), {},
     (STATS + NORMALISE + 2) * bn + GROUP * C + RUNNING * C),
    ("aten._batch_norm_no_update.default",
     (T(N, C, H, W), T(C), T(C), T(C), T(C), 0.1, 1e-5), {}, (NORMALISE + 2) * bn + 2 * C),
    ("aten._batch_norm_impl_index.default",
     (T(N, C, H, W), T(C), T(C), T(C), T(C), False, 0.1, 1e-5, False), {},
     (NORMALISE + 2) * bn + 2 * C),
    ("aten.cudnn_batch_norm.default",
     (T(N, C, H, W), T(C), T(C), T(C), T(C), True, 0.1, 1e-5), {},
     (STATS + NORMALISE + 2) * bn + GROUP * C + RUNNING * C),
    # group / instance norm: N·groups statistic groups
    ("aten.group_norm.default", (T(N, 2 * C, H, W), G, T(2 * C), T(2 * C)), {},
     (STATS + NORMALISE + 2) * gn + GROUP * N * G),
    ("aten.native_group_norm.default",
     (T(N, 2 * C, H, W), T(2 * C), T(2 * C), N, 2 * C, H * W, G, 1e-5), {},
     (STATS + NORMALISE + 2) * gn + GROUP * N * G),
    ("aten.native_group_norm.default",
     (T(N, 2 * C, H, W), None, None, N, 2 * C, H * W, 1, 1e-5), {},
     (STATS + NORMALISE) * gn + GROUP * N),
    ("aten.instance_norm.default",
     (T(N, C, H, W), T(C), T(C), None, None, True, 0.1, 1e-5, False), {},
     (STATS + NORMALISE + 2) * bn + GROUP * N * C),
    ("aten.instance_norm.default",
     (T(N, C, H, W), None, None, T(C), T(C), False, 0.1, 1e-5, False), {},
     NORMALISE * bn + 2 * C),
    # weight norm: ‖v‖ over all but dim, then w = g·v/‖v‖
    ("aten._weight_norm_interface.default", (T(16, 4, 3), T(16, 1, 1), 0), {},
     3 * 192 + 2 * 16),
    ("aten._weight_norm_interface.default", (T(16, 4, 3), T(1, 1, 1), -1), {}, 3 * 192 + 2),
    ("aten._weight_norm.default", (T(16, 4, 3), T(1, 4, 1), 1), {}, 3 * 192 + 2 * 4),
    ("aten._weight_norm_interface_backward.default",
     (T(16, 4, 3), T(16, 4, 3), T(16, 1, 1), T(16, 1, 1), 0), {}, 5 * 192 + 4 * 16),
]

XHAT, DX, DW, DB = 2, 7, 2, 1   # backward: recompute x̂, grad_input (+1 weighted), Σg·x̂, Σg

BACKWARD_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    ("aten.native_layer_norm_backward.default",
     (T(B, S, D), T(B, S, D), [D], T(B, S, 1), T(B, S, 1), T(D), T(D), [True, True, True]), {},
     (DX + 1) * ln + 2 * B * S + XHAT * ln + DW * ln + DB * ln),
    ("aten.native_layer_norm_backward.default",
     (T(B, S, D), T(B, S, D), [D], T(B, S, 1), T(B, S, 1), None, None, [True, False, False]),
     {}, DX * ln + 2 * B * S + XHAT * ln),
    ("aten.native_layer_norm_backward.default",
     (T(B, S, D), T(B, S, D), [D], T(B, S, 1), T(B, S, 1), T(D), T(D), [False, True, True]), {},
     XHAT * ln + DW * ln + DB * ln),
    ("aten.native_layer_norm_backward.default",
     (T(B, S, D), T(B, S, D), [D], T(B, S, 1), T(B, S, 1), T(D), T(D), [False, False, True]),
     {}, DB * ln),
    ("aten.native_batch_norm_backward.default",
     (T(N, C, H, W), T(N, C, H, W), T(C), T(C), T(C), T(C), T(C), True, 1e-5,
      [True, True, True]), {}, (DX + 1) * bn + 2 * C + XHAT * bn + DW * bn + DB * bn),
    ("aten.native_batch_norm_backward.default",  # eval: grad_input = g·(w·rstd)
     (T(N, C, H, W), T(N, C, H, W), T(C), T(C), T(C), T(C), T(C), False, 1e-5,
      [True, False, False]), {}, bn + 2 * C),
    ("aten.batch_norm_backward.default",
     (T(N, C, H, W), T(N, C, H, W), T(C), T(C), T(C), T(C), T(C), True, 1e-5,
      [True, True, True], T(0, dtype="uint8")), {},
     (DX + 1) * bn + 2 * C + XHAT * bn + DW * bn + DB * bn),
    ("aten.cudnn_batch_norm_backward.default",
     (T(N, C, H, W), T(N, C, H, W), T(C), T(C), T(C), T(C), T(C), 1e-5, T(0, dtype="uint8")),
     {}, (DX + 1) * bn + 2 * C + XHAT * bn + DW * bn + DB * bn),
    ("aten.native_group_norm_backward.default",
     (T(N, 2 * C, H, W), T(N, 2 * C, H, W), T(N, G), T(N, G), T(2 * C), N, 2 * C, H * W, G,
      [True, True, True]), {}, (DX + 1) * gn + 2 * N * G + XHAT * gn + DW * gn + DB * gn),
    # RMS: x̂ 1, grad_input 5 (+1 weighted) and a divide per row, grad_weight 2
    ("aten._fused_rms_norm_backward.default",
     (T(B, S, D), T(B, S, D), [D], T(B, S, 1), T(D), [True, True]), {},
     ln + 6 * ln + B * S + 2 * ln),
    ("aten._fused_rms_norm_backward.default",
     (T(B, S, D), T(B, S, D), [D], T(B, S, 1), None, [True, False]), {},
     ln + 5 * ln + B * S),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES + BACKWARD_CASES)
def test_closed_forms(target: str, args: tuple[Any, ...], kwargs: dict[str, Any], expected: int):
    assert cost_of(target, *args, **kwargs).flops == expected


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES[:4])
def test_bytes_left_to_the_default(target: str, args: tuple, kwargs: dict, expected: int):
    cost = cost_of(target, *args, **kwargs)
    assert (cost.bytes_read, cost.bytes_written) == (None, None)


def test_layer_norm_per_element_count_is_six_to_eight():
    x = T(1, 1, 1024)
    bare = cost_of("aten.layer_norm.default", x, [1024]).flops
    affine = cost_of("aten.layer_norm.default", x, [1024], T(1024), T(1024)).flops
    assert (bare - GROUP, affine - GROUP) == (6 * 1024, 8 * 1024)


def test_training_batch_norm_costs_more_than_eval_by_the_statistics():
    args = (T(N, C, H, W), T(C), T(C), T(C), T(C))
    train = cost_of("aten.batch_norm.default", *args, True, 0.1, 1e-5, False).flops
    evaluate = cost_of("aten.batch_norm.default", *args, False, 0.1, 1e-5, False).flops
    assert train - evaluate == STATS * bn + (GROUP - 2) * C + RUNNING * C


def test_native_and_composite_forms_agree():
    x = T(B, S, D)
    assert (cost_of("aten.layer_norm.default", x, [D], T(D), T(D)).flops
            == cost_of("aten.native_layer_norm.default", x, [D], T(D), T(D), 1e-5).flops)
    assert (cost_of("aten.rms_norm.default", x, [D], T(D)).flops
            == cost_of("aten._fused_rms_norm.default", x, [D], T(D), None).flops)
    img = T(N, 2 * C, H, W)
    assert (cost_of("aten.group_norm.default", img, G, T(2 * C), T(2 * C)).flops
            == cost_of("aten.native_group_norm.default", img, T(2 * C), T(2 * C), N, 2 * C,
                       H * W, G, 1e-5).flops)
