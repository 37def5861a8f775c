"""The planner's MoE parts against closed forms: expert GEMMs and expert-weight-sized ops
re-sized for one GPU, the dispatch/combine all-to-alls (per expert copy, or DeepEP's one copy
per node and per GPU, counted by enumeration), and their overlap with compute."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.routing import ExpertRouting, distinct_holders, routing_groups
from fxlens.analyzer.plan.strategy import Strategy, parse
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.plan.transfers import (
    DEEPEP_SMS,
    expert_parallel,
    experts_per_token,
    sm_slowdown_s,
)
from fxlens.analyzer.plan.unit_share import experts_s
from fxlens.analyzer.plan.workload import ExpertGemm, ExpertWork
from tests.analyzer.conftest import FakeLinks
from tests.analyzer.test_plan import H100, hf_facts, layout


@pytest.mark.parametrize("experts, chosen, holders", [
    (8, 2, 8), (8, 2, 4), (16, 4, 4), (12, 3, 3), (16, 8, 2), (10, 1, 5)])
def test_distinct_holders_is_the_mean_over_every_choice(experts: int, chosen: int,
                                                        holders: int) -> None:
    share = experts // holders
    choices = list(itertools.combinations(range(experts), chosen))
    mean = sum(len({e // share for e in c}) for c in choices) / len(choices)
    assert distinct_holders(ExpertRouting(experts), chosen, holders) == pytest.approx(mean)


@pytest.mark.parametrize("experts, groups, per_token, chosen, holders", [
    (16, 4, 2, 3, 8), (16, 4, 2, 3, 4), (16, 4, 2, 3, 2), (16, 4, 1, 2, 4),
    (12, 4, 2, 4, 6), (12, 4, 3, 2, 2), (24, 8, 4, 5, 3)])
def test_group_limited_holders_are_the_mean_over_every_group_and_expert_choice(
        experts: int, groups: int, per_token: int, chosen: int, holders: int) -> None:
    """DeepSeek-V3's router: `per_token` of `groups` expert groups, then `chosen` experts
    among theirs, each draw uniform; holders aligned with the groups or not."""
    size, share = experts // groups, experts // holders
    counts = []
    for picked in itertools.combinations(range(groups), per_token):
        eligible = [e for g in picked for e in range(g * size, (g + 1) * size)]
        counts += [len({e // share for e in c})
                   for c in itertools.combinations(eligible, chosen)]
    routing = ExpertRouting(experts, groups, per_token)
    assert routing.limited
    assert distinct_holders(routing, chosen, holders) == pytest.approx(sum(counts) / len(counts))


@pytest.mark.parametrize("experts, chosen, holders", [
    (256, 8, 64), (256, 8, 8), (128, 8, 32), (12, 5, 4), (10, 4, 5), (8, 8, 2)])
def test_block_routing_reaches_the_holders_of_each_tokens_consecutive_experts(
        experts: int, chosen: int, holders: int) -> None:
    """Automodel's fake_balanced_gate: token i takes experts i·k … i·k + k − 1 (mod E);
    over a cycle of tokens every expert gets the same rows."""
    share = experts // holders
    tokens = range(experts)
    reached = [len({((i * chosen + j) % experts) // share for j in range(chosen)})
               for i in tokens]
    got = distinct_holders(ExpertRouting(experts), chosen, holders, "blocks")
    assert got == pytest.approx(sum(reached) / len(reached))


def test_group_limits_come_from_the_models_config() -> None:
    config = dataclasses.make_dataclass("C", [("n_group", int), ("topk_group", int)])
    assert routing_groups(config(8, 4)) == (8, 4)
    assert routing_groups(config(1, 1)) == (1, 1)          # Kimi-K2, GLM-4.5: no limit
    assert routing_groups(object()) == (1, 1)
    greedy = dataclasses.make_dataclass("G", [("n_group", int), ("topk_group", int),
                                              ("topk_method", str)])
    assert routing_groups(greedy(8, 3, "greedy")) == (1, 1)    # DeepSeek-V2's plain top-k
    assert routing_groups(greedy(8, 3, "group_limited_greedy")) == (8, 3)
    assert not ExpertRouting(256, 8, 8).limited            # every group allowed


def test_deepep_sends_fewer_rows_across_nodes_under_node_limited_routing() -> None:
    """DeepSeek-V3 at ep = 64 over 8 nodes: each node holds one of the 8 groups of 32
    experts and a token's 8 experts come from 4 of them, so its rows reach the nodes of the
    chosen groups that got an expert, 4·(1 − C(96, 8)/C(128, 8)), 7/8 of them remote; with
    Automodel's block gate, one node."""
    tokens, k, hidden = 4096, 8, 14336
    units = moe_units(1, tokens, k, hidden)
    strategy = Strategy(dp=64, ep=64)
    free, limited, blocks = (
        expert_parallel(s, FakeLinks(), units, tokens, r)[0] for s, r in (
            (strategy, ExpertRouting(256)), (strategy, ExpertRouting(256, 8, 4)),
            (dataclasses.replace(strategy, routing="blocks"), ExpertRouting(256, 8, 4))))
    nodes = 4 * (1 - math.comb(96, 8) / math.comb(128, 8))
    calls = 4
    assert limited.time_s == pytest.approx(calls * tokens * hidden * nodes * 7 / 8 / 50e9)
    assert blocks.time_s == pytest.approx(calls * tokens * hidden * 1 * 7 / 8 / 50e9)
    spread = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert free.time_s == pytest.approx(calls * tokens * hidden * spread * 7 / 8 / 50e9)


