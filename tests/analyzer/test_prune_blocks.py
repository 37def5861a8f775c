"""Whole residual blocks as prunable groups (issue 33): found from the graph (identity
shortcuts only), priced against closed forms, ranked data-free and by calibrated damage, planned
exclusively with the groups inside them, and shown on every surface. The saved module of a
blocks-only plan is checked against FlopCounterMode in test_prune_models.py."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from fxlens.analyzer.prune.blocks import exclusive
from fxlens.analyzer.prune.calibrated import CalibrationData
from fxlens.analyzer.prune.module import pruned_module, run
from fxlens.rules.prune import knowledge
from tests.analyzer.prune_models import MODELS, planned


def test_every_llama_layer_is_a_block_saving_its_closed_form() -> None:
    module, inputs, result = planned(MODELS["llama"], None)
    c = module.config
    d = c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads * d
    layer = (2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size * kv   # q, o; k, v
             + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size)   # MLP, 2 norms
    blocks = [g for g in result.section.groups if g.kind == "block"]
    assert [g.name for g in blocks] == [f"model.layers.{i}" for i in range(c.num_hidden_layers)]
    batch, seq = inputs["input_ids"].shape
    for g in blocks:
        assert g.units == 1 and g.params_per_unit == layer
        # the layer's GEMMs, 2·params·tokens, are inside what it saves
        assert g.flops_per_unit > 2 * (layer - 2 * c.hidden_size) * batch * seq
        assert g.kv_bytes_per_token_per_unit == 2 * kv * 4      # K and V, fp32
        assert {m.param for m in g.members} == {
            n for n, _ in module.named_parameters() if n.startswith(g.name + ".")}
    assert [b.path for b in result.section.blocks] == [g.name for g in blocks]


def test_a_block_with_a_projection_shortcut_is_not_a_block() -> None:
    """ResNet bottleneck stage 0: layers.0 projects 16 → 32 channels (not a block), layers.1
    adds its input (a block); stage 1 projects and downsamples (not a block)."""
    _, _, result = planned(MODELS["resnet_bottleneck"], None)
    assert [g.name for g in result.section.groups if g.kind == "block"] == [
        "resnet.encoder.stages.0.layers.1"]


class Residual(nn.Module):
    """x + W₂·relu(W₁·x): a residual MLP block."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.layers = nn.ModuleList(Residual() for _ in range(4))
        self.out = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def stack() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = Stack().eval()
    with torch.no_grad():              # layer 2 adds nothing: W₂ = 0, b₂ = 0
        model.layers[2].down.weight.zero_()
        model.layers[2].down.bias.zero_()
    return model, (torch.randn(6, 8),)


