"""The test zoo end to end: full coverage, FlopCounterMode agreement per packet, oracles.

Differential method: every matmul, convolution and attention node we captured is replayed
alone on meta tensors of its exact input specs under `FlopCounterMode`, and the sums per op
packet must equal ours — except for the packets in `KNOWN_DIVERGENCES`, each with its reason
and its own check against a closed form.

Eager oracle (`eager`): each model also runs eagerly on real tensors under `FlopCounterMode`,
with every SDPA call intercepted (`torch.nn.functional.scaled_dot_product_attention`): its
GEMM and convolution FLOPs outside attention must equal ours, and each attention call must be
counted causal exactly when the eager kernel did causal work (``is_causal=True`` and no
mask: a kernel handed a mask, even an exactly causal one, computes every score).
The zoo holds our own models, the transformers and diffusers architectures of
`tests.models.hf_zoo` and `tests.models.diffusers_zoo`, and three decoders given an
``attention_mask`` of ones (``+ones_mask``), as a tokenizer gives for an unpadded batch.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.hf_gdn import fused_delta_rules
from fxlens.analyzer.capture.hf_llama4_moe import routed_llama4_experts
from fxlens.analyzer.capture.hf_selective_scan import fused_selective_scans
from fxlens.analyzer.capture.hf_ssd import fused_ssd_scans
from fxlens.analyzer.core.aten import meta_tensor, resolve_op
from fxlens.analyzer.core.costs import OpCall
from fxlens.analyzer.core.graph import Graph, Node, TensorRef
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.fusion.kernels import analyze_fusion
from fxlens.rules import load_rules
from fxlens.rules.fusion import fusion_rules, kinds_of
from tests.attention_oracle import AttentionCalls
from tests.models import OWN_ZOO, tiny_gpt
from tests.models.diffusers_zoo import ZOO as DIFFUSERS_ZOO
from tests.models.hf_zoo import ZOO as HF_ZOO


def with_ones_mask(build: Callable[[], Any]) -> Callable[[], Any]:
    """`build` given ``attention_mask`` of ones, as a tokenizer gives for an unpadded batch:
    an eager transformers run drops it (``is_causal=True``), the graph reads it as an input."""
    def built() -> Any:
        module, inputs = build()
        return module, {**inputs, "attention_mask": torch.ones_like(inputs["input_ids"])}
    return built


ONES_MASK = ("llama", "gpt_neox", "mistral")
ZOO: dict[str, Callable[[], Any]] = {
    **OWN_ZOO, **{f"hf-{k}": v for k, v in HF_ZOO.items()},
    **{f"diffusers-{k}": v for k, v in DIFFUSERS_ZOO.items()},
    **{f"hf-{k}+ones_mask": with_ones_mask(HF_ZOO[k]) for k in ONES_MASK},
}

# Packets FlopCounterMode has formulas for, or that decompose into those when replayed.
REPLAYED = {
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear",
    "aten.convolution", "aten._convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d",
    "aten.conv_transpose1d", "aten.conv_transpose2d", "aten.conv_transpose3d",
}
ATTENTION = {
    "aten.scaled_dot_product_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_flash_attention",
}

KNOWN_DIVERGENCES = {
    "aten.scaled_dot_product_attention":
        "FlopCounterMode counts only the two GEMMs over the dense T_q×T_k square; we count the "
        "scores a fused kernel computes (about half when causal) and 8 FLOPs of softmax per "
        "score. On CPU it also sees the flash variant, which it counts as 0.",
    "aten._grouped_mm": "FlopCounterMode has no formula for grouped GEMMs (MoE experts): 0.",
    "transformers.grouped_mm_fallback":
        "a custom op: FlopCounterMode stops at it and counts 0 for the GEMMs inside.",
    "aten.lstm": "FlopCounterMode sees only the GEMMs of a decomposed LSTM, not the gate math.",
    "aten.gru": "FlopCounterMode sees only the GEMMs of a decomposed GRU, not the gate math.",
}


GROUPED_GEMMS = {"aten._grouped_mm", "transformers.grouped_mm_fallback"}


@dataclass(frozen=True)
class Eager:
    """What a real eager forward did: FlopCounterMode's GEMM and convolution FLOPs outside
    attention, and per SDPA call whether its kernel did causal work (``is_causal=True``, no
    mask) and whether it was handed an explicit mask that is exactly causal."""

    gemm_flops: int
    causal: tuple[bool, ...]
    masked_causal: tuple[bool, ...]


@functools.cache
def eager(name: str) -> Eager:
    module, inputs = ZOO[name]()
    calls = AttentionCalls()
    # Mamba's scans and gated delta rules as the GPU run calls them (kernels FlopCounterMode
    # has no formula for, as our graph holds them), not transformers' CPU references; Llama
    # 4's experts routed
    with (torch.no_grad(), FlopCounterMode(display=False) as counter, calls, fused_ssd_scans(),
          fused_delta_rules(), fused_selective_scans(), routed_llama4_experts()):
        module(*inputs) if isinstance(inputs, tuple) else module(**inputs)
    return Eager(counter.get_total_flops(), tuple(calls.causal), tuple(calls.masked_causal))


@functools.cache
def analysed(name: str) -> tuple[Graph, Report]:
    module, inputs = ZOO[name]()
    registry = load_rules()
    graph = capture(module, inputs, registry)
    return graph, analyze(graph, registry, name=name, strict=True)


def replay_flops(graph: Graph, node: Node) -> int:
    """FlopCounterMode's count for `node` alone, on meta tensors of its input specs."""
    op = resolve_op(node.target)

    def value(v: Any) -> Any:
        if isinstance(v, TensorRef):
            spec = graph.spec(v)
            return meta_tensor(spec) if spec is not None else None
        if isinstance(v, (list, tuple)):
            return type(v)(value(x) for x in v)
        return v

    args = {k: value(v) for k, v in node.args.items()}
    positional = [args[a.name] for a in op._schema.arguments if not a.kwarg_only]
    keywords = {a.name: args[a.name] for a in op._schema.arguments
                if a.kwarg_only and a.name in args}
    with FlopCounterMode(display=False) as counter:
        op(*positional, **keywords)
    return counter.get_total_flops()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_is_fully_covered_and_agrees_with_flop_counter(name: str) -> None:
    graph, report = analysed(name)
    assert report.coverage.unsupported == {}, report.coverage.unsupported
    assert report.coverage.failed == {}
    assert report.totals.flops > 0

    ours: Counter[str] = Counter()
    theirs: Counter[str] = Counter()
    for node, costed in zip(graph.calls(), report.nodes, strict=True):
        if node.packet in REPLAYED:
            ours[node.packet] += costed.flops
            theirs[node.packet] += replay_flops(graph, node)
    assert ours == theirs