def moe_units(layers: int, tokens: int, top_k: int, hidden_bytes: int) -> list[Unit]:
    rows = tokens * top_k
    return [Unit(name=f"b{i}", routed_bytes=rows * hidden_bytes, routed_rows=rows)
            for i in range(layers)]


def test_alltoall_sends_a_copy_per_expert_deepep_one_per_node() -> None:
    """ep = 32 over 4 nodes, 128 experts, top-8 (Qwen3-235B's routing): per-expert copies
    cross nodes for 24 of 32 ranks; DeepEP sends one copy to each of the 2.72 remote nodes
    a token's experts fall on (of 3)."""
    tokens, k, hidden, m = 2048, 8, 8192, 4
    units = moe_units(2, tokens, k, hidden)
    base = Strategy(dp=32, ep=32, micro_batches=m)
    (per_expert,) = expert_parallel(Strategy(**{**vars(base), "dispatch": "alltoall"}),
                                    FakeLinks(), units, tokens, ExpertRouting(128))
    # DeepEP: the default across nodes
    (deepep,) = expert_parallel(base, FakeLinks(), units, tokens, ExpertRouting(128))
    payload = 2 * tokens * k * hidden
    assert per_expert.time_s == pytest.approx(4 * m * payload * 24 / 32 / 50e9)
    remote_nodes = 4 * (1 - math.comb(96, 8) / math.comb(128, 8)) * 3 / 4
    assert deepep.cause == "expert routing (DeepEP)" and deepep.calls == 4 * m
    assert deepep.time_s == pytest.approx(4 * m * 2 * tokens * hidden * remote_nodes / 50e9)
    assert deepep.time_s / per_expert.time_s == pytest.approx(remote_nodes / 6)


@pytest.mark.parametrize("text, passes", [("dp=8,ep=8", 4), ("dp=8,ep=8,ckpt", 6),
                                          ("dp=8,ep=8,ckpt=ops", 4)])
def test_a_recompute_sends_the_tokens_again_unless_the_policy_saved_them(
        text: str, passes: int) -> None:
    """Full recompute runs the forward's dispatch and combine again; ``ckpt=ops`` saves the
    all-to-alls' outputs (torchtitan's policy), so its recompute sends nothing."""
    tokens, k, hidden, m = 1024, 2, 4096, 3
    (a2a,) = expert_parallel(parse(text, None, m), FakeLinks(), moe_units(2, tokens, k, hidden),
                             tokens, ExpertRouting(8))
    assert a2a.calls == passes * m


