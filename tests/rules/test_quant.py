"""Quantization knowledge: formats (error bounds, storage with scales), random-init detection,
risk rules on synthetic layer views, plans. Milliseconds, no tracing."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fxlens.analyzer.quant.types import LayerView
from fxlens.analyzer.quant.weights import sqnr_db, weight_stats
from fxlens.rules.quant import (
    RISK_RULES,
    channel_axis,
    plan_spec,
    random_init_reason,
    risk_rule,
    risks,
)
from fxlens.rules.quant_formats import BF16, Granularity, NumberFormat, formats


def _w(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_int8_per_channel_error_is_at_most_half_a_step() -> None:
    w = _w(16, 256)
    q = formats()["int8_per_channel"].fake_quantize(w, 0)
    step = w.abs().amax(dim=1, keepdim=True) / 127
    assert torch.all((w - q).abs() <= step / 2 + 1e-7)


def test_per_channel_beats_per_tensor_when_channel_ranges_differ() -> None:
    w = _w(8, 128) * torch.logspace(-2, 0, 8).unsqueeze(1)
    f = formats()
    assert sqnr_db(w, f["int8_per_channel"].fake_quantize(w, 0)) > \
        sqnr_db(w, f["int8_per_tensor"].fake_quantize(w, 0)) + 5


def test_int8_gaussian_sqnr_matches_uniform_noise_theory() -> None:
    w = _w(256, 256)
    q = formats()["int8_per_tensor"].fake_quantize(w, 0)
    step = float(w.abs().max()) / 127
    expected = 10 * math.log10(float(w.pow(2).mean()) / (step**2 / 12))
    assert sqnr_db(w, q) == pytest.approx(expected, abs=0.3)


@pytest.mark.parametrize("group", [32, 128])
def test_int4_groups_are_configurable_and_stored_with_scales(group: int) -> None:
    fmt = formats(group)[f"int4_g{group}"]
    shape = (64, 256)
    assert fmt.storage_bytes(shape, 0) == 64 * 256 // 2 + 2 * 64 * (256 // group)
    w = _w(*shape)
    rows = w.reshape(-1, group)
    q = fmt.fake_quantize(w, 0).reshape(-1, group)
    assert torch.all((rows - q).abs() <= rows.abs().amax(1, keepdim=True) / 7 / 2 + 1e-7)


def test_storage_bytes_per_format() -> None:
    f = formats()
    shape = (32, 16, 3, 3)          # conv: 32 output channels
    n = 32 * 16 * 9
    assert f["int8_per_channel"].storage_bytes(shape, 0) == n + 2 * 32
    assert f["int8_per_tensor"].storage_bytes(shape, 0) == n + 2
    assert f["fp8_e4m3"].storage_bytes(shape, 0) == n + 4
    assert BF16.storage_bytes(shape, 0) == 2 * n


def test_fp8_keeps_about_three_mantissa_bits() -> None:
    w = _w(64, 64)
    assert 25 < sqnr_db(w, formats()["fp8_e4m3"].fake_quantize(w, 0)) < 35


def test_channel_axis_by_layer_type() -> None:
    assert channel_axis(nn.Linear(4, 8)) == 0
    assert channel_axis(nn.Conv2d(3, 8, 3)) == 0
    assert channel_axis(nn.ConvTranspose2d(8, 3, 2)) == 1
    assert channel_axis(nn.Embedding(10, 4)) == 0
    assert channel_axis(nn.LayerNorm(4)) is None


@pytest.mark.parametrize("layer", [nn.Linear(256, 128), nn.Conv2d(32, 64, 3)])
def test_default_pytorch_init_is_recognised(layer: nn.Module) -> None:
    w = layer.weight
    stats = weight_stats(w, 0)
    assert random_init_reason(stats, w[0].numel(), w.shape[0]) is not None


def test_gaussian_inits_are_recognised_and_heavy_tails_are_not() -> None:
    emb = torch.randn(1000, 64)                       # nn.Embedding's N(0, 1)
    hf = torch.randn(384, 384) * 0.02                 # transformers' initializer_range
    trained = torch.distributions.StudentT(3.0).sample((384, 384)) * 0.05
    assert random_init_reason(weight_stats(emb, 0), 64, 1000, "Embedding") is not None
    assert random_init_reason(weight_stats(hf, 0), 384, 384, "Linear", 0.02) is not None
    assert random_init_reason(weight_stats(trained, 0), 384, 384, "Linear", 0.02) is None


def test_a_gaussian_trained_linear_is_not_taken_for_an_init() -> None:
    """nn.Linear starts uniform: a trained weight that happens to look like Lecun's Gaussian
    (kurtosis 3, std 1/√fan_in) is scored, not refused."""
    trained = torch.randn(384, 384) / math.sqrt(384)
    assert random_init_reason(weight_stats(trained, 0), 384, 384, "Linear") is None
    assert random_init_reason(weight_stats(trained * 0.02 * math.sqrt(384), 0), 384, 384,
                              "Linear", 0.02) is not None     # in an HF model: its init


def test_small_weights_are_not_judged_gaussian() -> None:
    w = torch.randn(16, 9) * math.sqrt(2 / 25)        # matches Xavier by construction
    assert random_init_reason(weight_stats(w, 0), 9, 16) is None


CASES = [
    (LayerView("q", "Linear", feeds=frozenset({"aten.scaled_dot_product_attention:query"})),
     ["QNT001"]),
    (LayerView("v", "Linear", feeds=frozenset({"aten.scaled_dot_product_attention:value"})), []),
    (LayerView("o", "Linear", feeds=frozenset({"aten.add", "aten.layer_norm"}),
               feeds_residual=True), ["QNT002", "QNT006"]),
    (LayerView("o", "Linear", feeds=frozenset({"aten.add"}), feeds_residual=True,
               residual_max_over_std=5.0), []),
    (LayerView("g", "Linear", feeds=frozenset({"aten.exp", "aten.div"})), ["QNT003"]),
    (LayerView("e", "Embedding", is_first=True), ["QNT004"]),
    (LayerView("h", "Linear", is_last=True), ["QNT005"]),
]


@pytest.mark.parametrize(("view", "codes"), CASES)
def test_risk_rules(view: LayerView, codes: list[str]) -> None:
    assert [r.code for r in risks(view)] == codes


def test_every_risk_rule_documents_what_and_fix() -> None:
    for code, rule in RISK_RULES.items():
        what, _, fix = (rule.__doc__ or "").partition("\n\n")
        assert code.startswith("QNT") and what.strip() and fix.strip()


def test_duplicate_risk_code_names_both_sites() -> None:
    with pytest.raises(ValueError, match="QNT001 registered twice.*test_quant.py"):
        risk_rule("QNT001")(lambda layer: None)


def test_plans() -> None:
    assert plan_spec("w4a16", 64).ladder[0] == "int4_g64"
    assert plan_spec("w8a8").activations == "int8"
    with pytest.raises(ValueError, match="unknown quantization plan"):
        plan_spec("w2a2")


def test_custom_format_rounds_to_its_grid() -> None:
    fmt = NumberFormat("int2", "int", 2, Granularity.TENSOR)
    assert len(fmt.fake_quantize(_w(32, 32), 0).unique()) == 3
