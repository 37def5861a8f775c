"""Structured pruning (issue 33 part 1): coupled groups from the graph, exact savings, a plan
and the pruned module, checked against the module itself: it runs, keeps its output shapes,
and FlopCounterMode on its eager run counts the GEMM FLOPs the plan predicted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.prune.module import run
from fxlens.analyzer.prune.plan import parse_target
from fxlens.analyzer.prune.section import PruneResult, prune
from fxlens.rules import load_rules
from fxlens.rules.prune import knowledge
from tests.models import branchy, convnet, hf_zoo, lstm, mlp, tiny_gpt

GEMM_RULES = ("fxlens.rules.matmul", "fxlens.rules.conv")


class Concat(nn.Module):
    """Two conv branches concatenated on channels, then a depthwise conv with batch norm."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 16, 1)
        self.dw = nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.bn = nn.BatchNorm2d(24)
        self.head = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, C, H, W)
        y = torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], dim=1)
        y = torch.relu(self.bn(self.dw(y)))
        return self.head(y.mean((2, 3)))


def concat() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = Concat().eval()
    model.bn.weight.data.uniform_(0.1, 1.0)
    return model, (torch.randn(2, 3, 8, 8),)


MODELS: dict[str, Callable[[], Any]] = {
    "mlp": mlp.build, "convnet": convnet.build, "tiny_gpt": tiny_gpt.build,
    "concat": concat, "llama": hf_zoo.build_llama, "bert": hf_zoo.build_bert,
}


def planned(build: Callable[[], Any], target: str = "30%") -> tuple[Any, Any, PruneResult]:
    module, inputs = build()
    registry = load_rules()
    graph = capture(module, inputs, registry)
    report = analyze(graph, registry)
    return module, inputs, prune(module, inputs, graph, report, knowledge(), registry,
                                 parse_target(target))


def eager_gemm_flops(module: nn.Module, inputs: Any) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        run(module, inputs)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_pruned_module_runs_and_costs_what_the_plan_predicted(name: str) -> None:
    module, inputs, result = planned(MODELS[name])
    plan = result.section.plan
    assert plan is not None and result.module is not None and result.shrunk is not None
    assert plan.met and plan.params_after < plan.params_before
    assert run(result.module, inputs) == run(module, inputs)
    assert sum(p.numel() for p in result.module.parameters()) == plan.params_after
    registry = load_rules()
    recaptured = analyze(capture(result.module, inputs, registry), registry)
    assert recaptured.totals.flops == plan.flops_after
    shrunk = result.shrunk
    predicted = sum(costed.flops for node, costed in zip(shrunk.graph.calls(),
                                                          shrunk.report.nodes, strict=True)
                    if getattr(registry.lookup(node), "__module__", "") in GEMM_RULES)
    assert eager_gemm_flops(result.module, inputs) == predicted


def test_a_recorded_graph_runs_pruned_and_warns_that_its_branches_may_move() -> None:
    """Known divergence: branchy's routing and loop count read the residual stream's values,
    so a pruned model may take other branches than the recorded graph costed; the section
    says so, and the pruned module still runs with the original output shapes."""
    module, inputs, result = planned(branchy.build)
    assert any("recording one eager run" in note for note in result.section.notes)
    assert result.module is not None
    assert run(result.module, inputs) == run(module, inputs)


def test_gqa_heads_go_with_their_kv_group() -> None:
    module, _, result = planned(hf_zoo.build_llama)
    config = module.config
    head_dim = config.hidden_size // config.num_attention_heads
    per_group = config.num_attention_heads // config.num_key_value_heads
    attention = [g for g in result.section.groups if g.kind == "kv groups"]
    assert len(attention) == config.num_hidden_layers
    for group in attention:
        assert group.units == config.num_key_value_heads
        widths = {m.param.rsplit(".", 2)[-2]: m.width for m in group.members}
        assert widths == {"q_proj": per_group * head_dim, "k_proj": head_dim,
                          "v_proj": head_dim, "o_proj": per_group * head_dim}


def test_concat_slices_keep_their_offsets_and_depthwise_ties_in_to_out() -> None:
    _, _, result = planned(concat)
    by_first = {g.members[0].param: g for g in result.section.groups}
    a, b = by_first["a.weight"], by_first["b.weight"]
    dw_a = {(m.param, m.dim): m.start for m in a.members}
    dw_b = {(m.param, m.dim): m.start for m in b.members}
    width_a = 8
    assert dw_a[("dw.weight", 0)] == 0 and dw_b[("dw.weight", 0)] == width_a
    assert dw_b[("bn.weight", 0)] == width_a and dw_b[("head.weight", 1)] == width_a
    assert a.importance_basis == b.importance_basis == "|γ| of the batch norm"


def test_a_model_without_prunable_group_says_why() -> None:
    _, _, result = planned(lstm.build)
    assert result.section.groups == () and result.section.plan is None
    assert any("aten.lstm" in why for why in result.section.blocked)


def test_an_unreachable_target_says_how_far_it_got() -> None:
    _, _, result = planned(mlp.build, "99.9%")
    plan = result.section.plan
    assert plan is not None and not plan.met
    assert plan.units_removed == sum(g.units - 1 for g in result.section.groups)


def test_a_group_whose_forward_fixes_its_width_is_blocked_not_offered() -> None:
    """tiny_gpt splits its QKV output by the residual width read from the input: pruning
    heads or the residual stream breaks its forward, so only the MLP neurons are offered."""
    _, _, result = planned(tiny_gpt.build)
    assert {g.kind for g in result.section.groups} == {"neurons"}
    assert any("forward fails" in why for why in result.section.blocked)


@pytest.mark.parametrize("text, share, basis", [
    ("30%", 0.3, "params"), ("12.5%flops", 0.125, "flops"), (" 5 % params", 0.05, "params"),
])
def test_targets_parse(text: str, share: float, basis: str) -> None:
    target = parse_target(text)
    assert (target.share, target.basis) == (pytest.approx(share), basis)


@pytest.mark.parametrize("text", ["30", "0%", "100%", "30%time", "-5%"])
def test_bad_targets_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="share below 100"):
        parse_target(text)


def test_the_first_screen_states_the_plan_or_why_nothing_prunes(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fxlens.cli.main import main

    assert main([convnet.__file__, "--prune-target", "30%", "--out", str(tmp_path / "c"),
                 "--no-pages"]) == 0
    plan = json.loads((tmp_path / "c" / "report.json").read_text())["prune"]["plan"]
    cut = 1 - plan["params_after"] / plan["params_before"]
    first = capsys.readouterr().out
    assert "pruning plan (30%)" in first and f"−{cut:.1%} params" in first
    assert main([lstm.__file__, "--prune", "--out", str(tmp_path / "l"), "--no-pages"]) == 0
    assert "no prunable group" in capsys.readouterr().out.split("└")[0]   # in the summary box
