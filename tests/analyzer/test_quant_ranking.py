"""Does fxlens rank the layers the way real quantization damages them? Small models trained
here (several seeds), each weight matrix quantized alone for real, the damage measured on
held-out data (`tests.analyzer.ranking_models`), against fxlens's calibrated and data-free
rankings: Spearman ρ, and the truly worst layer ranked first (or one the held-out rows cannot
tell from it), on models of ≥ 8 layers.

The damage asserted on is the distortion of the model's own held-out predictions (KL to the
full-precision model): at 8 bits a small layer's task-loss change is its first-order term,
of either sign, which no sensitivity score predicts (bench/README.md shows both).
Fast cases run in a few seconds; the GRU, the BatchNorm CNN and the 27-layer LM are slow.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterator

import pytest
import torch

from tests.analyzer import ranking_models as rm

pytest.importorskip("sklearn")
pytest.importorskip("scipy")

FORMATS = ("int8_per_tensor", "int4_g128", "fp8_e4m3")


def _rows(case: rm.Case) -> list[rm.Row]:
    rows = [r for r in rm.ranking_rows(case, FORMATS) if r.metric == "distortion"]
    assert rows and all(r.layers >= 8 for r in rows)
    return rows


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models: one thread is fastest, and the suite shares two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_calibrated_ranking_finds_the_worst_layer_of_a_deep_mlp() -> None:
    rows = [row for seed in (0, 1, 2) for row in _rows(rm.deep_mlp(seed, depth=8, epochs=12))]
    for row in rows:
        assert row.rho["calibrated"] >= 0.75, row
    # NB: the worst or tied with it (`rm.tied`): the calibration and held-out splits (500 and 397
    # rows, the KL carried by few of them) disagree on the worst of two close layers, and which
    # one the held-out split puts first moves with the CPU's rounding in training (seed 0 int8:
    # 1.4 ± 14 ·10⁻⁶ apart on one machine, where another had seed 2 int8 63.3 vs 62.9 ·10⁻⁶)
    assert sum(r.worst_or_tied["calibrated"] for r in rows) >= 8, rows
    # the Fisher alone (no measured KL) ranks too, and the data-free score beats depth alone
    assert statistics.median(r.rho["fisher"] for r in rows) >= 0.6, rows
    assert statistics.median(r.rho["data-free"] for r in rows) >= 0.6, rows


@pytest.mark.slow
def test_planted_outlier_channels_do_not_fool_the_calibrated_ranking() -> None:
    """Function-preserving rescaling leaves the model alone and changes what each format does
    to it; the ranking must follow the real damage, per format."""
    rows = _rows(rm.regression_outliers(0))
    assert statistics.median(r.rho["calibrated"] for r in rows) >= 0.8, rows
    assert statistics.median(r.rho["data-free"] for r in rows) >= 0.6, rows


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_recurrent_matrices_are_ranked_with_the_rest(seed: int) -> None:
    case = rm.gru(seed)
    names = {layer.name for layer in rm.candidates(case)}
    assert {"gru.weight_ih_l0", "gru.weight_hh_l0", "gru.weight_hh_l2"} <= names
    rows = _rows(case)
    assert statistics.median(r.rho["calibrated"] for r in rows) >= 0.8, rows
    assert sum(r.worst_or_tied["calibrated"] for r in rows) >= len(rows) - 1, rows


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_batchnorm_cnn_data_free_from_distilled_inputs(seed: int) -> None:
    case = rm.bn_cnn(seed)
    folded = [layer for layer in rm.candidates(case) if layer.folded_into]
    assert len(folded) == 7                          # every conv; the head has no BatchNorm
    section = rm.fxlens_section(case, calibrated=False)
    assert "BatchNorm" in section["data_free_evidence"]
    rows = _rows(case)
    assert statistics.median(r.rho["data-free"] for r in rows) >= 0.6, rows
    assert statistics.median(r.rho["calibrated"] for r in rows) >= 0.8, rows


@pytest.mark.slow
def test_char_lm_embeddings_and_head_rank_where_they_hurt() -> None:
    case = rm.char_lm(0)
    rows = _rows(case)
    assert rows[0].layers == 27
    assert statistics.median(r.rho["calibrated"] for r in rows) >= 0.9, rows
    assert sum(r.worst_first["calibrated"] for r in rows) >= len(rows) - 1, rows
    assert statistics.median(r.rho["data-free"] for r in rows) >= 0.6, rows


def test_fisher_damage_predicts_the_measured_kl() -> None:
    """½·Σ F·Δw² is, to second order, the KL the measurement sees (same unit, nats)."""
    case = rm.deep_mlp(0, depth=8, epochs=12)
    section = rm.fxlens_section(case)
    ratios = [r["fisher_damage"]["int8_per_tensor"] / r["output_kl"]["int8_per_tensor"]
              for r in section["layers"] if "int8_per_tensor" in (r.get("output_kl") or {})]
    assert len(ratios) >= 6
    assert 0.3 <= statistics.median(ratios) <= 3.0, ratios


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_few_samples_dominating_the_calibration_are_warned(seed: int) -> None:
    """Calibrated on inputs the model is over-confident on (its training images, brightened):
    most rows carry no damage, so the ranking rests on the few that do."""
    case = rm.deep_mlp(seed, depth=8, epochs=12)
    x, _, train, _, _ = rm._digits(seed)
    healthy = rm.fxlens_section(case)                      # 500 held-out rows
    assert not any("dominated" in n for n in healthy["notes"]), healthy["notes"]
    confident = dataclasses.replace(case, calibration=[(x[train[:60]] * 3,)])
    note = next(n for n in rm.fxlens_section(confident)["notes"]
                if "dominated by a few samples" in n)
    assert "of 60 calibration rows" in note


@pytest.mark.slow
def test_memorised_calibration_is_warned() -> None:
    case = rm.deep_mlp(0, depth=8, epochs=12)
    with torch.no_grad():
        for layer in case.model:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.mul_(0.0).add_(torch.eye(*layer.weight.shape) * 1e-3)
    section = rm.fxlens_section(case)
    assert any("KL is below" in n for n in section["notes"])


@pytest.mark.slow
def test_fisher_damage_predicts_the_measured_output_error_of_a_regression() -> None:
    """A regression's Fisher reads the noise power over the signal power of all examples, the
    output SQNR calibration measures (not a mean relative error per example, which the outputs
    near zero dominate): 2·½·Σ F·Δw² ≈ 10^(−SQNR/10)."""
    section = rm.fxlens_section(rm.regression_outliers(0))
    assert section["calibration"]["metric"] == "sqnr"
    ratios = [10 ** (-r["output_sqnr_db"][fmt] / 10) / (2 * r["fisher_damage"][fmt])
              for r in section["layers"] for fmt in ("int8_per_tensor", "int8_per_channel")]
    assert len(ratios) == 16
    assert 0.3 <= statistics.median(ratios) <= 3.0, ratios


def test_a_tie_is_a_difference_within_the_rows_noise() -> None:
    """The worst layer's per-row damage against another's on the same rows (`rm.tied`)."""
    g = torch.Generator().manual_seed(0)
    rows = torch.rand(400, generator=g, dtype=torch.float64)
    noise = torch.randn(400, generator=g, dtype=torch.float64)
    assert rm.tied(rows, rows)                                  # the pick is the worst itself
    assert rm.tied(rows + 0.01 * noise, rows)                   # apart by noise only
    assert not rm.tied(rows * 1.5, rows)                        # 50 % worse on every row
    assert not rm.tied(rows + 0.01 * noise + 0.01, rows)        # a shift of 20 standard errors