def sequential() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """One nn.Sequential holding two runs of residual blocks between other layers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), Residual(), Residual(), nn.Linear(16, 16),
                          Residual(), Residual(), nn.Linear(16, 5)).eval()
    return model, (torch.randn(6, 8),)


def test_runs_of_blocks_inside_one_sequential_are_found_and_each_keeps_a_block() -> None:
    module, inputs, result = planned(sequential, "99% blocks")
    blocks = {g.block: g for g in result.groups if g.block}
    assert {p: (g.run, g.siblings) for p, g in blocks.items()} == {
        "1": ("1", 2), "2": ("1", 2), "4": ("4", 2), "5": ("4", 2)}
    plan = result.section.plan
    assert plan is not None and not plan.met and plan.units_removed == 2
    kept = [name for name, child in result.module.named_children()
            if type(child).__name__ == "Residual"]
    assert sorted(k in ("1", "2") for k in kept) == [False, True]     # one of each run
    assert run(result.module, inputs) == run(module, inputs)


def _without(model: nn.Module, index: int, x: torch.Tensor) -> torch.Tensor:
    layers = model.layers
    saved = layers[index]
    layers[index] = nn.Identity()
    try:
        with torch.no_grad():
            return model(x)
    finally:
        layers[index] = saved


def test_a_block_s_data_free_score_is_the_l2_of_all_its_weights() -> None:
    model, _, result = planned(stack, None)
    blocks = {g.name: g for g in result.section.groups if g.kind == "block"}
    assert list(blocks) == [f"layers.{i}" for i in range(4)]
    for name, g in blocks.items():
        weights = [p.detach().double() for p in model.get_submodule(name).parameters()]
        assert g.importance_min == pytest.approx(math.sqrt(sum(float(w.pow(2).sum())
                                                               for w in weights)))


def test_a_block_s_calibrated_damage_is_the_output_change_without_it_and_ranks_first(
        ) -> None:
    model, (x,) = stack()
    batches = [(torch.randn(6, 8, generator=torch.Generator().manual_seed(i)),)
               for i in range(3)]
    data = CalibrationData(batches, "calibration()", "sqnr")
    # layer 2: 1,072 of the 4,517 params (23.7 %); its 31 removable neurons (0 damage too)
    # hold 1,023 (22.6 %): 23.5 % needs the block, and taking it drops them (exclusive)
    _, inputs, result = planned(stack, "23.5%", calibration=data)
    blocks = {g.name: g for g in result.section.groups if g.kind == "block"}
    for i in (0, 3):
        with torch.no_grad():
            ref = torch.cat([model(*b).flatten() for b in batches]).double()
        got = torch.cat([_without(model, i, *b).flatten() for b in batches]).double()
        expected = float((ref - got).pow(2).sum() / ref.pow(2).sum())
        assert blocks[f"layers.{i}"].importance_min == pytest.approx(expected, rel=1e-5)
    assert blocks["layers.2"].importance_min == 0.0      # it adds nothing
    plan = result.section.plan
    assert plan is not None and plan.met and plan.damage == 0.0
    assert blocks["layers.2"].removed == 1
    # Beside the block, only what costs nothing: layers.1's neuron 20 is dead on every
    # calibration batch, its measured damage 0 or rounding noise by the matmuls' reduction
    # order (the CPU, its threads); at 0 the plan may take it too.
    others = [g for g in result.section.groups if g.removed and g.name != "layers.2"]
    assert all(g.kind == "neurons" and g.importance_min == 0.0 for g in others), others
    assert plan.units_removed == 1 + sum(g.removed for g in others)
    assert result.module is not None and run(result.module, inputs) == [(6, 5)]
    assert type(result.module.layers[2]).__name__ == "Skipped"


@pytest.mark.parametrize("target", ["10%", "30%"])
def test_a_data_free_plan_takes_finer_units_before_any_block(target: str) -> None:
    # layer 2 adds nothing (zero weights: the lowest norm of its run), yet without data the
    # plan cannot know a block costs less than a neuron: units first
    _, _, result = planned(stack, target)
    plan = result.section.plan
    assert plan is not None and plan.met and plan.units_removed > 0
    assert all(g.removed == 0 for g in result.section.groups if g.kind == "block")


def test_a_block_and_the_groups_inside_it_are_exclusive() -> None:
    model, inputs, result = planned(stack, None)
    groups = result.groups
    block = next(g for g in groups if g.block == "layers.1")
    inner = next(g for g in groups if not g.block
                 and all(m.param.startswith("layers.1.") for m in g.members))
    outer = next(g for g in groups if not g.block and g.root != inner.root
                 and any(m.param.startswith("layers.1.") for m in g.members))   # the stream
    removal = {block.root: frozenset({0}), inner.root: frozenset({0}),
               outer.root: frozenset({1})}
    assert exclusive(groups, removal) == {block.root: frozenset({0}),
                                          outer.root: frozenset({1})}


def test_a_blocks_only_plan_keeps_one_block_of_each_run() -> None:
    module, inputs, result = planned(MODELS["llama"], "99% blocks")
    plan = result.section.plan
    layers = module.config.num_hidden_layers
    assert plan is not None and not plan.met and plan.units_removed == layers - 1
    assert [g.removed for g in result.section.groups if g.kind == "block"].count(1) == layers - 1
    assert all(g.removed == 0 for g in result.section.groups if g.kind != "block")
    assert result.module is not None and run(result.module, inputs) == run(module, inputs)


def test_every_surface_shows_the_blocks_grouped_and_the_plan_s_blocks(tmp_path: Any) -> None:
    from rich.console import Console

    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.analyzer.core.report import load_report
    from fxlens.analyzer.core.sections import Prune
    from fxlens.api import AnalysisOptions, analyze_loaded
    from fxlens.reports.html import render_html
    from fxlens.reports.markdown import render_markdown
    from fxlens.reports.terminal import render_terminal

    model, inputs = MODELS["llama"]()
    report = analyze_loaded(LoadedModel(model, inputs, "llama", "llama.py"),
                            AnalysisOptions(prune_target="30% blocks", fusion=False))
    (tmp_path / "report.json").write_text(report.to_json())
    back = load_report(tmp_path / "report.json")
    section = back.get(Prune)
    assert section is not None and section == report.get(Prune)
    assert [g.removed for g in section.groups if g.kind == "block"] in ([1, 0], [0, 1])
    console = Console(record=True, width=200)
    console.print(render_terminal(back, show=("prune",)))
    for text in (console.export_text(), render_markdown(back), render_html(back, None)):
        assert "model.layers.0–1" in text and "the whole block" in text
        assert "whole blocks only" in text and "whole blocks removed" in text


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_saved_decoder_without_its_first_layer_decodes_with_a_cache_as_without(
        name: str) -> None:
    # a layer left in place as a Skipped keeps an empty cache layer, and transformers reads
    # the cached length from layer 0: the next token's position would restart at 0
    module, inputs, result = planned(MODELS[name], None)
    first = next(g for g in result.groups if g.block)
    pruned = pruned_module(module, result.groups, {first.root: frozenset({0})},
                           knowledge()).eval()
    layers = module.config.num_hidden_layers
    assert pruned.config.num_hidden_layers == layers - 1
    assert module.config.num_hidden_layers == layers               # the original untouched
    assert [m.layer_idx for m in pruned.modules() if hasattr(m, "layer_idx")
            and isinstance(m.layer_idx, int)] == list(range(layers - 1))
    ids = inputs["input_ids"][:1, :5]
    with torch.no_grad():
        out = pruned(ids, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        cached = pruned(token, cache=out.past_key_values).logits[:, -1]
        whole = pruned(torch.cat([ids, token], 1), use_cache=False).logits[:, -1]
    torch.testing.assert_close(cached, whole, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_an_encoder_decoder_loses_a_decoder_layer_from_the_decoder_s_config_only() -> None:
    from tests.models import hf_zoo

    module, inputs, result = planned(hf_zoo.build_t5, None)
    block = next(g for g in result.groups if g.block.startswith("decoder."))
    pruned = pruned_module(module, result.groups, {block.root: frozenset({0})},
                           knowledge()).eval()
    assert (len(pruned.encoder.block), len(pruned.decoder.block)) == (2, 1)
    assert (pruned.encoder.config.num_layers, pruned.decoder.config.num_layers) == (2, 1)
    ids, start = inputs["input_ids"][:1], inputs["decoder_input_ids"][:1, :3]
    with torch.no_grad():
        out = pruned(input_ids=ids, decoder_input_ids=start, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        cached = pruned(input_ids=ids, decoder_input_ids=token,
                        cache=out.past_key_values).logits[:, -1]
        whole = pruned(input_ids=ids, decoder_input_ids=torch.cat([start, token], 1),
                       use_cache=False).logits[:, -1]
    torch.testing.assert_close(cached, whole, atol=1e-5, rtol=1e-4)


def test_without_real_weights_a_blocks_plan_takes_the_deepest_blocks_but_the_last() -> None:
    # the published finding for decoders: deeper layers, the final one aside, matter least
    def meta() -> tuple[nn.Module, tuple[torch.Tensor]]:
        with torch.device("meta"):
            return Stack(), (torch.randn(6, 8),)

    _, _, result = planned(meta, "40% blocks")        # two of the four blocks
    removed = [g.name for g in result.section.groups if g.kind == "block" and g.removed]
    assert sorted(removed) == ["layers.1", "layers.2"]
