"""Reduction, softmax, scan, sort/select and loss rules: closed forms on synthetic calls.

FlopCounterMode counts 0 for all of these, so every expectation is the stated derivation
(see fxlens/rules/reduction.py): n input elements, m outputs, R rows of length L.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fxlens.rules import load_rules
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT as SOFTMAX
from tests.helpers import T, cost_of

B, R, L = 2, 3, 5           # a (B, R, L) activation
n = B * R * L               # its elements
VAR = 1 + 3                 # mean pass + (subtract, square, accumulate)
i64 = "int64"
MEAN, SUM, NONE = 1, 2, 0   # loss reductions

CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    # folds: one op per input element, whatever the dims or keepdim
    ("aten.sum.default", (T(B, R, L),), {}, n),
    ("aten.sum.dim_IntList", (T(B, R, L), [-1]), {}, n),
    ("aten.sum.dim_IntList", (T(B, R, L), [0, 2], True), {}, n),
    ("aten.amax.default", (T(B, R, L), [-1]), {}, n),
    ("aten.amin.default", (T(B, R, L), [1], True), {}, n),
    ("aten.max.dim", (T(B, R, L), -1), {}, n),
    ("aten.min.dim", (T(B, R, L), 0, True), {}, n),
    ("aten.max.default", (T(B, R, L),), {}, n),
    ("aten.min.default", (T(B, R, L),), {}, n),
    ("aten.argmax.default", (T(B, R, L),), {}, n),
    ("aten.argmin.default", (T(B, R, L), -2, True), {}, n),
    ("aten.prod.dim_int", (T(B, R, L), 1), {}, n),
    ("aten.any.dim", (T(B, R, L, dtype="bool"), -1), {}, n),
    ("aten.all.default", (T(B, R, L, dtype="bool"),), {}, n),
    ("aten._is_all_true.default", (T(B, R, L, dtype="bool"),), {}, n),  # torch._check
    ("aten._is_any_true.default", (T(B, R, L, dtype="bool"),), {}, n),
    ("aten.count_nonzero.dim_IntList", (T(B, R, L), [-1, -2]), {}, n),
    ("aten.aminmax.default", (T(B, R, L),), {"dim": -1}, 2 * n),
    ("aten.nansum.default", (T(B, R, L), [-1]), {}, 2 * n),
    # mean: + one divide per output
    ("aten.mean.default", (T(B, R, L),), {}, n + 1),
    ("aten.mean.dim", (T(B, R, L), [-1]), {}, n + B * R),
    ("aten.mean.dim", (T(B, R, L), [-1, -2], True), {}, n + B),
    # var/std: 4 per element; 2 (var) or 3 (std) per output
    ("aten.var.correction", (T(B, R, L), [-1]), {}, VAR * n + 2 * B * R),
    ("aten.var.dim", (T(B, R, L), [1], True, True), {}, VAR * n + 2 * B * L),
    ("aten.var_mean.correction", (T(B, R, L), [-1]), {"keepdim": True}, VAR * n + 2 * B * R),
    ("aten.std.correction", (T(B, R, L), [-1]), {}, VAR * n + 3 * B * R),
    ("aten.std_mean.correction", (T(B, R, L), None), {}, VAR * n + 3),
    # vector norms by order
    ("aten.linalg_vector_norm.default", (T(B, R, L),), {}, 2 * n + 1),
    ("aten.linalg_vector_norm.default", (T(B, R, L), 2, [-1]), {}, 2 * n + B * R),
    ("aten.linalg_vector_norm.default", (T(B, R, L), 1, [-1]), {}, 2 * n),
    ("aten.linalg_vector_norm.default", (T(B, R, L), float("inf"), [-1]), {}, 2 * n),
    ("aten.linalg_vector_norm.default", (T(B, R, L), 3, [-1]), {}, 3 * n + B * R),
    ("aten.norm.ScalarOpt_dim", (T(B, R, L), None, [-1]), {}, 2 * n + B * R),
    ("aten.norm.Scalar", (T(B, R, L), 0), {}, 2 * n),
    ("aten.logsumexp.default", (T(B, R, L), [-1]), {}, 4 * n + 2 * B * R),
    # softmax family
    ("aten.softmax.int", (T(B, R, L), -1), {}, SOFTMAX * n),
    ("aten._softmax.default", (T(B, R, L), 1, False), {}, SOFTMAX * n),
    ("aten._safe_softmax.default", (T(B, R, L), -1), {}, (SOFTMAX + 3) * n),
    ("aten.log_softmax.int", (T(B, R, L), -1), {}, SOFTMAX * n + B * R),
    ("aten._log_softmax.default", (T(B, R, L), 1, False), {}, SOFTMAX * n + B * L),
    ("aten._softmax_backward_data.default", (T(B, R, L), T(B, R, L), -1, torch.float32), {},
     4 * n),
    ("aten._log_softmax_backward_data.default", (T(B, R, L), T(B, R, L), 1, torch.float32), {},
     4 * n),
    # scans
    ("aten.cumsum.default", (T(B, R, L), -1), {}, n),
    ("aten.cumprod.default", (T(B, R, L), 0), {}, n),
    ("aten.cummax.default", (T(B, R, L), 1), {}, n),
    ("aten.cummin.default", (T(B, R, L), -1), {}, n),
    ("aten.logcumsumexp.default", (T(B, R, L), -1), {}, 5 * n),
]

SORT_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    ("aten.sort.default", (T(4, 8),), {}, 4 * (8 * 3)),           # log2 8 = 3
    ("aten.sort.default", (T(4, 8), 0), {}, 8 * (4 * 2)),         # along dim 0: 8 rows of 4
    ("aten.sort.default", (T(4, 8), -2, True), {}, 8 * (4 * 2)),
    ("aten.sort.default", (T(2, 5),), {}, 2 * (5 * 3)),           # ceil(log2 5) = 3
    ("aten.sort.default", (T(4, 1),), {}, 0),                     # rows of one: nothing to do
    ("aten.sort.stable", (T(4, 8),), {"stable": True, "dim": 0}, 8 * (4 * 2)),
    ("aten.argsort.default", (T(4, 8), -1, True), {}, 4 * (8 * 3)),
    ("aten.argsort.stable", (T(4, 8),), {"stable": True}, 4 * (8 * 3)),
    ("aten.msort.default", (T(4, 8),), {}, 8 * (4 * 2)),
    ("aten.topk.default", (T(4, 16), 4), {}, 4 * (16 + 4 * 2)),   # select pass + sort k
    ("aten.topk.default", (T(4, 16), 1, 0), {}, 16 * (4 + 0)),
    ("aten.topk.default", (T(4, 16), 5, -1, True, False), {}, 4 * (16 + 5 * 3)),
    ("aten.kthvalue.default", (T(4, 8), 3), {}, 4 * 8),
    ("aten.kthvalue.default", (T(4, 8), 2, 0, True), {}, 8 * 4),
    ("aten.median.dim", (T(4, 8), 0), {}, 8 * 4),
    ("aten.nanmedian.dim", (T(4, 8), -1, True), {}, 4 * 8),
    ("aten.median.default", (T(4, 8),), {}, 32),
    ("aten.mode.default", (T(4, 8),), {}, 4 * (8 * 3 + 8)),
    ("aten.histc.default", (T(100), 10), {}, (3 + 2) * 100),      # min == max: a range pass
    ("aten.histc.default", (T(100), 10, 0.0, 1.0), {}, 3 * 100),
]

LOSS_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    ("aten.mse_loss.default", (T(4, 8), T(4, 8)), {}, 2 * 32 + 32 + 1),
    ("aten.mse_loss.default", (T(4, 8), T(4, 8), SUM), {}, 2 * 32 + 32),
    ("aten.mse_loss.default", (T(4, 8), T(4, 8), NONE), {}, 2 * 32),
    ("aten.l1_loss.default", (T(4, 8), T(4, 8), SUM), {}, 2 * 32 + 32),
    ("aten.mse_loss_backward.default", (T(), T(4, 8), T(4, 8), MEAN), {}, 3 * 32),
    ("aten.smooth_l1_loss.default", (T(4, 8), T(4, 8)), {}, 5 * 32 + 33),
    ("aten.huber_loss.default", (T(4, 8), T(4, 8), NONE, 0.5), {}, 5 * 32),
    ("aten.smooth_l1_loss_backward.default", (T(), T(4, 8), T(4, 8), MEAN, 1.0), {}, 4 * 32),
    ("aten.huber_loss_backward.default", (T(4, 8), T(4, 8), T(4, 8), NONE, 1.0), {}, 4 * 32),
    ("aten.kl_div.default", (T(4, 8), T(4, 8)), {}, 3 * 32 + 33),
    ("aten.kl_div.default", (T(4, 8), T(4, 8), SUM), {"log_target": True}, 3 * 32 + 32),
    ("aten.binary_cross_entropy.default", (T(4, 8), T(4, 8)), {}, 10 * 32 + 33),
    ("aten.binary_cross_entropy.default", (T(4, 8), T(4, 8), T(4, 8)), {}, 11 * 32 + 33),
    ("aten.binary_cross_entropy_backward.default", (T(), T(4, 8), T(4, 8)), {}, 6 * 32),
    ("aten.binary_cross_entropy_backward.default", (T(), T(4, 8), T(4, 8), T(4, 8)), {},
     7 * 32),
    ("aten.binary_cross_entropy_with_logits.default", (T(4, 8), T(4, 8)), {}, 11 * 32 + 33),
    ("aten.binary_cross_entropy_with_logits.default", (T(4, 8), T(4, 8), None, T(8)), {},
     (11 + 4) * 32 + 33),
    ("aten.binary_cross_entropy_with_logits.default", (T(4, 8), T(4, 8), T(8), T(8), NONE), {},
     (11 + 4 + 1) * 32),
    # nll: per target 1 (+1 weighted); mean adds the total weight per target and a divide
    ("aten.nll_loss_forward.default", (T(6, 10), T(6, dtype=i64), None, MEAN, -100), {},
     6 + (6 + 1)),
    ("aten.nll_loss_forward.default", (T(6, 10), T(6, dtype=i64), None, SUM, -100), {}, 6),
    ("aten.nll_loss_forward.default", (T(6, 10), T(6, dtype=i64), T(10), NONE, -100), {},
     2 * 6),
    ("aten.nll_loss2d_forward.default", (T(2, 10, 4, 4), T(2, 4, 4, dtype=i64), None, MEAN,
                                          -100), {}, 32 + 33),
    ("aten.nll_loss_nd.default", (T(2, 10, 4, 4), T(2, 4, 4, dtype=i64)), {}, 32 + 33),
    ("aten.nll_loss_backward.default",
     (T(), T(6, 10), T(6, dtype=i64), None, MEAN, -100, T()), {}, 6 + 1),
    ("aten.nll_loss2d_backward.default",
     (T(), T(2, 10, 4, 4), T(2, 4, 4, dtype=i64), T(10), SUM, -100, T()), {}, 2 * 32),
    # cross entropy: log_softmax over classes + nll (or -Σ y·log p for probability targets)
    ("aten.cross_entropy_loss.default", (T(6, 10), T(6, dtype=i64)), {},
     SOFTMAX * 60 + 6 + (6 + 7)),
    ("aten.cross_entropy_loss.default", (T(6, 10), T(6, dtype=i64)), {"label_smoothing": 0.1},
     SOFTMAX * 60 + 6 + (6 + 7) + 60),
    ("aten.cross_entropy_loss.default", (T(6, 10), T(6, 10)), {}, SOFTMAX * 60 + 6 + 2 * 60),
    ("aten.cross_entropy_loss.default", (T(2, 10, 4, 4), T(2, 4, 4, dtype=i64)), {},
     SOFTMAX * 320 + 32 + (32 + 33)),
]


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES + SORT_CASES + LOSS_CASES)
def test_closed_forms(target: str, args: tuple[Any, ...], kwargs: dict[str, Any], expected: int):
    assert cost_of(target, *args, **kwargs).flops == expected


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES + SORT_CASES)
def test_bytes_left_to_the_default(target: str, args: tuple, kwargs: dict, expected: int):
    cost = cost_of(target, *args, **kwargs)
    assert (cost.bytes_read, cost.bytes_written) == (None, None)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize(("dims", "outputs"), [([-1], B * R), ([2], B * R), ([0, -1], R),
                                               ([-3, 2], R)])
def test_keepdim_and_negative_dims_do_not_change_a_reduction(
    dims: list[int], outputs: int, keepdim: bool
):
    assert cost_of("aten.mean.dim", T(B, R, L), dims, keepdim).flops == n + outputs
    assert cost_of("aten.var.dim", T(B, R, L), dims, True, keepdim).flops == VAR * n + 2 * outputs


def test_sort_grows_as_n_log_n_and_topk_as_n():
    sort = [cost_of("aten.sort.default", T(1, 2**p)).flops for p in (4, 8)]
    topk = [cost_of("aten.topk.default", T(1, 2**p), 4).flops for p in (4, 8)]
    assert sort[1] / sort[0] == (2**8 * 8) / (2**4 * 4)
    assert topk[1] - topk[0] == 2**8 - 2**4  # the k·log2 k part does not grow with the row


def test_nll_loss_reads_only_the_gathered_log_probabilities():
    """6 targets in a 6×32000 log-prob matrix: 6 values read, not 192000."""
    vocab = 32000
    cost = cost_of("aten.nll_loss_forward.default", T(6, vocab), T(6, dtype=i64), T(vocab),
                   MEAN, -100)
    assert cost.bytes_read == 6 * 8 + 6 * 4 + 6 * 4  # targets + gathered log-probs + weights
    assert cost.bytes_written is None


def test_nll_loss_backward_does_not_read_self():
    cost = cost_of("aten.nll_loss_backward.default", T(), T(6, 10), T(6, dtype=i64), None, MEAN,
                   -100, T())
    assert cost.bytes_read == 4 + 6 * 8 + 4  # grad_output, target, total_weight
    assert cost.bytes_written is None       # the default: the whole zero-filled grad_input


def test_max_other_is_left_to_the_pointwise_family():
    keys = load_rules().keys
    assert "aten.max" not in keys and "aten.min" not in keys
    assert "reduction.py" not in keys.get("aten.max.other", "")


# ---- ops whose output shape is data-dependent (no meta kernel) ---------------------------


@pytest.mark.parametrize(("target", "kwargs", "expected"), [
    ("aten._unique2.default", {"self": T(16)}, 16 * 4 + 16),
    ("aten._unique.default", {"self": T(4, 4)}, 16 * 4 + 16),
    ("aten.unique_dim.default", {"self": T(4, 8), "dim": 0}, 8 * (4 * 2) + 32),
    ("aten.unique_consecutive.default", {"self": T(16)}, 16),
    ("aten.bincount.default", {"self": T(16, dtype=i64)}, 16),
])
def test_data_dependent_ops_are_costed_by_their_input(target: str, kwargs: dict, expected: int):
    outputs = (T(7), T(16, dtype=i64), T(7, dtype=i64))
    assert cost_of(target, given_outputs=outputs, **kwargs).flops == expected
