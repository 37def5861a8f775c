"""Structured pruning (issue 33): coupled groups from the graph (GQA KV groups, concat offsets,
depthwise ties, blocked groups), targets, and what the report says; the plan's module on 16
models is checked in test_prune_models.py, the groups against Torch-Pruning's in
test_prune_torch_pruning.py, calibrated importance in test_prune_calibrated.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fxlens.analyzer.prune.groups import entry_index
from fxlens.analyzer.prune.module import run
from fxlens.analyzer.prune.plan import parse_target
from tests.analyzer.prune_models import concat, planned
from tests.models import branchy, convnet, hf_zoo, lstm, mlp, tiny_gpt


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


@pytest.mark.slow
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
    heads or the residual stream breaks its forward, so of the finer groups only the MLP
    neurons are offered (whole blocks run without them and are offered too)."""
    _, _, result = planned(tiny_gpt.build)
    assert {g.kind for g in result.section.groups} == {"neurons", "block"}
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
    from fxlens.cli.main import main

    assert main([convnet.__file__, "--prune-target", "30%", "--out", str(tmp_path / "c"),
                 "--no-pages"]) == 0
    plan = json.loads((tmp_path / "c" / "report.json").read_text())["prune"]["plan"]
    cut = 1 - plan["params_after"] / plan["params_before"]
    first = capsys.readouterr().out
    assert "pruning plan (30%)" in first and f"−{cut:.1%} params" in first
    assert main([lstm.__file__, "--prune", "--out", str(tmp_path / "l"), "--no-pages"]) == 0
    assert "no prunable group" in capsys.readouterr().out.split("└")[0]   # in the summary box


