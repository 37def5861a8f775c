"""The parallelism planner against the closed forms of ../shared/domain.md.

Oracles on a GPT-shaped model (tests/models/tiny_gpt.py: b = 2, s = 16, h = 64, 2 blocks) under
AMP bf16 + AdamW: ZeRO model states per GPU (Rajbhandari et al. 2020: DDP 16Ψ, ZeRO-1
4Ψ + 12Ψ/N_d, ZeRO-2 2Ψ + 14Ψ/N_d, ZeRO-3 16Ψ/N_d), ring all-reduce 2(n−1)/n·S/B, the 1F1B
bubble (p−1)/m, and Korthikanti et al. 2022's activations per layer: 24·sbh bytes inside the
tensor-parallel pairs (÷t), 10·sbh outside them less the 2·sbh of dropout masks this model does
not have (÷t only with sequence parallel), 2·sbh kept under full recompute.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from fxlens.analyzer.core.report import Report, load_report
from fxlens.analyzer.core.sections import Plan, PlanLayout, Training
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.stage_memory import in_flight, stages
from fxlens.analyzer.plan.strategy import Strategy, parse
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.analyzer.plan.transfers import all_reduce_s, one_way_s
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.plan_pass import plan_facts
from fxlens.rules.hardware import LINK_EFFICIENCY, device

MODELS = Path(__file__).parent.parent / "models"
B, S, H = 2, 16, 64           # tiny_gpt's batch, sequence and width
BF16 = 2


# the GPUs' side in closed form: the host's floor under a tiny model's micro-batch would
# decide every step here (tests/analyzer/test_plan_host.py checks it)
H100 = dataclasses.replace(device("h100"), framework_launch_s=0.0)
BASE_S, NVLINK_HOP_S, NET_HOP_S = 6.6e-6, 0.6e-6, 2.7e-6   # NCCL 2.20.3's ring/LL latency


def layout(facts: ModelFacts, text: str, gpus: int | None = None, m: int = 1) -> PlanLayout:
    return estimate(facts, parse(text, gpus, m), H100)


def psi(facts: ModelFacts) -> int:
    """Trainable parameters, from the working bf16 weights."""
    return sum(u.states.weights_bytes for u in facts.units) // BF16


# --- strategies ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, gpus, expected", [
    ("ddp", 8, Strategy(dp=8)),
    ("fsdp", 4, Strategy(dp=4, zero=3)),
    ("hsdp", 16, Strategy(dp=16, zero=3, hybrid=True)),
    ("dp=2,tp=4,pp=2,zero=1,sp", None, Strategy(dp=2, tp=4, pp=2, zero=1, sp=True)),
    ("tp=8,pp=4,v=2,ckpt", 64, Strategy(dp=2, tp=8, pp=4, v=2, checkpoint=True)),
    ("zero2,offload", 2, Strategy(dp=2, zero=2, offload=True)),
    ("dp=4,tp=8,pp=9,cp=2,v=7,sp,ckpt=full", None,
     Strategy(dp=4, tp=8, pp=9, cp=2, v=7, sp=True, checkpoint=True)),
    ("tp=2,pp=16,ep=64,etp=1", 1024, Strategy(dp=32, tp=2, pp=16, ep=64, etp=1)),
    ("dp=8,ep=8,dispatch=deepep,a2a-overlap", None,
     Strategy(dp=8, ep=8, dispatch="deepep", a2a_overlap=True)),
    ("dp=64,pp=4,ep=64,v=8,zero=3,dispatch=deepep,routing=blocks", None,
     Strategy(dp=64, pp=4, ep=64, v=8, zero=3, dispatch="deepep", routing="blocks")),
])
def test_strategy_text_parses(text: str, gpus: int | None, expected: Strategy) -> None:
    assert parse(text, gpus) == expected
    assert parse(expected.label, expected.gpus) == expected


@pytest.mark.parametrize("text, gpus, says", [
    ("tp=3", 8, "not a multiple"),
    ("dp=2,tp=2", 8, "not --gpus 8"),
    ("sp", 4, "needs tp > 1"),
    ("dp=4,ep=3", None, "must divide the GPUs of a pipeline stage"),
    ("dp=2,tp=2,tp=4", None, "tp is given twice"),
    ("fsdp,zero=1", 4, "zero is given twice"),
    ("dp=2,cp=3", 4, "not --gpus 4"),
    ("zero=4", 2, "ZeRO stages"),
    ("zero1,hybrid", 2, "unknown strategy 'hybrid'"),
    ("tp=two", 2, "whole number"),
    ("pp=0", 2, "≥ 1"),
    ("dp=4,ep=2,dispatch=nccl", None, "dispatchers are alltoall, deepep and hybridep"),
    ("dp=4,a2a-overlap", None, "need ep > 1"),
    ("dp=4,routing=blocks", None, "need ep > 1"),
    ("dp=4,ep=2,routing=topk", None, "routings are balanced and blocks"),
    ("dp=4,ep=2,routing=blocks,routing=balanced", None, "routing is given twice"),
    ("fsdp", None, "--gpus N, or dp=N"),
])
def test_bad_strategy_says_why(text: str, gpus: int | None, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse(text, gpus)


# --- structure --------------------------------------------------------------------------------


def test_tensor_parallel_pairs_are_found_from_the_graph(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    blocks = [u for u in facts.units if u.name.startswith("blocks.")]
    assert [u.name for u in blocks] == ["blocks.0", "blocks.1"]
    for unit in blocks:
        assert unit.row_gemms == 2                       # attn.proj and mlp.fc2
        assert unit.column_widths == (3 * H, 4 * H)      # qkv and fc1 outputs
        assert unit.tp_reduce_bytes == 2 * B * S * H * BF16


def test_korthikanti_activations_per_layer(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    sbh = S * B * H
    for unit in (u for u in facts.units if u.name.startswith("blocks.")):
        assert unit.saved_split_bytes == pytest.approx(24 * sbh, rel=0.02)
        assert unit.saved_whole_bytes == pytest.approx((10 - 2) * sbh, rel=0.02)
        assert unit.input_bytes == 2 * sbh               # all full recompute keeps


def test_tensor_and_sequence_parallel_divide_activations(gpt: tuple[Report, ModelFacts]
                                                         ) -> None:
    _, facts = gpt
    saved = sum(u.saved_bytes for u in facts.units)
    split = sum(u.saved_split_bytes for u in facts.units)
    one = layout(facts, "tp=2", 2).memory.activations_bytes
    with_sp = layout(facts, "tp=2,sp", 2).memory.activations_bytes
    assert one == pytest.approx(saved - split / 2, abs=2)
    assert with_sp == pytest.approx(saved / 2, abs=2)


def test_full_recompute_keeps_block_inputs_and_one_block(gpt: tuple[Report, ModelFacts]
                                                         ) -> None:
    _, facts = gpt
    blocks = [u for u in facts.units if u.name.startswith("blocks.")]
    others = sum(u.saved_bytes for u in facts.units if u not in blocks)
    got = layout(facts, "ddp,ckpt", 1).memory.activations_bytes
    assert got == others + 2 * S * B * H * len(blocks) + max(u.saved_bytes for u in blocks)


# --- ZeRO -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, per_param", [
    ("ddp", lambda n: 16), ("zero1", lambda n: 4 + 12 / n), ("zero2", lambda n: 2 + 14 / n),
    ("zero3", lambda n: 16 / n),
])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_zero_model_states_per_gpu(gpt: tuple[Report, ModelFacts], text: str, per_param: object,
                                   n: int) -> None:
    _, facts = gpt
    m = layout(facts, text, n).memory
    states = m.weights_bytes + m.gradients_bytes + m.master_bytes + m.optimizer_bytes
    expected = per_param(n) * psi(facts)  # type: ignore[operator]
    assert states == pytest.approx(expected, rel=0.002)   # ceil per unit and category


def test_one_gpu_peak_is_the_training_step_peak(gpt: tuple[Report, ModelFacts]) -> None:
    report, facts = gpt
    training = report.require(Training)
    assert layout(facts, "ddp", 1).memory.peak_bytes == pytest.approx(
        training.step_peak_bytes, rel=0.01)


def test_one_gpu_forward_backward_is_the_training_steps(gpt: tuple[Report, ModelFacts]
                                                        ) -> None:
    """Without the optimizer's temporaries tiny_gpt's step peaks in its backward: one GPU's
    plan holds exactly the step's live set there (not all the saved activations beside all
    the gradients live then: most of the saved set is freed by then)."""
    report, facts = gpt
    parts = report.require(Training).peak_breakdown
    m = layout(dataclasses.replace(facts, optimizer_temporaries_bytes=0), "ddp", 1).memory
    assert m.peak_bytes == pytest.approx(parts.persistent_bytes + parts.fwd_bwd_peak_bytes,
                                         rel=0.01)


def test_a_gpu_holds_the_step_where_its_own_shares_peak(gpt: tuple[Report, ModelFacts]
                                                       ) -> None:
    """ZeRO-2 on 2 GPUs halves the gradients, not the activations: the plan's peak is the
    one-GPU step's live set at the moment that is largest at those shares — here where the
    working tensors peak, not where the one-GPU step peaked (gradients nearly all live)."""
    _, facts = gpt
    m = layout(dataclasses.replace(facts, optimizer_temporaries_bytes=0), "zero2", 2).memory
    share = m.gradients_bytes / facts.states.grad_bytes
    at = [x.saved_bytes + x.working_bytes + x.gradient_bytes * share for x in facts.moments]
    persistent = m.weights_bytes + m.master_bytes + m.optimizer_bytes + m.buffers_bytes
    assert m.peak_bytes - persistent - m.communication_bytes == pytest.approx(max(at), rel=1e-3)
    assert at[1] > at[0]        # (at_peak, working_peak): the working peak decides


def test_zero3_holds_two_units_weights_and_one_units_gradients_unsharded(
        gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    weights = sorted((u.states.weights_bytes for u in facts.units), reverse=True)
    grads = max(u.states.grad_bytes for u in facts.units)
    assert layout(facts, "fsdp", 4).memory.gathered_bytes == sum(weights[:2]) + grads


def test_offload_moves_optimizer_state_to_the_host(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    on_gpu = layout(facts, "zero2", 2).memory
    offloaded = layout(facts, "zero2,offload", 2).memory
    assert offloaded.optimizer_bytes == offloaded.master_bytes == 0
    assert offloaded.host_bytes == on_gpu.optimizer_bytes + on_gpu.master_bytes


# --- transfers and time ---------------------------------------------------------------------


def test_ring_formulas() -> None:
    assert all_reduce_s(1e9, 8, 1e11) == pytest.approx(2 * 7 / 8 * 1e9 / 1e11)
    assert one_way_s(1e9, 4, 1e11) == pytest.approx(3 / 4 * 1e9 / 1e11)
    assert all_reduce_s(1e9, 1, 1e11, 1e-5) == 0.0
    assert all_reduce_s(1e3, 2, 1e11, 7e-6) == pytest.approx(7e-6 + 1e3 / 1e11)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_collective_call_costs_the_links_latency_per_ring_step(n: int) -> None:
    """NCCL's model: a base per call and a hop per ring step, 2(n − 1) steps for an
    all-reduce, n − 1 for a reduce-scatter; a few-KiB all-reduce is all latency."""
    from fxlens.analyzer.plan.transfers import Group, latency_s

    inside = Group(n, 1)
    assert latency_s("all-reduce", inside, H100) == pytest.approx(
        BASE_S + 2 * (n - 1) * NVLINK_HOP_S)
    assert latency_s("reduce-scatter", inside, H100) == pytest.approx(
        BASE_S + (n - 1) * NVLINK_HOP_S)
    across = Group(2 * n, 8 // n)          # n GPUs in each of two nodes... one per n ranks
    steps = 2 * (2 * n - 1)
    assert latency_s("all-reduce", across, H100) == pytest.approx(
        BASE_S + (steps - 2 * 2) * NVLINK_HOP_S + 2 * 2 * NET_HOP_S)
    assert latency_s("all-reduce", Group(1, 1), H100) == 0.0


def test_ddp_all_reduces_2_psi_bytes_of_gradients(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    (reduce,) = layout(facts, "ddp", 8).collectives
    assert (reduce.kind, reduce.bytes, reduce.group, reduce.across_nodes) == (
        "all-reduce", 2 * psi(facts), 8, False)
    assert reduce.time_s == pytest.approx(
        BASE_S + 2 * 7 * NVLINK_HOP_S
        + 2 * 7 / 8 * 2 * psi(facts) / (H100.intra_node_bytes_per_s * LINK_EFFICIENCY))


def test_zero3_moves_3_psi_per_micro_batch(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    moved = sum(c.bytes * c.calls for c in layout(facts, "fsdp", 4, m=3).collectives)
    assert moved == 3 * 3 * 2 * psi(facts)


def test_zero3_under_a_pipeline_gathers_once_and_holds_the_stage_whole(
        gpt: tuple[Report, ModelFacts]) -> None:
    """PyTorch's pipeline schedules run FSDP2 without resharding or gradient sync until the
    last micro-batch: per step one gather of the stage's weights and one reduce-scatter of
    its gradients (not 2m and m), and the stage's weights and gradients whole meanwhile, the
    gradients accumulated in float32 (twice the bf16 gradients of AMP)."""
    from fxlens.analyzer.plan.stage_memory import model_stages

    _, facts = gpt
    m = 3
    planned = layout(facts, "dp=2,pp=2,zero=3", None, m)
    stage = model_stages(facts, parse("dp=2,pp=2,zero=3", None, m))[planned.memory.stage]
    weights = sum(u.states.weights_bytes for u in stage)
    grads = sum(u.states.grad_bytes for u in stage)
    assert planned.memory.gathered_bytes == weights + 2 * grads
    zero3 = {c.kind: c for c in planned.collectives if "ZeRO-3" in c.cause}
    assert {kind: c.calls for kind, c in zero3.items()} == {"all-gather": 1,
                                                             "reduce-scatter": 1}
    assert zero3["all-gather"].bytes == pytest.approx(weights, rel=0.01)
    assert zero3["reduce-scatter"].bytes == pytest.approx(2 * grads, rel=0.01)


def test_groups_leave_the_node_when_they_must(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    inside = layout(facts, "ddp", 8).collectives[0]
    across = layout(facts, "ddp", 16).collectives[0]
    assert not inside.across_nodes and across.across_nodes
    nvlink, nic = H100.intra_node_bytes_per_s, H100.inter_node_bytes_per_s
    moved = 2 * psi(facts)
    assert inside.time_s == pytest.approx(BASE_S + 14 * NVLINK_HOP_S
                                          + 2 * 7 / 8 * moved / (nvlink * LINK_EFFICIENCY))
    # 8 GPUs of the group in each node: 8 rings over 8 NICs, at most NVLink's rate; of the
    # ring's 30 steps, 2 per node cross the network (NCCL's latency model)
    assert across.time_s == pytest.approx(
        BASE_S + 26 * NVLINK_HOP_S + 4 * NET_HOP_S
        + 2 * 15 / 16 * moved / (min(nvlink, 8 * nic) * LINK_EFFICIENCY))
    # one GPU per node (tp = 8 inside it): each ring on one NIC, both steps across
    (strided,) = [c for c in layout(facts, "dp=2,tp=8", 16).collectives if "DDP" in c.cause]
    assert strided.across_nodes and strided.time_s == pytest.approx(
        all_reduce_s(strided.bytes, 2, nic * LINK_EFFICIENCY, BASE_S + 2 * NET_HOP_S))


@pytest.mark.parametrize(("size", "stride", "gpus_per_node", "per_node"), [
    (8, 1, 8, 8), (16, 1, 8, 8), (2, 8, 8, 1), (12, 1, 8, 6), (64, 1, 72, 64), (128, 1, 72, 64),
    (16, 8, 72, 8), (7, 1, 8, 7), (14, 1, 8, 7)])
def test_a_group_spread_over_nodes_holds_the_same_share_in_each(
        size: int, stride: int, gpus_per_node: int, per_node: int) -> None:
    from fxlens.analyzer.plan.transfers import Group

    assert Group(size, stride).per_node(gpus_per_node) == per_node


def test_an_nvl72_rack_is_one_nvlink_domain(gpt: tuple[Report, ModelFacts]) -> None:
    """GB200 NVL72: 64 data-parallel GPUs reduce over NVLink; 128 span two racks with 64
    in each, their rings over 64 NICs per rack (capped at NVLink's rate), 2 steps per rack
    across."""
    _, facts = gpt
    gb200 = device("gb200")
    inside = estimate(facts, parse("ddp", 64, 1), gb200).collectives[0]
    across = estimate(facts, parse("ddp", 128, 1), gb200).collectives[0]
    nvlink, nic = gb200.intra_node_bytes_per_s, gb200.inter_node_bytes_per_s
    moved = 2 * psi(facts)
    assert not inside.across_nodes and inside.time_s == pytest.approx(
        BASE_S + 2 * 63 * NVLINK_HOP_S + 2 * 63 / 64 * moved / (nvlink * LINK_EFFICIENCY))
    assert across.across_nodes and across.time_s == pytest.approx(
        BASE_S + (2 * 127 - 4) * NVLINK_HOP_S + 4 * NET_HOP_S
        + 2 * 127 / 128 * moved / (min(nvlink, 64 * nic) * LINK_EFFICIENCY))


def test_tensor_parallel_all_reduces_twice_per_pair(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    (reduce,) = layout(facts, "tp=2", 2, m=2).collectives
    reduces = sum(u.tp_reduces for u in facts.units)
    assert (reduce.kind, reduce.calls) == ("all-reduce", reduces * 2 * 2)
    sp = layout(facts, "tp=2,sp", 2, m=2).collectives
    assert [c.kind for c in sp] == ["reduce-scatter", "all-gather"]
    # the same bytes and ring steps in two calls: one more base latency per all-reduce
    assert sum(c.time_s for c in sp) == pytest.approx(reduce.time_s + reduce.calls * BASE_S)


@pytest.mark.parametrize("m", [2, 4, 8])
def test_pipeline_bubble_is_p_minus_1_over_m(gpt: tuple[Report, ModelFacts], m: int) -> None:
    _, facts = gpt
    t = layout(facts, "pp=2", 2, m=m).time
    per_micro_batch = (t.compute_s + t.pipeline_s) / m
    assert t.bubble_s == pytest.approx((2 - 1) * per_micro_batch)
    assert t.bubble_s / (m * per_micro_batch) == pytest.approx((2 - 1) / m)


def test_pipeline_stages_split_the_blocks(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    first, last = stages(facts.units, facts.blocks, 2)
    assert [u.name for u in first] == ["pre", "blocks.0"]
    assert [u.name for u in last] == ["blocks.1", "post"]
    # 1F1B: the first stage holds min(m, p) micro-batches of its activations
    assert layout(facts, "pp=2", 2, m=4).memory.activations_bytes >= 2 * sum(
        u.saved_bytes for u in first) - 2


def test_a_run_in_gpu_hours_and_dollars(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    strategy = parse("ddp", 4)
    plan = estimate(facts, strategy, H100, tokens=10**9, price_per_gpu_hour=2.5)
    assert plan.run is not None and plan.time.tokens_per_step == 4 * B * S
    assert plan.run.steps == math.ceil(10**9 / (4 * B * S))
    assert plan.run.gpu_hours == pytest.approx(plan.run.steps * plan.time.step_s * 4 / 3600)
    assert plan.run.cost == pytest.approx(plan.run.gpu_hours * 2.5)


def test_mfu_is_model_flops_over_peak(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    t = layout(facts, "ddp", 2).time
    assert t.mfu == pytest.approx(facts.flops * 2 / (t.step_s * 2 * facts.peak_flops))


# --- the section ---------------------------------------------------------------------------


def test_search_ranks_fitting_layouts_and_says_why_others_dropped(
        gpt: tuple[Report, ModelFacts]) -> None:
    report, facts = gpt
    from fxlens.analyzer.plan.search import PlanRequest, plan_section

    tight = H100.with_usable(layout(facts, "fsdp", 4).memory.peak_bytes + 1)
    plan = plan_section(facts, PlanRequest(gpus=4), tight, (), LINK_EFFICIENCY, "", 1.0, 1.0)
    assert plan.layouts and all(layout.fits for layout in plan.layouts)
    steps = [layout.time.step_s / layout.time.tokens_per_step for layout in plan.layouts]
    assert steps == sorted(steps)
    assert plan.dropped_by_reason["does not fit"] >= 1
    too_big = [d for d in plan.dropped if d.reason == "does not fit"]
    assert too_big and all(d.needed_bytes is not None and d.needed_bytes > tight.usable_bytes
                           for d in too_big)


def test_a_requested_layout_that_does_not_fit_names_one_that_does(
        gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt
    from fxlens.analyzer.plan.search import PlanRequest, plan_section
    from fxlens.reports.views.plan import plan_verdict

    tight = H100.with_usable(layout(facts, "fsdp", 4).memory.peak_bytes + 1)
    plan = plan_section(facts, PlanRequest(strategy=parse("ddp", 4)), tight, (),
                        LINK_EFFICIENCY, "", 1.0, 1.0)
    assert not plan.layouts[0].fits and plan.layouts[1].fits
    verdict = plan_verdict(plan)
    assert "does not fit" in verdict.value and f"fits as {plan.layouts[1].strategy}" in (
        verdict.detail)


def test_plan_section_round_trips_through_json(gpt: tuple[Report, ModelFacts],
                                               tmp_path: Path) -> None:
    report, _ = gpt
    (tmp_path / "r.json").write_text(report.to_json())
    assert load_report(tmp_path / "r.json").require(Plan) == report.require(Plan)


# --- architectures by others ---------------------------------------------------------------


def hf_facts(name: str, tokens: int | None = None) -> ModelFacts:
    """The zoo model's facts; `tokens`: a sequence of that length instead of its own."""
    from fxlens.analyzer.core.loaded import LoadedModel
    from tests.models.hf_build import tokens as token_ids
    from tests.models.hf_zoo import ZOO

    module, inputs = ZOO[name]()
    if tokens is not None:
        inputs = {"input_ids": token_ids(length=tokens)}
    options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=2, fusion=False)
    ctx = Context(LoadedModel(module, inputs, name, name), options, lambda _: None)
    return plan_facts(ctx, run_context(ctx), H100)


