"""``ckpt=ops`` (torchtitan's op-level selective checkpointing) against closed forms on the
zoo's Llama (`tests.models.hf_zoo.build_llama`: b = 2, s = 12, hidden 64, 4 query and 2 KV
heads of 16, MLP 128, 2 blocks, AMP bf16).

Per block the policy saves the outputs of the 1st, 3rd, 5th and 7th matmul of the forward
(q_proj, v_proj, gate_proj, down_proj: k_proj, o_proj and up_proj are recomputed) and of the
attention kernel (its output and its float32 log-sum-exp); eager PyTorch keeps all of them,
a compiled step drops the down-projection's, which only the residual addition reads. The
recompute is the block's forward less those ops."""

from __future__ import annotations

import pytest

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.op_policy import must_save
from fxlens.analyzer.plan.strategy import Strategy, parse
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.time.roofline import node_times
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.plan_pass import plan_facts
from fxlens.rules.hardware import device
from fxlens.rules.parallel import PARALLEL

B, S, HIDDEN, KV, MLP, HEADS = 2, 12, 64, 32, 128, 4
BF16, FP32 = 2, 4
H100 = device("h100")


def llama(fused: bool) -> tuple[Context, ModelFacts]:
    from tests.models.hf_zoo import build_llama

    module, inputs = build_llama()
    options = AnalysisOptions(train=True, precision="amp-bf16", plan=True, strategy="ddp",
                              gpus=2, fused=fused)
    ctx = Context(LoadedModel(module, inputs, "llama", "llama"), options, lambda _: None)
    return ctx, plan_facts(ctx, run_context(ctx), H100)


@pytest.fixture(scope="module")
def eager() -> tuple[Context, ModelFacts]:
    return llama(fused=False)


@pytest.fixture(scope="module")
def compiled() -> tuple[Context, ModelFacts]:
    return llama(fused=True)


def blocks(facts: ModelFacts) -> list[Unit]:
    return [u for u in facts.units if u.name not in ("pre", "post")]


def kept_bytes(compiled: bool) -> int:
    """Per block: q, v, gate and (eager) down outputs, the attention output and statistics."""
    q, v, gate, down = B * S * HIDDEN, B * S * KV, B * S * MLP, B * S * HIDDEN
    attention = B * S * HIDDEN * BF16 + B * HEADS * S * FP32
    return (q + v + gate + (0 if compiled else down)) * BF16 + attention


def test_the_policy_saves_every_second_matmul_and_the_attention(eager) -> None:
    ctx, facts = eager
    graph = ctx.step.graph
    block = blocks(facts)[0].name
    forward = [n.id for n in graph.calls() if n.phase == "forward"
               and (n.module == block or n.module.startswith(block + "."))]
    saved = [graph.nodes[i].module[len(block) + 1:] for i in must_save(graph, forward, PARALLEL)]
    assert saved == ["self_attn.q_proj", "self_attn.v_proj", "self_attn", "mlp.gate_proj",
                     "mlp.down_proj"]


@pytest.mark.parametrize("fixture, is_compiled", [("eager", False), ("compiled", True)])
def test_each_block_keeps_its_input_and_the_saved_outputs(request, fixture: str,
                                                          is_compiled: bool) -> None:
    """One GPU, one micro-batch: ckpt=ops holds what full recompute holds plus the policy's
    outputs of every block."""
    _, facts = request.getfixturevalue(fixture)
    for block in blocks(facts):
        policy = block.op_policy
        assert policy.saved_split_bytes + policy.saved_whole_bytes == kept_bytes(is_compiled)
    full = estimate(facts, parse("dp=2,ckpt"), H100).memory.activations_bytes
    ops = estimate(facts, parse("dp=2,ckpt=ops"), H100).memory.activations_bytes
    assert ops - full == pytest.approx(len(blocks(facts)) * kept_bytes(is_compiled), abs=2)
    assert ops < estimate(facts, parse("dp=2"), H100).memory.activations_bytes