@pytest.mark.slow
def test_ckpt_ops_keeps_the_rows_the_all_to_alls_delivered() -> None:
    """Under expert parallelism the policy keeps each MoE layer's dispatched and combined
    rows beside the block's input and saved outputs."""
    facts = hf_facts("mixtral")
    blocks = [u for u in facts.units if u.name not in ("pre", "post")]
    routed = sum(u.routed_bytes for u in blocks)
    alone = layout(facts, "dp=2,ckpt=ops", 2).memory.activations_bytes
    spread = layout(facts, "dp=2,ep=2,ckpt=ops", 2).memory.activations_bytes
    assert spread - alone == pytest.approx(2 * routed, abs=2)


def test_inside_a_node_the_default_is_alltoall_and_deepep_dedups_per_gpu() -> None:
    tokens, k, hidden = 1024, 8, 4096
    units = moe_units(1, tokens, k, hidden)
    (plain,) = expert_parallel(Strategy(dp=8, ep=8), FakeLinks(), units, tokens,
                               ExpertRouting(128))
    assert plain.cause == "expert routing" and not plain.across_nodes
    assert plain.time_s == pytest.approx(4 * tokens * k * hidden * 7 / 8 / 400e9)
    (deepep,) = expert_parallel(Strategy(dp=8, ep=8, dispatch="deepep"), FakeLinks(), units,
                                tokens, ExpertRouting(128))
    ranks = 8 * (1 - math.comb(112, 8) / math.comb(128, 8))
    assert deepep.time_s == pytest.approx(4 * tokens * hidden * ranks * 7 / 8 / 400e9)


def test_a_moe_fed_embeddings_counts_its_tokens_by_the_rows_its_router_scores() -> None:
    """No (batch, sequence) token tensor was captured (tokens = 0: a MoE fed hidden states,
    as Megatron's MoE layer test feeds one): the experts a token is sent to are the routed
    rows over the rows the router scored, and DeepEP dedups by them as with token ids."""
    tokens, k, hidden = 1024, 8, 4096
    units = [dataclasses.replace(u, router_rows=tokens) for u in moe_units(2, tokens, k, hidden)]
    strategy = Strategy(dp=8, ep=8, dispatch="deepep")
    assert experts_per_token(units, 0) == k
    (fed,) = expert_parallel(strategy, FakeLinks(), units, 0, ExpertRouting(128))
    (ids,) = expert_parallel(strategy, FakeLinks(), moe_units(2, tokens, k, hidden), tokens,
                             ExpertRouting(128))
    ranks = 8 * (1 - math.comb(112, 8) / math.comb(128, 8))
    assert fed.time_s == pytest.approx(ids.time_s)
    assert fed.time_s == pytest.approx(4 * 2 * tokens * hidden * ranks * 7 / 8 / 400e9)


@pytest.mark.slow
def test_a_captured_routers_rows_are_its_tokens() -> None:
    facts = hf_facts("mixtral")
    moe = [u for u in facts.units if u.routed_rows]
    assert moe and all(u.router_rows == facts.tokens for u in moe)
    assert experts_per_token(facts.units, 0) == experts_per_token(facts.units, facts.tokens)


def test_hidden_deepep_transfers_slow_the_compute_beside_them_by_their_sms() -> None:
    tokens, k, hidden = 1024, 8, 4096
    units = moe_units(1, tokens, k, hidden)
    deepep = expert_parallel(Strategy(dp=8, ep=8, dispatch="deepep", a2a_overlap=True),
                             FakeLinks(), units, tokens, ExpertRouting(128))
    nccl = expert_parallel(Strategy(dp=8, ep=8, dispatch="alltoall", a2a_overlap=True),
                           FakeLinks(), units, tokens, ExpertRouting(128))
    h100 = FakeLinks(multiprocessors=132)
    seconds = deepep[0].time_s
    quarter = 0.25 * seconds                                        # exposed: 0.75 hidden
    assert DEEPEP_SMS == 20
    assert sm_slowdown_s(deepep, quarter, h100) == pytest.approx(seconds * 0.75 * 20 / 132)
    assert sm_slowdown_s(deepep, seconds, h100) == 0.0      # nothing ran beside compute
    assert sm_slowdown_s(deepep, quarter, FakeLinks()) == 0.0   # SMs unknown
    nccl_s = nccl[0].time_s
    assert sm_slowdown_s(nccl, 0.25 * nccl_s, h100) == 0.0      # NCCL's SMs unknown
    dgx = FakeLinks(multiprocessors=132, collective_sms=16)
    assert sm_slowdown_s(nccl, 0.25 * nccl_s, dgx) == pytest.approx(nccl_s * 0.75 * 16 / 132)


