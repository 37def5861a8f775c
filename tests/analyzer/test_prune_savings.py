"""What a pruning saves beyond params and forward FLOPs (issue 33, part 3): training-step FLOPs
and saved activations, KV-cache bytes per token, and roofline time on a device, each checked
against the pruned module captured again; and the plan's aligned cut on an H100."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.training import capture_training
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.memory.training_step import saved_activations
from fxlens.analyzer.prune.module import pruned_module
from fxlens.analyzer.prune.plan import parse_target
from fxlens.analyzer.prune.savings import cache_element_bytes, kv_bytes_per_token
from fxlens.analyzer.prune.section import PruneResult, prune, ranked_or_last
from fxlens.checks import resolve_device
from fxlens.rules import load_rules
from fxlens.rules.prune import knowledge
from tests.analyzer.prune_models import MODELS


def _pruned(build: Any, target: str | None = "30%", device: str | None = None
            ) -> tuple[nn.Module, Any, PruneResult]:
    module, inputs = build()
    registry = load_rules()
    graph = capture(module, inputs, registry)
    return module, inputs, prune(
        module, inputs, graph, analyze(graph, registry), knowledge(), registry,
        parse_target(target) if target else None,
        step=lambda m: capture_training(m, inputs, registry),
        device=resolve_device(device) if device else None)


def _step(module: nn.Module, inputs: Any) -> tuple[int, int]:
    """(FLOPs, saved activation bytes) of the module's training step, captured afresh."""
    registry = load_rules()
    step = capture_training(module, inputs, registry)
    saved = saved_activations(step.graph, step.saved, registry)
    return analyze(step.graph, registry).totals.flops, sum(saved.values())


def _kv(module: nn.Module, inputs: Any) -> int | None:
    graph = capture(module, inputs, load_rules())
    return kv_bytes_per_token(graph, cache_element_bytes(graph))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "mlp", "convnet"])
def test_each_group_and_the_plan_save_what_the_recaptured_pruned_module_shows(
        name: str) -> None:
    module, inputs, result = _pruned(MODELS[name])
    plan, found = result.section.plan, {g.root: g for g in result.groups}
    assert plan is not None and result.module is not None
    flops, saved = _step(module, inputs)
    assert (plan.train_flops_before, plan.saved_bytes_before) == (flops, saved)
    assert (plan.train_flops_after, plan.saved_bytes_after) == _step(result.module, inputs)
    assert plan.train_flops_after is not None and plan.train_flops_after < flops
    # the backward shrinks too: more saved than the forward alone
    assert flops - plan.train_flops_after > plan.flops_before - plan.flops_after
    assert plan.kv_bytes_per_token_after == _kv(result.module, inputs)
    for group in result.section.groups:
        one = pruned_module(module, result.groups, {group.id: frozenset(
            {ranked_or_last(found[group.id])})}, knowledge())
        got_flops, got_saved = _step(one, inputs)
        assert group.train_flops_per_unit == flops - got_flops > group.flops_per_unit
        assert group.saved_bytes_per_unit == saved - got_saved
        before = plan.kv_bytes_per_token_before
        assert group.kv_bytes_per_token_per_unit == (
            None if before is None else before - (_kv(one, inputs) or 0))


@pytest.mark.slow
def test_a_kv_group_saves_its_heads_cache_per_token() -> None:
    module, _, result = _pruned(MODELS["llama"], target=None)
    config = module.config
    head_dim = config.hidden_size // config.num_attention_heads
    kv = [g for g in result.section.groups if g.kind == "kv groups"]
    assert kv and all(g.kv_bytes_per_token_per_unit == 2 * head_dim * 4 for g in kv)
    mlp = [g for g in result.section.groups if g.name.endswith(".mlp")]
    assert mlp and all(g.kv_bytes_per_token_per_unit == 0 for g in mlp)