@pytest.mark.slow
@pytest.mark.parametrize("name, rows", [("llama", 2), ("gpt2", 2), ("bert", 2),
                                        ("mixtral", 2), ("deepseek_v3", 2),
                                        ("gpt_oss", 2)])
def test_megatron_pairs_in_transformers_blocks(name: str, rows: int) -> None:
    facts = hf_facts(name)
    first = next(u for u in facts.units if u.name not in ("pre", "post"))
    assert first.row_gemms == rows          # attention output and MLP down projection
    assert first.tp_reduce_bytes > 0 and first.saved_split_bytes > first.saved_whole_bytes



@pytest.mark.slow
def test_a_mask_wider_than_the_hidden_states_is_not_the_residual_stream() -> None:
    """GPT-OSS's eager attention takes a batch × 1 × T × T mask made before the blocks; at 96
    tokens over a width of 64 it outgrows the hidden states, and had been taken for the
    residual stream: no pairs, no routed rows (no all-to-all under ep), a block's input the
    mask's size."""
    batch, tokens, width, top_k, fp32 = 2, 96, 64, 2, 4
    facts = hf_facts("gpt_oss", tokens)
    for block in (u for u in facts.units if u.name not in ("pre", "post")):
        assert block.row_gemms == 2
        assert block.routed_rows == batch * tokens * top_k
        assert block.input_bytes == batch * tokens * width * fp32

# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize("argv, says", [
    (["--plan", "--strategy", "fsdp"], "--gpus N, or dp=N"),
    (["--gpus", "4"], "add --plan"),
    (["--plan", "--strategy", "ddp", "--search", "--gpus", "2"], "give one of them"),
    (["--plan", "--tokens", "1.5"], "whole number"),
    (["--plan", "--price", "-1"], "≥ 0"),
    (["--attention-kernel", "flash2"], "add --device"),
    (["--plan", "--strategy", "dp=2,cp=2,cp_comm=ring"], "p2p, a2a, allgather"),
])
def test_plan_options_are_refused_before_the_model_runs(argv: list[str], says: str,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from fxlens.cli.main import main

    try:
        code = main([str(MODELS / "no_such_model.py"), *argv])   # refused before loading
    except SystemExit as exit_:                                    # argparse's own refusals
        code = exit_.code
    assert code == 2 and says in capsys.readouterr().err


def test_plan_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fxlens.cli.main import main

    report = tmp_path / "r.json"
    assert main([str(MODELS / "tiny_gpt.py"), "--plan", "--gpus", "4", "--tokens", "1e9",
                 "--price", "2", "--no-pages", "--json", str(report), "--show", "plan"]) == 0
    shown = capsys.readouterr().out
    assert "plan · h100" in shown and "run days" in shown and "transfers per step" in shown
    assert "$" in shown
    plan = load_report(report).require(Plan)
    assert plan.tokens == 10**9 and plan.layouts[0].run is not None
    assert plan.layouts[0].run.cost == pytest.approx(plan.layouts[0].run.gpu_hours * 2)


def test_device_mem_is_every_gpus_budget_in_the_plan(tmp_path: Path) -> None:
    """``--device-mem 96GB`` beside ``--device h100``: the plan's fits verdicts read the
    budget as given, as the one-GPU fit does, with the H100's links and peaks."""
    from fxlens.cli.main import main

    report = tmp_path / "r.json"
    assert main([str(MODELS / "tiny_gpt.py"), "--plan", "--gpus", "2", "--device", "h100",
                 "--device-mem", "96GB", "--no-pages", "--json", str(report)]) == 0
    plan = load_report(report).require(Plan)
    assert (plan.device, plan.device_bytes) == ("h100", 96 * 10**9)


def test_a_device_without_links_is_refused_before_the_capture(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fxlens.cli.main import main

    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps({"devices": {"mygpu": {
        "memory_bytes": 2**34, "bandwidth_bytes_per_s": 1e12, "peak_flops": {"bf16": 1e14}}}}))
    argv = [str(MODELS / "no_such_model.py"), "--plan", "--gpus", "2", "--device", "mygpu",
            "--devices", str(devices)]
    assert main(argv) == 2
    assert "no link bandwidths" in capsys.readouterr().err


@pytest.mark.parametrize("text, gpus, says", [
    ("pp=4", 4, "pp=4 needs at least 4 repeated blocks"),
    ("tp=3", 3, "tp=3 does not divide"),
    ("dp=2,ep=2", None, "must divide the experts"),
])
def test_a_strategy_the_model_cannot_take_says_why(gpt: tuple[Report, ModelFacts], text: str,
                                                   gpus: int | None, says: str) -> None:
    from fxlens.analyzer.plan.search import misfits

    _, facts = gpt
    assert any(says in problem for problem in misfits(facts, parse(text, gpus)))
    assert misfits(facts, parse("dp=2,tp=2,pp=2", None)) == []


# --- context parallelism, interleaving, expert parallelism ------------------------------------


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_divides_activations_and_work(gpt: tuple[Report, ModelFacts],
                                                       cp: int) -> None:
    _, facts = gpt
    one, split = layout(facts, "dp=1"), layout(facts, f"dp=1,cp={cp}")
    saved = sum(u.saved_bytes for u in facts.units)
    assert one.memory.activations_bytes == pytest.approx(saved, abs=2)
    assert split.memory.activations_bytes == pytest.approx(saved / cp, abs=2)
    assert split.time.compute_s == pytest.approx(one.time.compute_s / cp)
    assert split.gpus == cp and split.time.tokens_per_step == one.time.tokens_per_step


@pytest.mark.parametrize("cp, m", [(2, 1), (4, 3)])
def test_ring_attention_passes_k_and_v_round_the_ring(gpt: tuple[Report, ModelFacts], cp: int,
                                                      m: int) -> None:
    """Per layer: (cp − 1)/cp of the K/V bytes forward, twice that backward (K/V and their
    gradients), each GPU sending its 1/cp chunk cp − 1 times."""
    _, facts = gpt
    blocks = [u for u in facts.units if u.name.startswith("blocks.")]
    kv = 2 * B * S * H * BF16                      # K and V of one layer, every head
    assert all(u.attention.kv_bytes == kv for u in blocks)
    (ring,) = [c for c in layout(facts, f"dp=1,cp={cp}", m=m).collectives
               if c.cause.startswith("ring")]
    assert ring.kind == "p2p" and ring.group == cp and ring.bytes == kv // cp
    assert ring.calls * ring.bytes == 3 * (cp - 1) * kv // cp * len(blocks) * m
    bandwidth = H100.link_bytes_per_s(True)
    send_s = BASE_S + NVLINK_HOP_S                 # one ring step per send
    assert ring.time_s == pytest.approx(ring.calls * (send_s + ring.bytes / bandwidth))


@pytest.mark.parametrize("cp, m", [(2, 1), (4, 3)])
def test_ulysses_all_to_alls_move_q_k_v_and_the_output_per_layer(
        gpt: tuple[Report, ModelFacts], cp: int, m: int) -> None:
    """``cp_comm=a2a``: per layer and pass, this GPU's 1/cp of Q, K, V and the output goes
    through all-to-alls (forward and backward: twice), none of it hidden."""
    _, facts = gpt
    blocks = [u for u in facts.units if u.name.startswith("blocks.")]
    q = out = B * S * H * BF16
    kv = 2 * B * S * H * BF16
    assert all((u.attention.q_bytes, u.attention.out_bytes) == (q, out) for u in blocks)
    planned = layout(facts, f"dp=1,cp={cp},cp_comm=a2a", m=m)
    (a2a,) = [c for c in planned.collectives if "(cp" in c.cause]
    assert a2a.kind == "all-to-all" and a2a.group == cp and not a2a.overlapped
    assert a2a.calls * a2a.bytes == pytest.approx(2 * (q + kv + out) / cp * len(blocks) * m)
    assert planned.time.context_parallel_s == pytest.approx(a2a.time_s)


def test_kv_all_gathers_move_the_whole_sequences_k_and_v(gpt: tuple[Report, ModelFacts]
                                                         ) -> None:
    _, facts = gpt
    blocks = [u for u in facts.units if u.name.startswith("blocks.")]
    kv = 2 * B * S * H * BF16
    gather, scatter = [c for c in layout(facts, "dp=1,cp=4,cp_comm=allgather", m=2).collectives
                       if "(cp" in c.cause]
    assert (gather.kind, scatter.kind) == ("all-gather", "reduce-scatter")
    assert gather.bytes == scatter.bytes == kv
    assert gather.calls == scatter.calls == len(blocks) * 2


def test_cp_comm_needs_context_parallelism_and_a_known_exchange() -> None:
    with pytest.raises(ValueError, match="needs cp > 1"):
        parse("dp=2,cp_comm=a2a")
    with pytest.raises(ValueError, match="p2p, a2a, allgather"):
        parse("dp=2,cp=2,cp_comm=ulysses")
    assert parse("dp=2,cp=2,cp_comm=a2a").label == "dp=2,cp=2,cp_comm=a2a"


@pytest.mark.parametrize("text, forwards", [("dp=1,tp=2,sp", 1), ("dp=2,tp=2", 1),
                                            ("dp=2,tp=2,ckpt", 2)])
def test_tp_overlap_leaves_one_chunk_and_what_the_gemms_do_not_cover(
        gpt: tuple[Report, ModelFacts], text: str, forwards: int) -> None:
    """``tp-overlap``: each GEMM in tp chunks, a chunk's transfer beside the next one's
    product: of T seconds of transfers beside G seconds of split GEMMs (a recomputed forward's
    too), max(0, T − G) + T/tp stay on the critical path; without it all T."""
    _, facts = gpt
    m = 3
    plain = layout(facts, text, m=m)
    hidden = layout(facts, f"{text},tp-overlap", m=m)
    transfers = plain.time.tensor_parallel_s
    gemms = m * sum(forwards * u.forward_split_s + u.backward_split_s
                    for u in facts.units) / 2
    assert transfers > 0 and plain.time.tensor_parallel_exposed_s is None
    assert hidden.time.tensor_parallel_s == pytest.approx(transfers)
    assert hidden.time.tensor_parallel_exposed_s == pytest.approx(
        max(0.0, transfers - gemms) + transfers / 2)
    tp_transfers = [c for c in hidden.collectives if c.cause.startswith("tp ")]
    assert tp_transfers and all(c.overlapped for c in tp_transfers)
    assert hidden.time.step_s < plain.time.step_s
    with pytest.raises(ValueError, match="needs tp > 1"):
        parse("dp=2,tp-overlap")


def test_context_parallel_ranks_share_zero_and_reduce_gradients(
        gpt: tuple[Report, ModelFacts]) -> None:
    """The GPUs of a context-parallel group hold the same weights: the optimizer shards and
    the gradient reduction span dp · cp."""
    _, facts = gpt
    sharded = layout(facts, "dp=2,cp=2,zero=1").memory
    assert sharded.optimizer_bytes == pytest.approx(
        layout(facts, "dp=1").memory.optimizer_bytes / 4, abs=4 * len(facts.units))
    (grads, _) = [c for c in layout(facts, "dp=2,cp=2,zero=1").collectives
                  if "ZeRO-1" in c.cause]
    assert grads.group == 4


@pytest.mark.parametrize("pp, v, m, stage, chunks", [
    (4, 1, 8, 0, 4), (4, 1, 2, 0, 2), (4, 1, 8, 3, 1),
    (4, 2, 8, 0, 2 * 3 + 4 + 1), (4, 2, 8, 3, 4 + 1), (4, 3, 2, 0, 2 * 3),
])
def test_interleaved_1f1b_keeps_megatrons_warm_up_in_flight(pp: int, v: int, m: int,
                                                            stage: int, chunks: int) -> None:
    """Megatron-core: 2(p − i − 1) + (v − 1)p warm-up chunks + 1, at most m·v, each 1/v of
    a stage's layers; plain 1F1B min(m, p − i) micro-batches."""
    strategy = Strategy(dp=1, pp=pp, v=v, micro_batches=m)
    assert in_flight(strategy, stage) == pytest.approx(chunks / v if v > 1 else chunks)


def _unwarmed(facts: ModelFacts) -> ModelFacts:
    """`facts` as new objects, nothing remembered on them yet."""
    from dataclasses import replace

    return replace(facts, units=tuple(replace(u, parts=tuple(replace(p) for p in u.parts))
                                      for u in facts.units))


def test_a_layouts_estimate_does_not_depend_on_those_estimated_before(
        gpt: tuple[Report, ModelFacts]) -> None:
    """Units and the model remember what a layout derives from them, per the degrees it
    reads: a search's earlier layouts (here the same ones without sequence parallel, or with
    other tp, cp or recompute) must not leak into a later one's figures."""
    from fxlens.analyzer.plan.auto_recompute import frontier

    _, facts = gpt
    target = parse("dp=2,tp=2,pp=2,sp,ckpt=act", 8, 4)
    alone = estimate(_unwarmed(facts), target, H100)
    alone_frontier = frontier(_unwarmed(facts), target)
    warmed = _unwarmed(facts)
    for text in ("tp=4", "dp=2,tp=2,pp=2,ckpt=act", "dp=2,tp=2,pp=2,ckpt=norm", "dp=8",
                 "dp=2,tp=2,cp=2", "dp=4,tp=2,sp"):
        before = parse(text, 8, 4)
        estimate(warmed, before, H100)
        frontier(warmed, before)
    assert estimate(warmed, target, H100) == alone
    assert frontier(warmed, target) == alone_frontier