def test_hybridep_sends_deepeps_rows_on_its_own_sms() -> None:
    """Megatron-core's HybridEP backend routes the rows DeepEP does (once per node holding an
    expert, then over NVLink), holding `moe_hybridep_num_sms` = 16 SMs to DeepEP's 20."""
    tokens, k, hidden = 1024, 8, 4096
    units = moe_units(1, tokens, k, hidden)
    runs = {name: expert_parallel(Strategy(dp=32, ep=32, dispatch=name, a2a_overlap=True),
                                  FakeLinks(), units, tokens, ExpertRouting(128))
            for name in ("deepep", "hybridep")}
    (deepep,), (hybridep,) = runs["deepep"], runs["hybridep"]
    assert hybridep.cause == "expert routing (HybridEP)"
    assert (hybridep.bytes, hybridep.time_s) == (deepep.bytes, deepep.time_s)
    h100 = FakeLinks(multiprocessors=132)
    quarter = 0.25 * deepep.time_s
    assert sm_slowdown_s(runs["hybridep"], quarter, h100) == pytest.approx(
        deepep.time_s * 0.75 * 16 / 132)
    assert sm_slowdown_s(runs["deepep"], quarter, h100) == pytest.approx(
        deepep.time_s * 0.75 * 20 / 132)


def test_hidden_gradient_transfers_slow_the_compute_by_the_sms_nccl_holds(
        gpt: tuple[object, ModelFacts]) -> None:
    _, facts = gpt
    strategy = parse("dp=8,zero=3", 8, 4)
    on = estimate(facts, strategy, H100).time
    off = estimate(facts, strategy, dataclasses.replace(H100, collective_sms=0)).time
    hidden = on.data_parallel_s - on.data_parallel_exposed_s
    assert hidden > 0 and H100.collective_sms == 16 and H100.multiprocessors == 132
    assert on.overlap_slowdown_s == pytest.approx(hidden * 16 / 132)
    assert on.step_s - off.step_s == pytest.approx(hidden * 16 / 132)
    assert off.overlap_slowdown_s == 0.0


def test_expert_weight_sized_ops_run_on_the_experts_a_gpu_holds() -> None:
    unit = Unit(name="b0", expert_work=ExpertWork(forward_s=0.5, backward_s=16.0),
                expert_gemms=(ExpertGemm("backward", 1.0, 4.0, 0.5),))
    one = experts_s(Strategy(dp=1), unit, "backward")
    assert one == pytest.approx(16.0 + 4.5)
    on_rank = experts_s(Strategy(dp=64, ep=64), unit, "backward")
    assert on_rank == pytest.approx(16.0 / 64 + max(1.0, 4.0 / 64 + 0.5))


@pytest.mark.slow
def test_weight_gradient_copies_of_a_moe_are_expert_work() -> None:
    """transformers' grouped-GEMM experts copy each expert weight's gradient in the backward:
    seconds sized by the experts, not the tokens."""
    facts = hf_facts("mixtral")
    blocks = [u for u in facts.units if u.name not in ("pre", "post")]
    assert all(u.expert_work.backward_s > 0 for u in blocks)
    assert all(u.routed_rows == 2 * facts.tokens for u in blocks)     # top-2


@pytest.mark.slow
def test_moe_experts_are_sharded_by_ep_and_the_router_is_not_split() -> None:
    facts = hf_facts("mixtral")
    assert facts.experts == 4
    blocks = [u for u in facts.units if u.name not in ("pre", "post")]
    assert all(u.routed_bytes > 0 and u.states_expert.weights_bytes > 0 for u in blocks)
    # the router's (E × h) output reaches the experts only through indices: not a column
    assert all(facts.experts not in u.column_widths for u in blocks)
    expert_weights = sum(u.states_expert.weights_bytes for u in facts.units)
    one = layout(facts, "dp=2", 2).memory.weights_bytes
    two = layout(facts, "dp=2,ep=2", 2).memory.weights_bytes
    assert one - two == pytest.approx(expert_weights / 2, abs=len(blocks) * 8)
    (a2a,) = [c for c in layout(facts, "dp=2,ep=2", 2).collectives if c.kind == "all-to-all"]
    assert a2a.bytes == sum(u.routed_bytes for u in facts.units) and a2a.calls == 4