class Wide(nn.Module):
    """Two bf16 GEMMs around a 4096-neuron hidden layer."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4096, 4096), nn.Linear(4096, 4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x: (M, K)
        return self.down(torch.relu(self.up(x)))


def wide() -> tuple[nn.Module, tuple[torch.Tensor]]:
    with torch.device("meta"):
        return Wide().to(torch.bfloat16), (torch.randn(2048, 4096, dtype=torch.bfloat16),)


def test_a_cut_leaving_4095_is_slower_on_h100_and_the_plan_takes_4088() -> None:
    # one neuron's params: 2·4096 + 1; the target asks for one neuron's worth
    _, _, result = _pruned(wide, target="0.02%", device="h100")
    plan = result.section.plan
    assert plan is not None and plan.met and plan.device == "h100"
    assert plan.cut == "aligned, rounded up" and plan.units_removed == 8
    assert plan.params_after == plan.params_before - 8 * (2 * 4096 + 1)
    assert plan.misaligned_after == plan.misaligned_before == 0
    # 4088 leaves the 128-tiles (listed, not rated by the device model) but not the 8
    assert plan.alignment and all(a.multiple == 128 for a in plan.alignment)
    assert not any(a.penalised for a in plan.alignment)
    exact = plan.alternative
    assert exact is not None and exact.how == "exact" and exact.units_removed == 1
    assert exact.misaligned == 2          # K of `down`, N of `up`: 4095 entries
    assert exact.forward_s_after is not None and plan.forward_s_after is not None
    assert plan.forward_s_before is not None
    assert exact.forward_s_after > plan.forward_s_before > plan.forward_s_after
    (group,) = result.section.groups
    assert group.aligned_units == 8
    assert group.time_s_per_unit is not None and group.time_s_per_unit < 0   # the penalty
    assert group.time_s_per_aligned is not None and group.time_s_per_aligned > 0


def test_without_a_device_the_exact_cut_stays_and_the_aligned_one_is_offered() -> None:
    _, _, result = _pruned(wide, target="0.02%")
    plan = result.section.plan
    assert plan is not None and plan.cut == "exact" and plan.units_removed == 1
    assert plan.forward_s_before is None and plan.device is None
    # 4095 bf16 entries leave the 16-byte rows: the one boundary the device model prices
    assert {(a.param, a.dim, a.after, a.penalised) for a in plan.alignment} == {
        ("up.weight", 0, 4095, True), ("up.bias", 0, 4095, True),
        ("down.weight", 1, 4095, True)}
    assert plan.alternative is not None and plan.alternative.units_removed == 8
    assert plan.alternative.how == "aligned, rounded up" and plan.alternative.met


WIDE_FILE = '''
import torch
from torch import nn


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(4096, 4096), nn.Linear(4096, 4096)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def build():
    with torch.device("meta"):
        return Wide().to(torch.bfloat16), (torch.randn(2048, 4096, dtype=torch.bfloat16),)
'''


@pytest.mark.slow
def test_every_surface_shows_the_savings_and_the_time_on_the_device(
        tmp_path: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fxlens.analyzer.core.report import load_report
    from fxlens.cli import console
    from fxlens.cli.main import main
    from fxlens.reports.html import render_html
    from fxlens.reports.markdown import render_markdown

    monkeypatch.setattr(console.out, "width", 250)
    model = tmp_path / "wide.py"
    model.write_text(WIDE_FILE)
    assert main([str(model), "--prune-target", "0.02%", "--device", "h100", "--train",
                 "--out", str(tmp_path / "r"), "--no-pages"]) == 0
    out = capsys.readouterr().out
    report = load_report(tmp_path / "r" / "report.json")
    for text in (out, render_markdown(report), render_html(report, None)):
        assert "forward on h100" in text and "aligned, rounded up" in text
        assert "training-step FLOPs" in text and "saved activations" in text
        assert "training step on h100" in text
    # the first screen: the time the plan saves on the device
    assert "time" in out.split("└")[0] and "forward" in out.split("└")[0]
