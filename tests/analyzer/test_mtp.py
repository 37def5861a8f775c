"""``--mtp N``: multi-token prediction depths trained beside a causal LM
(`fxlens.analyzer.capture.mtp`), against published parameter counts and closed-form FLOPs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from torch import nn

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.capture.mtp import declared_depths, mtp_attached, untrained_note
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Training
from fxlens.checks import MAX_MTP_DEPTHS, check_options
from fxlens.pipeline import AnalysisOptions, Context, run_context

# a small Llama: every closed form below at a size that records in a second
TINY = {"num_hidden_layers": "2", "hidden_size": "256", "intermediate_size": "512",
        "num_attention_heads": "4", "num_key_value_heads": "2", "vocab_size": "1024"}
TOKENS = 64


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def hooks_of(module: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def test_nemotron_3_super_gains_its_published_mtp_layer_and_is_left_as_it_was() -> None:
    # Megatron-Bridge's verification card counts 123,611,033,088 elements in Nemotron-3
    # Super's BF16 checkpoint: the main model (120,668,687,360, tests/analyzer/test_hf.py),
    # 41 fp32 router biases × 512 and the MTP layer's 2,942,324,736 (attention + LatentMoE,
    # eh_proj, norms), the layer kinds its config's mtp_layers_block_type lists
    module = load_preset("nemotron-3-super-120b-a12b", allow_large=True).module
    before, hooks = n_params(module), hooks_of(module)
    with mtp_attached(module, 1) as model:
        assert n_params(model) - before == 2_942_324_736
        assert [layer.block_type for layer in model.mtp[0].layers] == ["full_attention", "moe"]
    assert n_params(module) == before and hooks_of(module) == hooks
    assert not hasattr(module, "mtp")


@pytest.mark.parametrize(("preset", "overrides", "decoder", "norm"), [
    ("deepseek-v3", {"num_hidden_layers": "2", "first_k_dense_replace": "1"}, "model", "norm"),
    ("gpt2", {"n_layer": "2"}, "transformer", "ln_f"),
])
def test_a_depth_is_the_last_layer_the_projection_and_three_norms(
        preset: str, overrides: dict[str, str], decoder: str, norm: str) -> None:
    # each depth owns two input norms, the 2h→h projection, a decoder layer of the model's
    # last kind (DeepSeek-V3: MoE) and its output norm; the embedding and the head stay the
    # model's (GPT-2's layers are .h, its final norm a LayerNorm with a bias: .ln_f)
    module = load_preset(preset, overrides, allow_large=True).module
    body = getattr(module, decoder)
    layers = body.layers if hasattr(body, "layers") else body.h
    h = module.config.hidden_size
    before = n_params(module)
    with mtp_attached(module, 3) as model:
        per_depth = n_params(layers[-1]) + 2 * h * h + 3 * n_params(getattr(body, norm))
        assert n_params(model) - before == 3 * per_depth
    with mtp_attached(module, 3, shared=True) as model:
        assert len(model.mtp) == 1 and n_params(model) - before == per_depth


@dataclass(frozen=True)
class Step:
    graph: Graph
    report: Report

    def forward_flops(self, prefix: str = "") -> int:
        return sum(n.flops for n in self.report.nodes if n.phase == "forward"
                   and (self.graph.nodes[n.id].module or "").startswith(prefix))

    @property
    def recipe(self) -> str:
        return self.report.require(Training).recipe


def step(mtp: int = 0, shared: bool = False) -> Step:
    loaded = load_preset("llama-3.1-8b", TINY, 1, TOKENS, dtype="bfloat16")
    ctx = Context(loaded, AnalysisOptions(train=True, mtp=mtp, mtp_shared=shared,
                                          fusion=False), lambda _: None)
    report = run_context(ctx)
    assert ctx.step is not None
    return Step(ctx.step.graph, report)


def test_a_depth_costs_a_layer_a_projection_and_the_head() -> None:
    plain, one = step(), step(1)
    h, vocab = int(TINY["hidden_size"]), int(TINY["vocab_size"])
    layer = plain.forward_flops("model.layers.1")
    assert one.forward_flops("mtp.0.layers.0") == layer
    assert one.forward_flops("mtp.0.projection") == 2 * TOKENS * (2 * h) * h
    head = 2 * TOKENS * h * vocab
    rest = one.forward_flops() - plain.forward_flops() - layer - 2 * TOKENS * 2 * h * h
    assert head <= rest <= 1.05 * head       # the head's GEMM, then its loss's softmax
    assert one.recipe.endswith(" · +1 MTP depth")


def test_shared_depths_run_one_depths_weights_again() -> None:
    plain, one, two = step(), step(1), step(2, shared=True)
    extra = one.forward_flops() - plain.forward_flops()
    assert two.forward_flops() - plain.forward_flops() == pytest.approx(2 * extra, rel=1e-3)
    weights = {p.name for p in two.graph.params if p.name.startswith("mtp.")}
    assert weights and all(name.startswith("mtp.0.") for name in weights)
    assert two.recipe.endswith("+2 MTP depths (one depth's weights)")


@pytest.mark.parametrize(("settings", "says"), [
    ({"train": True, "mtp": -1}, "1 to"),
    ({"train": True, "mtp": MAX_MTP_DEPTHS + 1}, "1 to"),
    ({"train": True, "mtp": True}, "1 to"),
    ({"mtp": 1}, "add --train"),
    ({"train": True, "mtp_shared": True}, "add --mtp N"),
])
def test_mtp_options_that_cannot_work_are_refused(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(LoadError, match=says):
        check_options(AnalysisOptions(**settings))


def test_mtp_with_a_plan_is_accepted() -> None:
    check_options(AnalysisOptions(train=True, plan=True, mtp=2, mtp_shared=True))


def test_a_model_that_is_no_causal_lm_is_refused_in_user_terms() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(LoadError, match="needs a transformers causal LM"), \
            mtp_attached(model, 1):
        pass
    assert [name for name, _ in model.named_children()] == ["0"]


def test_a_sweep_passes_mtp_on_and_checks_it_before_any_point() -> None:
    from fxlens.cli.sweep import build_parser, points_and_spec
    from fxlens.sweep import Point, SweepSpec

    options = SweepSpec(train=True, mtp=2, mtp_shared=True).options(Point("hf:gpt2"))
    assert (options.mtp, options.mtp_shared) == (2, True)
    args = build_parser().parse_args(["hf:gpt2", "--mtp", "2"])
    with pytest.raises(LoadError, match="add --train"):
        points_and_spec(args)


def test_a_step_without_labels_is_refused_before_its_capture() -> None:
    loaded = replace(load_preset("llama-3.1-8b", TINY, 1, TOKENS), training_inputs=None)
    with pytest.raises(LoadError, match="input_ids and labels"):
        run_context(Context(loaded, AnalysisOptions(train=True, mtp=1, fusion=False),
                            lambda _: None))


@pytest.mark.parametrize(("preset", "declared"), [
    ("deepseek-v3", 1), ("kimi-k2", 0), ("nemotron-3-super-120b-a12b", 1),
    ("nemotron-3-nano-30b-a3b", 0), ("llama-3.1-8b", 0)])
def test_the_mtp_layers_a_config_declares_are_read_as_published(preset: str,
                                                                 declared: int) -> None:
    # config.json as published: DeepSeek-V3 and Nemotron-3 Super num_nextn_predict_layers 1;
    # Kimi K2 0 (moonshotai/Kimi-K2-Instruct); Nemotron-3 Nano 0; Llama none
    assert declared_depths(load_preset(preset, allow_large=True).module) == declared


def test_a_step_that_leaves_the_declared_mtp_out_says_so_on_its_first_screen() -> None:
    loaded = load_preset("llama-3.1-8b", TINY, 1, TOKENS, dtype="bfloat16")
    loaded.module.config.num_nextn_predict_layers = 2
    for mtp, said in ((0, True), (2, False)):
        report = run_context(Context(loaded, AnalysisOptions(train=True, mtp=mtp, fusion=False),
                                     lambda _: None))
        notes = [n for n in report.model.capture_notes if "multi-token prediction" in n]
        assert bool(notes) == said
    assert notes == [] and untrained_note(loaded.module, 0) == (
        "the config declares 2 multi-token prediction layers, which transformers does not "
        "build: not in this step (--mtp 2 trains them beside the LM)")