@pytest.mark.slow
def test_a_hybrid_stacks_layers_of_two_kinds_are_its_blocks_and_its_experts_are_routed(
) -> None:
    """Jamba's layers are a Mamba layer and an attention layer with a MoE, two classes in one
    list: both are blocks (pipeline stages, checkpointing), and the MoE's routed rows reach
    the all-to-all under ep — with no blocks they were left out, the all-to-all priced at 0."""
    facts = hf_facts("jamba")
    names = [u.name for u in facts.units]
    assert facts.blocks == 2 and names[1:3] == ["model.layers.0", "model.layers.1"]
    mamba, attention = facts.units[1:3]
    assert mamba.routed_rows == 0 and attention.routed_rows == 2 * facts.tokens     # top-2
    (a2a,) = [c for c in layout(facts, "dp=2,ep=2", 2).collectives if c.kind == "all-to-all"]
    assert a2a.bytes == attention.routed_bytes > 0
    assert layout(facts, "pp=2", 2).time.bubble_s > 0      # two stages, one layer each


def test_expert_gemms_on_a_gpu_follow_rows_and_experts() -> None:
    gemm = ExpertGemm("forward", compute_s=1.0, weight_s=4.0, token_s=0.5)
    assert gemm.on_rank(1, 1, 1) == 4.5                    # as captured: memory-bound
    # ep = 64 of 256 experts, tp = 2: 1/2 of the work, 1/64 of the weights
    assert gemm.on_rank(1 / 2, 1 / 64, 1 / 2) == pytest.approx(0.5)


def test_fp8_quantizing_the_routed_rows_adds_to_the_gemm_with_the_rows() -> None:
    """fp8: quantizing a grouped GEMM's token operands is a pass of its own, before the GEMM,
    sized by the rows a GPU receives, neither hidden under its compute nor cut by ep."""
    gemm = ExpertGemm("forward", compute_s=1.0, weight_s=4.0, token_s=0.5, scaling_s=0.25)
    assert gemm.on_rank(1, 1, 1) == pytest.approx(4.5 + 0.25)
    assert gemm.on_rank(1 / 2, 1 / 64, 1 / 2) == pytest.approx(0.5 + 0.25 / 2)


@pytest.mark.slow
def test_an_fp8_moe_quantizes_each_routed_row_once_per_weight_gemm() -> None:
    """Mixtral's experts (top-2) as grouped GEMMs: per block, the forward quantizes the rows
    entering the gate/up and the down projections, the backward the gradients leaving them:
    6 bytes per element of routed rows × (hidden + intermediate) each way."""
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.pipeline import AnalysisOptions, Context, run_context
    from fxlens.plan_pass import plan_facts
    from tests.models.hf_zoo import ZOO

    module, inputs = ZOO["mixtral"]()
    options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=2, device="h100",
                              precision="fp8", fusion=False)
    ctx = Context(LoadedModel(module, inputs, "mixtral", "mixtral"), options, lambda _: None)
    facts = plan_facts(ctx, run_context(ctx), H100)
    config = module.config
    rows = inputs["input_ids"].numel() * config.num_experts_per_tok
    upper = 2 * config.intermediate_size          # gate and up, one GEMM
    per_phase = {"forward": rows * (config.hidden_size + config.intermediate_size),
                 "backward": rows * (config.hidden_size + upper)}
    blocks = [u for u in facts.units if u.name not in ("pre", "post")]
    assert blocks
    for unit in blocks:
        for phase, elements in per_phase.items():
            seconds = sum(g.scaling_s for g in unit.expert_gemms if g.phase == phase)
            assert seconds == pytest.approx(6 * elements / H100.achievable_bandwidth)


