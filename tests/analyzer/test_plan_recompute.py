"""Selective recompute (``ckpt=norm+act``, ``ckpt=core_attn``, globs) against closed forms on
tests/models/tiny_gpt.py (b = 2, s = 16, h = 64, 2 blocks, AMP bf16): Korthikanti et al.
2022's per-layer terms say what each recomputed module frees — the GELU's output 8·sbh bytes
(4h wide, bf16), each LayerNorm's output 2·sbh (the bf16 copy autocast makes for the next
Linear belongs to the norm) — and the recompute costs those modules' forward seconds."""

from __future__ import annotations

import pytest

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.plan.recompute import recomputed
from fxlens.analyzer.plan.search import misfits
from fxlens.analyzer.plan.strategy import parse
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.analyzer.plan.workload import ModulePart
from tests.analyzer.test_plan import BF16, B, H, S, layout

SBH = B * S * H
Facts = tuple[Report, ModelFacts]


def blocks(facts: ModelFacts) -> list:
    return [u for u in facts.units if u.name not in ("pre", "post")]


def test_each_kind_picks_its_modules(gpt: Facts) -> None:
    _, facts = gpt
    block = blocks(facts)[0]
    picked = {kind: sorted(p.name[len(block.name) + 1:]
                           for p in recomputed(block.name, block.parts, (kind,)))
              for kind in ("norm", "act", "mlp", "core_attn", "attn", "attn.q*", "mlp.0")}
    assert picked == {"norm": ["ln1", "ln2"], "act": ["mlp.1"],
                      "mlp": ["mlp.0", "mlp.1", "mlp.2"], "core_attn": ["attn"],
                      "attn": ["attn", "attn.proj", "attn.qkv"], "attn.q*": ["attn.qkv"],
                      "mlp.0": ["mlp.0"]}


def test_a_models_own_prefix_does_not_make_a_module_a_moe() -> None:
    """Qwen3-MoE names every class ``Qwen3Moe…``: its norms are norms, and ``moe`` (and the
    CUDA graph scopes ``moe_router``, ``moe_preprocess``) pick the MoE block's modules only."""
    family = "transformers.models.qwen3_moe.modeling_qwen3_moe."
    layer = family + "qwen3moesparsemoeblock"
    parts = [ModulePart(f"b.{name}", types=tuple(family + t for t in types)) for name, types in (
        ("input_layernorm", ("qwen3moermsnorm",)),
        ("self_attn", ("qwen3moeattention",)),
        ("mlp", ("qwen3moesparsemoeblock",)),
        ("mlp.gate", ("qwen3moesparsemoeblock", "qwen3moetopkrouter")),
        ("mlp.experts", ("qwen3moesparsemoeblock", "qwen3moeexperts")))]
    assert layer.endswith("moeblock")

    def picked(kind: str) -> list[str]:
        return [p.name[2:] for p in recomputed("b", parts, (kind,))]

    assert picked("moe") == ["mlp", "mlp.gate", "mlp.experts"]
    assert picked("norm") == ["input_layernorm"]
    assert picked("moe_router") == ["mlp.gate"]
    assert picked("moe_preprocess") == ["mlp"]
    assert picked("attn") == ["self_attn"]


def test_a_router_is_a_router_whatever_its_moe_module_is_called() -> None:
    """gpt-oss's MoE module is a ``GptOssMLP`` with a ``router``; Mixtral's and DeepSeek's a
    ``gate``: ``moe_router`` (a CUDA graph scope) picks each, not a dense MLP's ``gate_proj``."""
    gpt_oss = "transformers.models.gpt_oss.modeling_gpt_oss."
    mixtral = "transformers.models.mixtral.modeling_mixtral."
    parts = [ModulePart(f"b.{name}", types=types) for name, types in (
        ("mlp.router", (gpt_oss + "gptossmlp", gpt_oss + "gptosstopkrouter")),
        ("block_sparse_moe.gate", (mixtral + "mixtralsparsemoeblock", "torch.nn.linear")),
        ("dense.gate_proj", ("x.mlp", "torch.nn.linear")),
        ("dense.gate", ("x.mlp", "torch.nn.linear")))]
    assert [p.name[2:] for p in recomputed("b", parts, ("moe_router",))] == [
        "mlp.router", "block_sparse_moe.gate"]


