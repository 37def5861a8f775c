"""The weights-only prior under function-preserving rescaling (`fxlens.analyzer.quant.links`):
scaling hidden channel c of layer A by s and the next layer B's input channel c by 1/s across a
ReLU leaves the model's function alone and changes what quantization does to it. The prior
must follow the damage measured for real: unchanged where the damage is, down where it drops.
Across a link that is not positively homogeneous nothing is weighed, and the evidence says so.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.codec import encode
from fxlens.analyzer.quant.section import QuantSettings, quant_section
from fxlens.rules import load_rules
from fxlens.rules.quant import knowledge

FACTOR = 50.0
CHANNEL = 3
A, B = "2", "4"          # the rescaled pair: Sequential indices of the two linear layers


def _mlp(act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Gaussian weights (not a default init, so the prior scores them)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), act(), nn.Linear(32, 32), act(),
                          nn.Linear(32, 32), act(), nn.Linear(32, 4)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    return model


def _rescaled(model: nn.Sequential) -> nn.Sequential:
    out = copy.deepcopy(model)
    a, b = out[int(A)], out[int(B)]
    assert isinstance(a, nn.Linear) and isinstance(b, nn.Linear)
    with torch.no_grad():
        a.weight[CHANNEL] *= FACTOR
        a.bias[CHANNEL] *= FACTOR
        b.weight[:, CHANNEL] /= FACTOR
    return out


def _prior(model: nn.Module) -> dict:
    graph = capture(model, (torch.randn(2, 16),), load_rules())
    return encode(quant_section(model, graph, knowledge(), QuantSettings()))  # type: ignore[no-any-return]


def _scores(section: dict) -> dict[str, dict[str, float]]:
    return {r["layer"]: r["data_free_sqnr_db"] for r in section["layers"]}


def _measured(model: nn.Sequential) -> dict[str, dict[str, float]]:
    """Output SQNR (dB) with each layer alone quantized at each format."""
    x = torch.randn(2048, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(x)
        out: dict[str, dict[str, float]] = {}
        for name, layer in model.named_children():
            if not isinstance(layer, nn.Linear):
                continue
            original = layer.weight.data
            out[name] = {}
            for fmt, number in knowledge().formats.items():
                layer.weight.data = number.fake_quantize(original, 0)
                noise = (model(x) - reference).pow(2).mean()
                out[name][fmt] = 10 * math.log10(float(reference.pow(2).mean() / noise))
                layer.weight.data = original
    return out


def test_the_prior_follows_the_damage_of_a_function_preserving_rescaling() -> None:
    model = _mlp()
    scaled = _rescaled(model)
    x = torch.randn(64, 16)
    torch.testing.assert_close(scaled(x), model(x), rtol=1e-4, atol=1e-5)
    truth, truth_scaled = _measured(model), _measured(scaled)
    prior, prior_scaled = _scores(_prior(model)), _scores(_prior(scaled))
    # the premise, measured: B's column c, now 50× smaller, is rounded on the same grid and
    # multiplies a 50× larger input; A's rows keep their own per-channel scales
    assert truth_scaled[B]["int8_per_channel"] < truth[B]["int8_per_channel"] - 10
    assert abs(truth_scaled[A]["int8_per_channel"] - truth[A]["int8_per_channel"]) < 0.5
    for layer, formats in truth.items():
        for fmt, db in formats.items():
            moved = truth_scaled[layer][fmt] - db
            scored = prior_scaled[layer][fmt] - prior[layer][fmt]
            if abs(moved) < 1:       # the damage did not move: neither may the prior
                assert abs(scored) < 1, (layer, fmt, moved, scored)
            if moved < -10:          # the damage rose by 10 dB or more: the prior sees it
                assert scored < -5, (layer, fmt, moved, scored)
    worst = min(prior_scaled, key=lambda n: prior_scaled[n]["int8_per_channel"])
    assert worst == min(truth_scaled, key=lambda n: truth_scaled[n]["int8_per_channel"]) == B


def test_no_weighing_across_a_link_that_is_not_positively_homogeneous() -> None:
    relu, gelu = _prior(_mlp()), _prior(_mlp(nn.GELU))
    assert "3 of 4 layers, through aten.relu" in relu["data_free_evidence"]
    assert "not weighed" not in relu["data_free_evidence"]
    evidence = gelu["data_free_evidence"]
    assert "each input channel's error weighed" not in evidence
    for name in ("2", "4", "6"):
        assert f"{name} (fed through aten.gelu)" in evidence, evidence


def test_channels_are_followed_through_batchnorm_pooling_and_flatten() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, groups=4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(8 * 2 * 2, 3), nn.GELU(), nn.LayerNorm(3), nn.Linear(3, 2)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    graph = capture(model, (torch.randn(1, 1, 8, 8),), load_rules())
    section = encode(quant_section(model, graph, knowledge(), QuantSettings()))
    evidence = section["data_free_evidence"]
    assert "2 of 4 layers, through aten.batch_norm, aten.flatten, aten.max_pool2d, " \
           "aten.relu" in evidence, evidence
    assert "10 (fed through aten.layer_norm)" in evidence, evidence