def test_the_recompute_is_the_forward_less_the_saved_ops(eager) -> None:
    """Full recompute runs every block's forward again; ckpt=ops all of it but the matmuls
    and attention it saved, whose roofline seconds are the difference."""
    ctx, facts = eager
    report, graph = run_context(ctx), ctx.step.graph
    seconds = {t.id: t.time_s for t in node_times(report, graph, H100)}
    m = 3
    full = estimate(facts, parse("dp=2,ckpt", None, m), H100).time.recompute_s
    ops = estimate(facts, parse("dp=2,ckpt=ops", None, m), H100).time.recompute_s
    saved_s = 0.0
    for block in blocks(facts):
        forward = [n.id for n in graph.calls() if n.phase == "forward"
                   and (n.module == block.name or n.module.startswith(block.name + "."))]
        saved_s += sum(seconds[i] for i in must_save(graph, forward, PARALLEL))
    assert 0 < ops < full
    assert full - ops == pytest.approx(m * saved_s)


def test_the_compute_is_its_forward_backward_and_recompute(eager) -> None:
    """The plan's compute splits into the forwards (every node of the forward, each
    micro-batch), the recompute (the blocks' forward again under ckpt) and the backward."""
    ctx, facts = eager
    report, graph = run_context(ctx), ctx.step.graph
    seconds = {t.id: t.time_s for t in node_times(report, graph, H100)}
    forward = sum(seconds[n.id] for n in graph.calls() if n.phase == "forward")
    m = 3
    plain = estimate(facts, parse("dp=2", None, m), H100).time
    assert plain.forward_s == pytest.approx(m * forward)
    assert plain.recompute_s == 0 and 0 < plain.forward_s < plain.compute_s
    ckpt = estimate(facts, parse("dp=2,ckpt", None, m), H100).time
    assert ckpt.forward_s == pytest.approx(plain.forward_s)
    assert ckpt.compute_s - ckpt.forward_s - ckpt.recompute_s == pytest.approx(
        plain.compute_s - plain.forward_s)
    in_blocks = sum(seconds[n.id] for n in graph.calls() if n.phase == "forward" and any(
        n.module == b.name or n.module.startswith(b.name + ".") for b in blocks(facts)))
    assert ckpt.recompute_s == pytest.approx(m * in_blocks)


def test_the_time_tables_caption_splits_the_compute(eager) -> None:
    from dataclasses import replace

    from fxlens.reports.units import seconds
    from fxlens.reports.views.plan import _recompute_note

    _, facts = eager
    plain = estimate(facts, parse("dp=2", None, 3), H100)
    t = plain.time
    assert _recompute_note(plain) == (f". Compute: {seconds(t.forward_s)} forward, "
                                      f"{seconds(t.compute_s - t.forward_s)} backward")
    ckpt = estimate(facts, parse("dp=2,ckpt", None, 3), H100)
    note = _recompute_note(replace(ckpt, recompute_auto=True))
    assert f"{seconds(ckpt.time.recompute_s)} recompute (" in note
    assert note.endswith("of the step; what ckpt=auto chose, the least that fits)")
    assert _recompute_note(replace(plain, recompute_auto=True)).endswith(
        ". ckpt=auto: nothing recomputed, it fits as it is")


def test_biased_linears_addmm_are_all_saved() -> None:
    """tests/models/tiny_gpt.py's Linears have biases, so its GEMMs are ``addmm``, which the
    policy saves every time (only ``mm`` and ``linear`` alternate): all four of a block's,
    and its attention."""
    from fxlens.analyzer.capture.load import load
    from fxlens.analyzer.core.graph import block_of, repeated_blocks
    from tests.analyzer.conftest import MODELS

    options = AnalysisOptions(train=True, precision="amp-bf16")
    ctx = Context(load(str(MODELS / "tiny_gpt.py")), options, lambda _: None)
    run_context(ctx)
    graph = ctx.step.graph
    blocks = repeated_blocks(graph.module_types)
    forward = [n.id for n in graph.calls()
               if n.phase == "forward" and block_of(n.module, blocks) == blocks[0]]
    saved = [graph.nodes[i] for i in must_save(graph, forward, PARALLEL)]
    assert [n.packet for n in saved].count("aten.addmm") == 4
    assert len(saved) == 5 and any("attention" in n.packet for n in saved)


def test_ckpt_ops_reads_back_and_stands_alone() -> None:
    assert parse("dp=2,ckpt=ops") == Strategy(dp=2, checkpoint_ops=True)
    assert parse("dp=2,ckpt=ops").label == "dp=2,ckpt=ops"
    for text in ("dp=2,ckpt,ckpt=ops", "dp=2,ckpt=ops+attn", "dp=2,ckpt=attn+ops"):
        with pytest.raises(ValueError, match="give it alone"):
            parse(text)