@pytest.mark.slow
def test_expert_parallel_layouts_fold_into_the_stage() -> None:
    """ep drawn from tp · dp with whole experts (etp = 1): expert weights ÷ ep, the all-to-all
    carries this GPU's routed rows (÷ tp), the expert gradients reduce over tp·dp/ep."""
    facts = hf_facts("mixtral")
    expert_weights = sum(u.states_expert.weights_bytes for u in facts.units)
    dense_split = sum(u.states_split.weights_bytes for u in facts.units)
    dense_whole = sum(u.states_whole.weights_bytes for u in facts.units)
    folded = layout(facts, "dp=1,tp=2,ep=2")
    assert folded.memory.weights_bytes == pytest.approx(
        dense_split / 2 + dense_whole + expert_weights / 2, abs=64 * len(facts.units))
    (a2a,) = [c for c in folded.collectives if c.kind == "all-to-all"]
    assert a2a.bytes == sum(u.routed_bytes for u in facts.units) // 2 and a2a.group == 2
    assert folded.etp == 1
    (expert_grads,) = [c for c in layout(facts, "dp=4,ep=2").collectives
                       if c.cause.startswith("expert gradients")]
    assert expert_grads.group == 2


@pytest.mark.slow
def test_a_tensor_parallel_moe_block_reduces_its_tokens_not_their_routed_rows() -> None:
    """Under tp a MoE block all-reduces attention's output, and its experts' output once their
    top-k rows are combined per token — tokens × hidden each, where the routed rows would
    be top-k times that — the experts' only where they are split (etp > 1): whole experts
    (etp = 1) receive their tokens by the all-to-all."""
    facts = hf_facts("mixtral")
    hidden_states = facts.tokens * 32 * 4        # tests/models/hf_zoo.py: hidden 32, fp32
    blocks = [u for u in facts.units if u.name not in ("pre", "post")]
    assert blocks and all(u.row_gemms == 2 for u in blocks)
    assert all(u.routed_rows == 2 * facts.tokens for u in blocks)            # top-2
    assert [(u.tp_reduces, u.tp_reduce_bytes) for u in blocks] == [(1, hidden_states)] * 2
    assert [(u.etp_reduces, u.etp_reduce_bytes) for u in blocks] == [(1, hidden_states)] * 2
    split = {c.cause: c for c in layout(facts, "tp=2", 2).collectives}       # etp = tp = 2
    whole = {c.cause: c for c in layout(facts, "tp=2,ep=2", 2).collectives}  # etp = 1
    assert split["etp expert outputs"].calls == len(blocks) * 2       # forward and backward
    assert split["etp expert outputs"].bytes == hidden_states
    assert "etp expert outputs" not in whole
    assert whole["tp activations"].calls == split["tp activations"].calls


@pytest.mark.slow
def test_a_models_group_limited_router_reaches_the_plan() -> None:
    """The zoo's DeepSeek-V3 routes its top-2 of 4 experts within 1 of 2 groups (its config's
    n_group, topk_group); the plan reads that from the model it analyses."""
    from fxlens.plan_pass import _routing_assumption

    deepseek = hf_facts("deepseek_v3")
    assert deepseek.routing == ExpertRouting(4, 2, 1)
    assert "drawn uniformly within 1 of 2 expert groups" in _routing_assumption(deepseek)
    mixtral = hf_facts("mixtral").routing                   # top-k over all its experts
    assert mixtral.experts > 0 and not mixtral.limited


@pytest.mark.slow
def test_layouts_offered_for_one_that_does_not_fit_keep_the_runs_routing() -> None:
    from fxlens.analyzer.plan.search import PlanRequest, plan_section
    from fxlens.rules.hardware import LINK_EFFICIENCY

    facts = hf_facts("mixtral")
    asked = parse("dp=8,ep=8,routing=blocks", 8)
    tight = H100.with_usable(layout(facts, "dp=8,ep=8,zero=3", 8).memory.peak_bytes + 1)
    plan = plan_section(facts, PlanRequest(strategy=asked), tight, (), LINK_EFFICIENCY, "",
                        1.0, 1.0)
    assert not plan.layouts[0].fits
    offered = [parse(x.strategy, 8) for x in plan.layouts[1:]]
    assert any(s.ep > 1 for s in offered)
    assert all(s.routing == ("blocks" if s.ep > 1 else None) for s in offered)