def attention_nodes(graph: Graph, report: Report) -> list[tuple[Node, Any]]:
    return [(node, costed) for node, costed in zip(graph.calls(), report.nodes, strict=True)
            if node.packet in ATTENTION]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_attention_matches_its_closed_form(name: str) -> None:
    """The attention divergence, checked: ours = computed scores × (4·d + 8 for softmax), the
    scores causal exactly where the eager run's kernel was (`eager`), dense elsewhere."""
    graph, report = analysed(name)
    nodes = attention_nodes(graph, report)
    assert len(nodes) == len(eager(name).causal), "one attention node per eager SDPA call"
    for (node, costed), causal in zip(nodes, eager(name).causal, strict=True):
        q, k, v = (graph.spec(node.args[n]) for n in ("query", "key", "value"))
        assert q is not None and k is not None and v is not None
        *batch, t_q, d = q.shape
        t_k = k.shape[-2]
        heads = 1
        for size in batch:
            heads *= size
        scores = heads * (sum(min(i + 1, t_k) for i in range(t_q)) if causal else t_q * t_k)
        softmax = 1 + 1 + 4 + 1 + 1  # max, subtract, exp, sum, divide
        assert costed.flops == scores * (2 * d + 2 * v.shape[-1] + softmax), node.target
        dense = replay_flops(graph, node)
        assert dense in (0, heads * t_q * t_k * (2 * d + 2 * v.shape[-1])), (
            "FlopCounterMode counts the dense GEMMs or nothing (CPU flash variant)"
        )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_is_causal_finding_marks_the_calls_handed_a_causal_mask(name: str) -> None:
    """FUS009 on exactly the attention calls the eager run handed an exactly causal or a
    sliding-window mask."""
    graph, report = analysed(name)
    registry = load_rules()
    fusion = analyze_fusion(report, graph, kinds_of(list(graph.nodes), registry),
                            fusion_rules(registry), registry.lookup)
    flagged = {f.nodes[0] for f in fusion.findings if f.code == "FUS009"}
    nodes = attention_nodes(graph, report)
    assert [node.id in flagged for node, _ in nodes] == list(eager(name).masked_causal)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_attention_states_the_convention_it_applied(name: str) -> None:
    """Each attention node's cost says causal or dense, and agrees with its count."""
    graph, report = analysed(name)
    registry = load_rules()
    for (node, _), causal in zip(attention_nodes(graph, report), eager(name).causal, strict=True):
        rule = registry.lookup(node)
        assert callable(rule)
        note = rule(OpCall(node, graph)).note
        assert note.startswith("causal" if causal else "dense"), (node.target, note)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_gemms_match_flop_counter_on_the_eager_run(name: str) -> None:
    """Our matmul and convolution FLOPs outside attention and grouped GEMMs equal
    FlopCounterMode's on a real eager forward (which counts those GEMMs as 0)."""
    graph, report = analysed(name)
    registry = load_rules()
    ours = 0
    for node, costed in zip(graph.calls(), report.nodes, strict=True):
        rule = registry.lookup(node)
        module = getattr(rule, "__module__", "")
        if module in ("fxlens.rules.matmul", "fxlens.rules.conv") and \
                node.packet not in GROUPED_GEMMS:
            ours += costed.flops
        elif node.packet in RECURRENT:
            ours += recurrent_gemm_flops(graph, node)
    assert ours == eager(name).gemm_flops


