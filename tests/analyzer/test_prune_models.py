"""Structured pruning on 16 models (issue 33), and a blocks-only plan on six: the plan's pruned
module, written and read back as ``--prune-save`` does, runs, keeps its outputs' shapes and the
planned parameter count, and FlopCounterMode on its eager run counts exactly the FLOPs the plan
predicted in the ops it counts (GEMMs and convolutions; it counts 0 for elementwise ops and the
CPU flash-attention kernel, design.md's known divergences); capturing it again gives the plan's
total FLOPs.

The models: our MLP, conv net (grouped, depthwise and transposed convs), tiny GPT, a concat of
two conv branches; from `transformers`: Llama and Qwen2 (GQA), GPT-2 (fused QKV in Conv1D),
BERT, DistilBERT, ViT (patch embedding, CLS token), ResNet (basic and bottleneck blocks),
MobileNetV2 (inverted residuals, depthwise, TF padding), ConvNeXt (depthwise 7 × 7, layer
norm, layer scale), RegNetY (grouped convs, squeeze-excite), EfficientNet (depthwise,
squeeze-excite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.prune.module import run
from fxlens.analyzer.prune.section import PruneResult
from fxlens.rules import load_rules
from tests.analyzer.prune_models import (
    MODELS,
    eager_gemm_flops,
    planned,
    predicted_gemm_flops,
)

# the fast run keeps our four and one GQA decoder and the ViT; the other `transformers` models
# take 1-5 s each on 2 cores and run in the full suite
FAST = {"mlp", "concat", "convnet", "tiny_gpt"}


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(MODELS)])
def test_the_saved_pruned_module_runs_and_costs_what_the_plan_predicted(
        name: str, tmp_path: Path) -> None:
    module, inputs, result = planned(MODELS[name])
    plan = result.section.plan
    assert plan is not None and plan.met and plan.params_after < plan.params_before
    saved_runs_as_planned(module, inputs, result, tmp_path)


def saved_runs_as_planned(module: Any, inputs: Any, result: PruneResult,
                          tmp_path: Path) -> None:
    """The saved pruned module runs, keeps the output shapes, holds the planned parameters and
    costs exactly the planned FLOPs (FlopCounterMode's GEMMs, and fxlens's own count)."""
    plan, shrunk = result.section.plan, result.shrunk
    assert plan is not None and result.module is not None and shrunk is not None
    torch.save(result.module, tmp_path / "pruned.pt")
    pruned = torch.load(tmp_path / "pruned.pt", weights_only=False)
    assert run(pruned, inputs) == run(module, inputs)
    assert sum(p.numel() for p in pruned.parameters()) == plan.params_after
    predicted = predicted_gemm_flops(shrunk)
    assert eager_gemm_flops(pruned, inputs) == predicted < eager_gemm_flops(module, inputs)
    registry = load_rules()
    assert analyze(capture(pruned, inputs, registry), registry).totals.flops == plan.flops_after


# whole residual blocks (tests/analyzer/test_prune_blocks.py): a GQA decoder, GPT-2, BERT, a
# ResNet of basic blocks (stage 0, identity shortcut) and one of bottlenecks (a nested block
# beside a projection one); the HF ResNet's single block cannot meet 30 %, the plan stops there
BLOCKS = {"llama": False, "gpt2": True, "resnet_bottleneck": False, "bert": False,
          "resnet": False, "tiny_gpt": True}


@pytest.mark.parametrize("name", [n if fast else pytest.param(n, marks=pytest.mark.slow)
                                  for n, fast in BLOCKS.items()])
def test_a_blocks_only_plan_saves_a_module_costing_what_it_predicted(
        name: str, tmp_path: Path) -> None:
    module, inputs, result = planned(MODELS[name], "30% blocks")
    plan = result.section.plan
    assert plan is not None
    gone = [g for g in result.section.groups if g.removed]
    assert gone and all(g.kind == "block" for g in gone) and plan.units_removed == len(gone)
    assert plan.params_before - plan.params_after == sum(g.params_per_unit for g in gone)
    saved_runs_as_planned(module, inputs, result, tmp_path)
