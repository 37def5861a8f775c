"""Saved activations as fused kernels keep them (`--plan --fused`, `fused_saved`), on the
`transformers` Llama of tests/models/hf_zoo.py under AMP bf16: the SiLU's output is recomputed
from the gate's (nothing saved for it), a norm feeding GEMMs keeps only its bf16 output (its
float32 internals recomputed from the residual), attention saves what the eager step's does
(SDPA with is_causal and grouped-query K/V un-repeated: no mask, no copies), and nothing is
ever saved that the eager step did not have room for."""

from __future__ import annotations

import pytest

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.plan.workload import ModulePart
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.plan_pass import plan_facts
from fxlens.rules.hardware import device

pytestmark = pytest.mark.slow
BF16 = 2


def llama_facts(fused: bool) -> tuple[ModelFacts, int, int, int]:
    from tests.models.hf_zoo import ZOO

    module, inputs = ZOO["llama"]()
    options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=2, device="h100",
                              precision="amp-bf16", fused=fused)
    ctx = Context(LoadedModel(module, inputs, "llama", "llama"), options, lambda _: None)
    tokens = inputs["input_ids"].numel()
    config = module.config
    return (plan_facts(ctx, run_context(ctx), device("h100")), tokens, config.hidden_size,
            config.intermediate_size)


@pytest.fixture(scope="module")
def both() -> tuple[tuple[ModelFacts, int, int, int], ModelFacts]:
    return llama_facts(True), llama_facts(False)[0]


def part(unit: Unit, suffix: str) -> ModulePart:
    (found,) = [p for p in unit.parts if p.name == f"{unit.name}.{suffix}"]
    return found


def saved(p: Unit | ModulePart) -> int:
    return p.saved_split_bytes + p.saved_whole_bytes


def test_fused_kernels_save_gemm_inputs_not_pointwise_intermediates(both) -> None:  # noqa: ANN001
    (fused, tokens, hidden, ffn), eager = both
    f_block = [u for u in fused.units if u.name not in ("pre", "post")][-1]
    e_block = [u for u in eager.units if u.name == f_block.name][0]
    assert saved(part(e_block, "mlp.act_fn")) == tokens * ffn * BF16
    assert saved(part(f_block, "mlp.act_fn")) == 0
    assert saved(part(f_block, "post_attention_layernorm")) == tokens * hidden * BF16
    assert saved(part(e_block, "post_attention_layernorm")) > tokens * hidden * BF16
    assert saved(part(f_block, "self_attn")) == saved(part(e_block, "self_attn"))
    for unit in fused.units:
        twin = [u for u in eager.units if u.name == unit.name][0]
        assert saved(unit) <= saved(twin)
    assert 0 < sum(saved(u) for u in fused.units) < sum(saved(u) for u in eager.units)


@pytest.mark.parametrize("name, width", [("qwen3_moe", "moe_intermediate_size"),
                                         ("gpt_oss", "intermediate_size")])
def test_the_experts_activation_is_one_part_holding_the_down_projections_input(
        name: str, width: str) -> None:
    """A MoE layer's activation (Qwen3's ``act_fn`` module and the product with the up
    projection; GPT-OSS's inline clamped SwiGLU, no module) is the part
    ``mlp.experts.act_fn``: fused, it saves the down projection's input, one row per routed
    token (bf16), which Megatron's ``moe_act`` recompute drops; the experts keep the rest."""
    from fxlens.analyzer.plan.recompute import recomputed_parts
    from tests.models.hf_zoo import ZOO

    module, inputs = ZOO[name]()
    options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=2, device="h100",
                              precision="amp-bf16", fused=True)
    ctx = Context(LoadedModel(module, inputs, name, name), options, lambda _: None)
    facts = plan_facts(ctx, run_context(ctx), device("h100"))
    block = [u for u in facts.units if u.name not in ("pre", "post")][-1]
    activation = part(block, "mlp.experts.act_fn")
    assert saved(activation) == block.routed_rows * getattr(module.config, width) * BF16
    assert recomputed_parts(block, ["moe_act"]) == (activation,)
    assert saved(part(block, "mlp.experts")) > 0
