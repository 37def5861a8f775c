"""Calibrated pruning importance (issue 33): each unit removed alone, the calibration batches
forwarded, the damage by ``--quant-calibrate``'s metric; it ranks when the model file gives
``calibration()``, and the plan states its own measured damage. The damages are checked
against the pruned module itself (`pruned_module`, the module ``--prune-save`` writes) and a
KL/error power computed here; bench/prune_ranking.py measures the ranking on held-out data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.prune.calibrated import CalibrationData, unit_damages
from fxlens.analyzer.prune.module import pruned_module, removed
from fxlens.analyzer.prune.plan import ranked_units
from fxlens.prune_pass import calibration_data
from fxlens.rules.prune import knowledge
from tests.analyzer.prune_models import planned

MODELS = Path(__file__).resolve().parents[1] / "models"
F = nn.functional


class Net(nn.Module):
    """8 → 16 → 16 → 4, ReLU; `logits` False ends in a ReLU (not a linear head: SQNR)."""

    def __init__(self, logits: bool = True) -> None:
        super().__init__()
        self.logits = logits
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, F)
        y = self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))
        return y if self.logits else torch.relu(y)


PLANTED = 3    # fc1's neuron with big weights in, nothing out


def net(logits: bool = True) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = Net(logits).eval()
    with torch.no_grad():
        model.fc1.weight[PLANTED] *= 10
        model.fc2.weight[:, PLANTED] = 0
    return model, (torch.randn(4, 8),)


def batches() -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 8, generator=g),) for _ in range(2)]


def data_for(model: nn.Module, inputs: Any) -> CalibrationData:
    data = calibration_data(LoadedModel(model, inputs, "net", "net", calibration=batches))
    assert data is not None
    return data


def damage_here(model: nn.Module, pruned: nn.Module, metric: str) -> float:
    """KL(softmax(z) ‖ softmax(ẑ)) averaged over the rows (fewer than 100: no tail cap), or
    the relative error power, over `batches`."""
    with torch.no_grad():
        z = torch.cat([model(*b) for b in batches()]).double()
        zq = torch.cat([pruned(*b) for b in batches()]).double()
    if metric == "sqnr":
        return float((z - zq).pow(2).sum() / z.pow(2).sum())
    p, q = z.log_softmax(-1), zq.log_softmax(-1)
    return float((p.exp() * (p - q)).sum(-1).clamp(min=0).mean())


def test_a_neuron_that_carries_nothing_goes_first_by_calibration_not_by_its_weights() -> None:
    model, inputs = net()
    free = planned(lambda: (model, inputs), None)[2].groups
    calibrated = planned(lambda: (model, inputs), None, data_for(model, inputs))[2].groups
    hidden = next(g for g in free if any(m.param == "fc1.weight" for m in g.members))
    assert hidden.importance[PLANTED] == max(hidden.importance)     # the weights say: keep
    first = ranked_units(calibrated)[0]
    assert first == (hidden.root, PLANTED)
    measured = next(g for g in calibrated if g.root == hidden.root)
    assert measured.importance[PLANTED] == 0.0 < min(
        v for u, v in enumerate(measured.importance) if u != PLANTED)


@pytest.mark.parametrize("logits, metric", [(True, "kl"), (False, "sqnr")])
def test_each_unit_s_damage_is_the_output_change_of_the_module_without_it(
        logits: bool, metric: str) -> None:
    model, inputs = net(logits)
    data = data_for(model, inputs)
    assert data.metric == metric
    result = planned(lambda: (model, inputs), None, data)[2]
    assert result.section.importance == "calibrated"
    for group in result.groups:
        for unit in (0, 5, group.units - 1):
            pruned = pruned_module(model, result.groups, {group.root: frozenset({unit})},
                                   knowledge())
            assert group.importance[unit] == pytest.approx(
                damage_here(model, pruned, metric), rel=1e-9, abs=1e-15)


def test_a_budget_measures_a_spread_share_and_interpolates_the_rest() -> None:
    model, inputs = net()
    data = data_for(model, inputs)
    groups = planned(lambda: (model, inputs), None)[2].groups     # data-free importance
    full = unit_damages(model, groups, data, knowledge())
    part = unit_damages(model, groups, data, knowledge(), budget=8)
    assert (full.measured, part.measured, part.total) == (32, 8, 32)
    for group in groups:
        order = sorted(range(group.units), key=lambda u: (group.importance[u], u))
        got, truth = part.per_unit[group.root], full.per_unit[group.root]
        known = [r for r, u in enumerate(order) if got[u] == truth[u]]
        assert known[0] == 0 and known[-1] == group.units - 1     # both ends measured
        for rank, unit in enumerate(order):
            below = max(r for r in known if r <= rank)
            above = min(r for r in known if r >= rank)
            lo, hi = sorted((got[order[below]], got[order[above]]))
            assert lo <= got[unit] <= hi


def test_the_plan_ranks_by_calibrated_damage_and_states_its_own() -> None:
    model, inputs = net()
    result = planned(lambda: (model, inputs), "30%", data_for(model, inputs))[2]
    plan, calibration = result.section.plan, result.section.calibration
    assert plan is not None and calibration is not None and result.module is not None
    assert "calibrated damage" in plan.ranking and calibration.metric == "kl"
    assert (calibration.batches, calibration.units_measured) == (2, calibration.units_total)
    assert plan.damage == pytest.approx(damage_here(model, result.module, "kl"), rel=1e-9)
    assert plan.damage > 0


def test_removing_in_place_puts_every_tensor_and_attribute_back() -> None:
    model, inputs = net()
    groups = planned(lambda: (model, inputs), None)[2].groups
    before = {n: p for n, p in model.named_parameters()}
    reference = model(*inputs)
    removal = {g.root: frozenset({0, 1}) for g in groups}
    with pytest.raises(RuntimeError, match="inside"), removed(model, groups, removal,
                                                               knowledge()):
        assert model.fc1.out_features == 14 and model.fc1.weight.shape == (14, 8)
        raise RuntimeError("inside")
    assert {n: p for n, p in model.named_parameters()} == before
    assert model.fc1.out_features == 16
    assert torch.equal(model(*inputs), reference)


@pytest.mark.slow
def test_a_model_file_with_calibration_ranks_by_it(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from fxlens.cli.main import main

    path = tmp_path / "calibrated_mlp.py"
    path.write_text((MODELS / "mlp.py").read_text() + (
        "\n\ndef calibration():\n    for i in range(2):\n"
        "        yield torch.randn(8, 32, generator=torch.Generator().manual_seed(i))\n"))
    assert main([str(path), "--prune-target", "30%", "--out", str(tmp_path / "r"),
                 "--no-pages", "--show", "prune"]) == 0
    section = json.loads((tmp_path / "r" / "report.json").read_text())["prune"]
    assert section["importance"] == "calibrated"
    assert section["calibration"]["source"] == "calibration()"
    assert section["plan"]["damage"] > 0
    out = capsys.readouterr().out
    assert "calibrated damage" in out and "KL" in out


def test_every_surface_shows_the_plan_its_damage_and_which_score_ranks() -> None:
    from fxlens.api import AnalysisOptions, analyze_loaded
    from fxlens.reports.html import render_html
    from fxlens.reports.markdown import render_markdown

    model, inputs = net()
    report = analyze_loaded(LoadedModel(model, inputs, "net", "net.py", calibration=batches),
                            AnalysisOptions(prune_target="30%", fusion=False))
    html, markdown = render_html(report, None), render_markdown(report)
    for page in (html, markdown):
        assert "pruning plan (30%)" in page and "predicted damage" in page
        assert "units ranked by calibrated damage: every unit removed alone" in page
        assert "fc1 → fc2" in page