def test_a_linear_attention_mixer_is_attention() -> None:
    """Qwen3-Next's gated DeltaNet (``linear_attn``) is the layer's self-attention as
    Megatron-core runs it: ``attn`` (recompute, and the CUDA graph scope) takes it with its
    projections, not the MoE beside it."""
    family = "transformers.models.qwen3_next.modeling_qwen3_next."
    parts = [ModulePart(f"b.{name}", types=tuple(family + t for t in types)) for name, types in (
        ("linear_attn", ("qwen3nextgateddeltanet",)),
        ("linear_attn.in_proj_qkvz", ("qwen3nextgateddeltanet", "torch.nn.linear")),
        ("linear_attn.norm", ("qwen3nextgateddeltanet", "qwen3nextrmsnormgated")),
        ("mlp", ("qwen3nextsparsemoeblock",)))]
    assert [p.name[2:] for p in recomputed("b", parts, ("attn",))] == [
        "linear_attn", "linear_attn.in_proj_qkvz", "linear_attn.norm"]


@pytest.mark.parametrize("kind, freed_per_block", [
    ("act", 4 * SBH * BF16),                   # the GELU's output, 4h wide
    ("norm", 2 * SBH * BF16),                  # two norms' outputs at least (+ statistics)
])
def test_selective_recompute_frees_what_the_modules_saved(gpt: Facts, kind: str,
                                                          freed_per_block: int) -> None:
    """One stage, one micro-batch in flight: all blocks' freed bytes leave, one block's
    come back while its backward recomputes them."""
    _, facts = gpt
    n = len(blocks(facts))
    none = layout(facts, "dp=2", 2).memory.activations_bytes
    selective = layout(facts, f"dp=2,ckpt={kind}", 2).memory.activations_bytes
    freed = [sum(p.saved_split_bytes + p.saved_whole_bytes
                 for p in recomputed(u.name, u.parts, (kind,))) for u in blocks(facts)]
    assert none - selective == pytest.approx(sum(freed) - max(freed), abs=2)
    assert all(f >= freed_per_block for f in freed)
    if kind == "act":
        assert freed == [freed_per_block] * n


def test_selective_recompute_costs_the_modules_forward(gpt: Facts) -> None:
    _, facts = gpt
    gelu: list[ModulePart] = [p for u in blocks(facts) for p in recomputed(u.name, u.parts,
                                                                          ("act",))]
    assert gelu and all(p.forward_split_s + p.forward_whole_s > 0 for p in gelu)
    extra = (layout(facts, "dp=2,ckpt=act", 2, m=3).time.compute_s
             - layout(facts, "dp=2", 2, m=3).time.compute_s)
    assert extra == pytest.approx(3 * sum(p.forward_split_s + p.forward_whole_s for p in gelu))
    full = layout(facts, "dp=2,ckpt", 2).memory.activations_bytes
    assert layout(facts, "dp=2,ckpt=act", 2).memory.activations_bytes > full


def test_a_pattern_that_recomputes_nothing_names_the_blocks_modules(gpt: Facts) -> None:
    _, facts = gpt
    (problem,) = misfits(facts, parse("dp=2,ckpt=moe", None))
    assert "ckpt=moe recomputes no module" in problem and "ln1" in problem
    assert misfits(facts, parse("dp=2,ckpt=norm+act", None)) == []


@pytest.mark.parametrize("text, says", [
    ("dp=2,ckpt,ckpt=norm", "exclude each other"),
    ("dp=2,ckpt=norm,ckpt=act", "ckpt is given twice"),
    ("dp=2,ckpt=+", "ckpt= needs full"),
])
def test_selective_recompute_text(text: str, says: str) -> None:
    assert parse("dp=2,ckpt=norm+moe_act", None).recompute == ("norm", "moe_act")
    with pytest.raises(ValueError, match=says):
        parse(text, None)
