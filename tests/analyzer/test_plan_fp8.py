"""fp8 training's scaling in the plan: every GEMM of the repeated blocks that reads a weight
first quantizes its other operand (the forward's activation, the backward's output gradient),
6 bytes per element under current scaling; so for a model of Linears the plan's seconds grow
by 6 · tokens · Σ(in + out features) bytes over the device's bandwidth, summed over the
blocks' Linears (the LM head stays bf16, as Megatron-core and torchtitan run it)."""

from __future__ import annotations

import pytest
import torch

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.plan import fp8
from fxlens.analyzer.plan.structure import Unit
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.plan_pass import plan_facts
from fxlens.rules.hardware import device

pytestmark = pytest.mark.slow


def plan_units(module: torch.nn.Module, inputs: dict, precision: str) -> list[Unit]:
    options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=2, device="h100",
                              precision=precision)
    ctx = Context(LoadedModel(module, inputs, "llama", "llama"), options, lambda _: None)
    return list(plan_facts(ctx, run_context(ctx), device("h100")).units)


def seconds(units: list[Unit]) -> float:
    return sum(u.forward_split_s + u.forward_whole_s + u.backward_split_s + u.backward_whole_s
               for u in units)


def step_seconds(module: torch.nn.Module, inputs: dict) -> float:
    return seconds(plan_units(module, inputs, "fp8"))


def post_seconds(module: torch.nn.Module, inputs: dict, precision: str) -> float:
    """The seconds of what runs after the blocks (the final norm, the LM head, the loss)."""
    post = [u for u in plan_units(module, inputs, precision) if u.name == "post"]
    assert len(post) == 1
    return seconds(post)


def test_each_weight_gemm_pays_for_quantizing_its_other_operand(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.models.hf_zoo import ZOO

    module, inputs = ZOO["llama"]()
    with_scaling = step_seconds(module, inputs)
    monkeypatch.setattr(fp8, "SCALING_BYTES_PER_ELEMENT", 0)
    without = step_seconds(module, inputs)
    tokens = inputs["input_ids"].numel()
    features = sum(m.in_features + m.out_features for name, m in module.named_modules()
                   if isinstance(m, torch.nn.Linear) and name.startswith("model.layers."))
    expected = 6 * tokens * features / device("h100").achievable_bandwidth
    assert with_scaling - without == pytest.approx(expected, rel=1e-6)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x))).sum()


def saved_bytes(precision: str, tokens: int) -> int:
    options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=2, device="h100",
                              precision=precision, fused=True)
    ctx = Context(LoadedModel(_Mlp(), (torch.randn(tokens, 64),), "mlp", "mlp"), options,
                  lambda _: None)
    return sum(u.saved_bytes for u in plan_facts(ctx, run_context(ctx), device("h100")).units)


def test_a_gemm_only_input_is_saved_as_its_fp8_copy() -> None:
    """Fused, the GELU's input stays bf16 (its backward reads it) and its output, read only by
    the down projection, is kept as the fp8 copy the weight-gradient GEMM reads: one byte per
    element instead of two, 256 bytes less per token."""
    tokens = 512
    bf16 = saved_bytes("amp-bf16", tokens)
    assert bf16 == tokens * (256 + 256) * 2
    assert bf16 - saved_bytes("fp8", tokens) == tokens * 256


def test_the_lm_head_stays_bf16() -> None:
    """What runs after the blocks takes the same time in an fp8 plan as in a bf16 one: the
    LM head is not an fp8 GEMM and pays no scaling."""
    from tests.models.hf_zoo import ZOO

    module, inputs = ZOO["llama"]()
    assert post_seconds(module, inputs, "fp8") == pytest.approx(
        post_seconds(module, inputs, "amp-bf16"), rel=1e-12)


def test_fp8_gemms_are_the_blocks_gemms_or_every_one_without_blocks() -> None:
    from fxlens.analyzer.core.graph import repeated_blocks
    from fxlens.rules.parallel import PARALLEL
    from tests.models.hf_zoo import ZOO

    gemm_ops = PARALLEL.gemm_ops | PARALLEL.grouped_gemm_ops
    for module, inputs in (ZOO["llama"](), (_Mlp(), (torch.randn(8, 64),))):
        options = AnalysisOptions(train=True)
        ctx = Context(LoadedModel(module, inputs, "m", "m"), options, lambda _: None)
        run_context(ctx)
        assert ctx.step is not None
        graph = ctx.step.graph
        gemms = [n for n in graph.calls() if n.packet in gemm_ops]
        chosen = set(fp8.fp8_gemms(graph, gemm_ops))
        blocks = repeated_blocks(graph.module_types)
        if not blocks:                     # the MLP: every GEMM
            assert chosen == {n.id for n in gemms} and chosen
            continue
        outside = {n.id for n in gemms if n.module == "lm_head"}
        assert outside and not outside & chosen
        assert chosen == {n.id for n in gemms} - outside