def test_experts_as_narrow_as_a_low_rank_pair_are_still_routed() -> None:
    """Nemotron-3 Nano's experts (hidden → 1,856 → hidden, no gate) have the shape of a
    LoRA adapter's down/up pair: taken for one (`tensor_split.low_rank_bypasses`), its
    grouped GEMMs lost their row, and the plan its all-to-all (Megatron-Bridge's 8-GPU rows
    read 1.41 s of expert traffic as 0). An adapter is a dense GEMM, never an expert."""
    from fxlens.analyzer.capture.hf import load_preset
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.pipeline import AnalysisOptions, Context, run_context
    from fxlens.plan_pass import plan_facts

    small = {"hybrid_override_pattern": "ME", "hidden_size": "64", "num_attention_heads": "4",
             "num_key_value_heads": "2", "head_dim": "16", "intermediate_size": "32",
             "moe_intermediate_size": "32", "moe_shared_expert_intermediate_size": "48",
             "n_routed_experts": "8", "num_experts_per_tok": "2", "mamba_num_heads": "8",
             "mamba_head_dim": "16", "ssm_state_size": "16", "n_groups": "2",
             "chunk_size": "8", "vocab_size": "256"}
    loaded = load_preset("nemotron-3-nano-30b-a3b", small, seq_len=16, dtype="float32")
    options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=2, fusion=False)
    ctx = Context(LoadedModel(loaded.module, loaded.inputs, "nano", "nano"), options,
                  lambda _: None)
    facts = plan_facts(ctx, run_context(ctx), H100)
    moe = [u for u in facts.units if u.routed_rows]
    assert len(moe) == 1 and moe[0].routed_rows == 2 * facts.tokens       # top-2
    (a2a,) = [c for c in layout(facts, "dp=2,ep=2", 2).collectives if c.kind == "all-to-all"]
    assert a2a.bytes == moe[0].routed_bytes > 0


@pytest.mark.parametrize("experts, copies", [(16, 2), (4, 1)])
def test_the_alltoall_dispatcher_stages_copies_of_a_layers_routed_rows(
        gpt: tuple[object, ModelFacts], experts: int, copies: int) -> None:
    """Megatron-core's all-to-all dispatcher receives a layer's routed rows into a buffer of
    its own and sorts them by local expert into another (no sort with one expert per GPU);
    DeepEP receives them in place. tiny_gpt's blocks made MoE layers routing 3 MiB each."""
    _, facts = gpt
    routed = 3 * 2**20
    units = tuple(dataclasses.replace(u, routed_bytes=routed, routed_rows=64, router_rows=32)
                  if u.name not in ("pre", "post") else u for u in facts.units)
    moe = dataclasses.replace(facts, units=units, experts=experts,
                              optimizer_temporaries_bytes=0)
    def peak(dispatch: str) -> int:
        return layout(moe, f"dp=4,ep=4,dispatch={dispatch}").memory.peak_bytes
    assert peak("alltoall") - peak("deepep") == pytest.approx(copies * routed, abs=2)
    assert peak("hybridep") == peak("deepep")


def test_working_tensors_shaped_like_expert_weights_follow_the_experts_a_gpu_holds(
        gpt: tuple[object, ModelFacts]) -> None:
    """A grouped GEMM's backward writes every expert's weight gradient at once (15 GB for a
    DeepSeek-V3 layer in bf16) before it reaches the gradients: a GPU holding 1/ep of the
    experts holds 1/ep of it, not all of it as the tokens' working tensors would be."""
    from fxlens.analyzer.plan.moments import StepMoment

    _, facts = gpt
    total_saved = sum(u.saved_bytes for u in facts.units)
    shaped = 2**30
    moe = dataclasses.replace(facts, experts=16, optimizer_temporaries_bytes=0,
                              moments=(StepMoment(total_saved, 0, 0, shaped),))
    def peak(text: str) -> int:
        return layout(moe, text).memory.peak_bytes
    assert peak("dp=4") - peak("dp=4,ep=4") == pytest.approx(shaped * (1 - 1 / 4), abs=2)
    assert peak("dp=4") - peak("dp=4,ep=2,etp=2") == pytest.approx(shaped * 3 / 4, abs=2)