# Whole-sequence RNN ops whose eager CPU run decomposes into addmm/mm, which FlopCounterMode
# counts. NB: eager CPU runs an LSTM as ``mkldnn_rnn_layer``, which it counts as 0, so the
# LSTM's GEMMs are left out of both sides (rules/rnn.py's own tests check them).
RECURRENT = {"aten.gru", "aten.rnn_tanh", "aten.rnn_relu"}


def recurrent_gemm_flops(graph: Graph, node: Node) -> int:
    """The GEMM part of a whole-sequence RNN op (the rest is gate math FlopCounterMode does
    not count): every 2-D weight applied once per token, 2·tokens·Σ numel(W)."""
    x = graph.spec(node.args["input"])
    assert x is not None
    weights = [graph.spec(r) for r in node.args["params"]]
    return 2 * (x.numel // x.shape[-1]) * sum(w.numel for w in weights
                                               if w is not None and len(w.shape) == 2)


MOE = {  # name: (config attribute of the expert width, of the top-k, MoE layers)
    "hf-mixtral": ("intermediate_size", "num_experts_per_tok", 2),
    "hf-qwen3_moe": ("moe_intermediate_size", "num_experts_per_tok", 2),
    "hf-deepseek_v3": ("moe_intermediate_size", "num_experts_per_tok", 1),
    "hf-jamba": ("intermediate_size", "num_experts_per_tok", 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MOE))
def test_moe_experts_count_only_the_routed_tokens(name: str) -> None:
    """Grouped expert GEMMs (FlopCounterMode: 0) against the closed form: each token runs
    top-k experts, each a gate + up (H → 2I) and a down (I → H) projection: 6·tokens·k·H·I."""
    graph, report = analysed(name)
    module, inputs = ZOO[name]()
    width, top_k, layers = MOE[name]
    config = module.config
    tokens = inputs["input_ids"].numel()
    expected = layers * 6 * tokens * getattr(config, top_k) * config.hidden_size * getattr(
        config, width)
    grouped = sum(c.flops for n, c in zip(graph.calls(), report.nodes, strict=True)
                  if n.packet in GROUPED_GEMMS)
    assert grouped == expected


def test_known_divergences_state_their_reasons() -> None:
    assert all(len(reason) > 30 for reason in KNOWN_DIVERGENCES.values())


def test_gpt_forward_flops_match_the_closed_form() -> None:
    sizes = {"batch": 2, "n_layer": 3, "n_head": 4, "d_model": 64, "seq_len": 16, "vocab": 96}
    module, inputs = tiny_gpt.build(**sizes)
    registry = load_rules()
    report = analyze(capture(module, inputs, registry), registry, strict=True)
    oracle = tiny_gpt.closed_form_flops(**sizes)
    linear = sum(n.flops for n in report.nodes if n.target == "aten.linear.default")
    attention = sum(n.flops for n in report.nodes if n.target.startswith(
        "aten.scaled_dot_product_attention"))
    assert linear == oracle.linear_flops
    assert attention == oracle.attention_flops + oracle.softmax_flops
    elementwise = report.totals.flops - linear - attention
    assert 0 < elementwise < 0.1 * report.totals.flops


def test_two_runs_give_identical_reports() -> None:
    first = analysed.__wrapped__("tiny_gpt")[1].to_json()
    assert analysed.__wrapped__("tiny_gpt")[1].to_json() == first


@pytest.mark.slow
def test_analyzing_a_moe_leaves_stderr_clean(tmp_path: Any, capfd: pytest.CaptureFixture
                                              ) -> None:
    """The tiny Mixtral's float32 experts go through ``torch._grouped_mm``, whose fake kernel
    accepted only bfloat16 (torch logged an ERROR traceback, then we reran on real tensors):
    a whole analysis now prints no warning, error or traceback."""
    from fxlens.cli.main import main

    code = main(["tests.models.hf_zoo:build_mixtral", "--out", str(tmp_path), "--quiet"])
    err = capfd.readouterr().err
    assert code == 0
    assert not re.search(r"WARNING|ERROR|Traceback|^[EW]\d{4} ", err, re.MULTILINE), err


CAUSAL_DECODERS = ["hf-gpt_neox", "hf-opt", "hf-phi3", "hf-qwen3_moe", "hf-llava", "hf-llama",
                   "hf-llama+ones_mask"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CAUSAL_DECODERS)
def test_attention_flops_do_not_depend_on_the_capture_method(name: str) -> None:
    """Export and make_fx see a materialised mask, the recording may see ``is_causal=True``:
    the attention FLOPs are the same on every path."""
    registry = load_rules()
    per_method = []
    for method in ("export", "make_fx", "record"):
        module, inputs = ZOO[name]()
        graph = capture(module, inputs, registry, methods=(method,))
        report = analyze(graph, registry, strict=True)
        per_method.append(sum(c.flops for n, c in zip(graph.calls(), report.nodes, strict=True)
                              if n.packet in ATTENTION))
    assert len(set(per_method)) == 1 and per_method[0] > 0, per_method
