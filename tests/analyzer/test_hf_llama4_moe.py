"""Llama 4's MoE layer captured as the routed experts a GPU run computes
(`fxlens.analyzer.capture.hf_llama4_moe`): the dense stand-in's values, each token through its
top-k experts only, and the class restored afterwards."""

from __future__ import annotations

import pytest
import torch
import transformers.models.llama4.modeling_llama4 as llama4

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.hf_llama4_moe import (
    grouped_experts,
    routed_forward,
    routed_llama4_experts,
)
from fxlens.analyzer.cost.engine import analyze
from fxlens.rules import load_rules
from tests.models.hf_zoo_hybrid import build_llama4


def with_top_k(top_k: int) -> tuple[torch.nn.Module, dict]:
    module, inputs = build_llama4()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2)
    for layer in module.modules():
        if isinstance(layer, llama4.Llama4Router):
            layer.top_k = top_k
    return module.eval(), inputs


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_routed_layer_computes_the_dense_layers_values(top_k: int) -> None:
    module, inputs = with_top_k(top_k)
    with torch.no_grad():
        dense = module(**inputs).logits
        with routed_llama4_experts():
            assert llama4.Llama4TextMoe.forward is routed_forward
            routed = module(**inputs).logits
    assert llama4.Llama4TextMoe.forward is not routed_forward      # restored
    assert llama4.Llama4TextExperts.forward is not grouped_experts
    torch.testing.assert_close(routed, dense, atol=1e-5, rtol=1e-5)


def test_a_captured_llama4_runs_each_tokens_top_k_experts_only() -> None:
    """Two grouped GEMMs over tokens × top-k rows, not two bmm over every expert's copy."""
    module, inputs = with_top_k(1)
    registry = load_rules()
    with torch.no_grad():
        graph = capture(module, inputs, registry)
    report = analyze(graph, registry, strict=True)
    experts = [n for n in report.nodes if n.module.endswith("feed_forward.experts")]
    assert not any(n.target.startswith("aten.bmm") for n in experts)
    grouped = [n for n in experts if n.target.startswith("aten._grouped_mm")]
    config = module.config
    rows = inputs["input_ids"].numel() * config.num_experts_per_tok     # every token, top-1
    hidden, width = config.hidden_size, config.intermediate_size
    assert len(grouped) == 2
    assert sum(n.flops for n in grouped) == 2 * rows * hidden * 2 * width \
        + 2 * rows * width * hidden