def test_an_unreachable_target_through_the_cli_says_how_far_it_got(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fxlens.cli import console
    from fxlens.cli.main import main

    monkeypatch.setattr(console.out, "width", 250)        # one table row a line
    assert main([mlp.__file__, "--prune-target", "99.9%flops", "--out", str(tmp_path),
                 "--no-pages"]) == 0
    plan = json.loads((tmp_path / "report.json").read_text())["prune"]["plan"]
    got = 1 - plan["flops_after"] / plan["flops_before"]
    assert not plan["met"] and 0.9 < got < 0.999
    out = capsys.readouterr().out
    assert f"−{got:.1%} flops (target not met)" in out                 # the first screen
    assert f"not met: −{got:.1%} flops with every removable unit gone" in out


def test_a_model_without_prunable_group_says_so_in_one_line_through_the_cli(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fxlens.cli import console
    from fxlens.cli.main import main

    monkeypatch.setattr(console.out, "width", 250)
    assert main([lstm.__file__, "--prune-target", "30%", "--out", str(tmp_path),
                 "--no-pages", "--show", "prune"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("structured pruning\n"):]
    lines = [line for line in section.splitlines() if "│" in line]
    assert len(lines) == 1 and "no prunable group: aten.gru has no pruning rule" in lines[0]
    report = json.loads((tmp_path / "report.json").read_text())["prune"]
    assert report["groups"] == [] and "plan" not in report


def test_a_grouped_conv_loses_the_same_channel_of_every_group() -> None:
    """convnet's grouped conv (groups=4, 16 → 32): removing a unit must leave 4 equal
    groups, so one unit is channel j of every group on both sides."""
    _, _, result = planned(convnet.build, None)
    by_member = {(m.param, m.dim): g for g in result.groups for m in g.members}
    stem, out = by_member[("stem.0.weight", 0)], by_member[("grouped.weight", 0)]
    assert (stem.units, out.units) == (4, 8)
    unit = {(m.param, m.dim, e) for m in stem.members for e in entry_index(m, [1])}
    assert {e for p, d, e in unit if p == "stem.0.weight"} == {1, 5, 9, 13}
    assert {e for p, d, e in unit if p == "grouped.weight" and d == 1} == {1}
    assert {e for m in out.members if m.param == "depthwise.weight"
            for e in entry_index(m, [2])} == {2, 10, 18, 26}


@pytest.mark.slow
def test_prune_save_writes_a_module_fxlens_analyses_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fxlens.cli.main import main

    saved = tmp_path / "pruned.pt"
    assert main([convnet.__file__, "--prune-target", "30%flops", "--prune-save", str(saved),
                 "--out", str(tmp_path / "a"), "--no-pages", "--quiet"]) == 0
    section = json.loads((tmp_path / "a" / "report.json").read_text())["prune"]
    assert section["saved_to"] == str(saved)
    again = tmp_path / "again.py"
    again.write_text(f"import torch\nmodel = torch.load({str(saved)!r}, weights_only=False)\n"
                     "example_inputs = (torch.randn(2, 3, 32, 32),)\n")
    monkeypatch.syspath_prepend(str(Path(convnet.__file__).parent))   # as for any pickle:
    try:                                                  # where the model file imports
        assert main([str(again), "--out", str(tmp_path / "b"), "--no-pages", "--quiet"]) == 0
    finally:
        sys.modules.pop("convnet", None)
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    plan = section["plan"]
    assert report["model"]["params"] == plan["params_after"] < plan["params_before"]
    assert report["totals"]["flops"] == plan["flops_after"] <= 0.7 * plan["flops_before"]


class Padded(nn.Module):
    """conv → pad → conv; `pad` pads the spatial dims, or the channels too."""

    def __init__(self, pad: tuple[int, ...]) -> None:
        super().__init__()
        self.pad = pad
        self.a, self.b = nn.Conv2d(3, 8, 3), nn.Conv2d(8 + sum(pad[4:]), 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, C, H, W)
        return self.b(nn.functional.pad(torch.relu_(self.a(x)), self.pad))


@pytest.mark.parametrize("pad, prunable", [((1, 1, 1, 1), True), ((1, 1, 1, 1, 0, 2), False)])
def test_padding_keeps_the_channels_it_does_not_pad(pad: tuple[int, ...],
                                                    prunable: bool) -> None:
    torch.manual_seed(0)
    result = planned(lambda: (Padded(pad).eval(), (torch.randn(1, 3, 8, 8),)), None)[2]
    groups = {m.param for g in result.groups for m in g.members}
    assert ("a.weight" in groups) is prunable
    assert ("padded" in result.section.blocked) is not prunable


def test_without_real_weights_every_group_loses_the_same_share() -> None:
    # a preset on the meta device scores every unit 1: ties spread over the groups, where
    # ranking by group took all but one unit of the first group (14,336 → 1 neurons of
    # Llama-3-8B's first MLP at 25 %)
    def meta() -> tuple[nn.Module, tuple[torch.Tensor]]:
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                  nn.Linear(32, 8))
            return model, (torch.randn(4, 16),)

    _, _, result = planned(meta, "30%")
    plan = result.section.plan
    assert plan is not None and plan.met
    assert plan.ranking.startswith("no real weights to score")
    shares = [g.removed / g.units for g in result.section.groups]
    assert len(shares) == 2 and max(shares) - min(shares) <= 1 / 32


def test_calibrated_units_rank_by_damage_per_parameter_they_remove() -> None:
    from fxlens.analyzer.prune.groups import Found
    from fxlens.analyzer.prune.plan import ranked_units

    # neurons of 10 params each, and KV groups of 100: damage 1.5 for 100 params is less
    # per parameter than 1.0 for 10, so the KV group goes first
    neurons = Found(1, 3, (), frozenset(), importance=(1.0, 2.0, 3.0), comparable=True)
    kv = Found(2, 2, (), frozenset(), importance=(1.5, 2.5), comparable=True)
    assert ranked_units([neurons, kv]) == [(1, 0), (2, 0), (1, 1)]          # raw damage
    assert ranked_units([neurons, kv], {1: 10, 2: 100}) == [(2, 0), (1, 0), (1, 1)]
    # a unit that saves nothing of the basis never helps reach it: last
    assert ranked_units([neurons, kv], {1: 10, 2: 0}) == [(1, 0), (1, 1), (2, 0)]
    # data-free scores stay ÷ their group's mean: the saving is not theirs to weigh
    free = [Found(1, 3, (), frozenset(), importance=(1.0, 2.0, 3.0)),
            Found(2, 2, (), frozenset(), importance=(1.5, 2.5))]
    assert ranked_units(free, {1: 10, 2: 100}) == ranked_units(free)
