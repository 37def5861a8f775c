"""The `training` report section, with the expected figures derived by hand."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from fxlens.analyzer.capture.hf_llama4_moe import routed_llama4_experts
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.memory.measure import measure_memory
from fxlens.api import AnalysisOptions, analyze_loaded, analyze_target
from tests.models import OWN_ZOO
from tests.models.hf_zoo import ZOO as HF_ZOO

ZOO = {**OWN_ZOO, **{f"hf-{k}": v for k, v in HF_ZOO.items()}}

MLP = "tests/models/mlp.py"          # 32 → 64 → 64 → 10, batch 4
GPT = "tests/models/tiny_gpt.py"     # 2 blocks
MLP_PARAMS = (32 * 64 + 64) + (64 * 64 + 64) + (64 * 10 + 10)


@functools.cache
def step(target: str, **options: Any) -> Report:
    return analyze_target(target, AnalysisOptions(train=True, **options))


def training(target: str, **options: Any) -> dict[str, Any]:
    return step(target, **options).to_dict()["training"]


def test_fp32_adamw_states_are_16_bytes_per_parameter() -> None:
    states = training(MLP)["states"]
    assert states["weights_bytes"] == states["grad_bytes"] == 4 * MLP_PARAMS
    assert states["optimizer_bytes"] == 8 * MLP_PARAMS
    assert states["total"] == 16 * MLP_PARAMS


def test_amp_bf16_states_and_captured_gradients() -> None:
    section = training(MLP, precision="amp-bf16", optimizer="adam")
    states = section["states"]
    assert states["total"] == (4 + 2 + 2 + 8) * MLP_PARAMS
    report = step(MLP, precision="amp-bf16", optimizer="adam")
    assert report.to_dict()["memory"]["peak_by_category"]["gradient"] == 2 * MLP_PARAMS


def test_step_flops_add_up() -> None:
    section = training(MLP)
    assert section["optimizer_flops"] == 14 * MLP_PARAMS        # AdamW, per element
    assert section["step_flops"] == (section["forward_flops"] + section["backward_flops"]
                                     + section["optimizer_flops"])
    report = step(MLP)
    assert section["forward_flops"] + section["backward_flops"] == report.totals.flops


def test_saved_activations_of_the_mlp() -> None:
    """relu saves its output (also fc2's saved input), gelu saves its input (fc2's output),
    fc3 saves gelu's output; fc1's input is a graph input, not an activation."""
    batch, hidden = 4, 64
    section = training(MLP)
    assert section["saved_activation_bytes"] == 3 * batch * hidden * 4
    modules = {entry["module"] for entry in section["saved_by_module"]}
    assert modules == {"act1", "fc2", "act2"}


def test_step_peak_is_persistent_state_plus_the_larger_phase() -> None:
    section = training(MLP)
    parts = section["peak_breakdown"]
    assert parts["persistent_bytes"] == (4 + 8) * MLP_PARAMS          # weights + AdamW m, v
    assert section["step_peak_bytes"] == parts["persistent_bytes"] + max(
        parts["fwd_bwd_peak_bytes"], parts["optimizer_phase_bytes"])


def test_checkpointing_recomputes_each_block_forward() -> None:
    section = training(GPT, checkpoint=True)
    ckpt = section["checkpointing"]
    assert ckpt["blocks"] == ["blocks.0", "blocks.1"]
    report = step(GPT, checkpoint=True)
    block_forward = sum(n.flops for n in report.nodes
                        if n.phase == "forward" and n.module.startswith("blocks."))
    assert ckpt["recompute_flops"] == block_forward
    assert ckpt["memory_saved_bytes"] > 0
    assert ckpt["flops_overhead"] == pytest.approx(block_forward / section["step_flops"])


def test_fit_verdict_and_largest_batch() -> None:
    small = training(MLP, device_memory="100KB")["fit"]
    assert small["fits"] is False and small["headroom_bytes"] < 0
    assert small["largest_batch"] == 0
    big = training(MLP, device_memory="h100")["fit"]
    assert big["fits"] is True and big["device"] == "h100"
    assert big["largest_batch"] > 4


# Models whose step peak we under-predict beyond the tolerance, why, and the lowest ratio
# (predicted / measured) as measured on torch 2.13 CPU.
STEP_DIVERGENCES = {
    # chunked gated delta rules are one op as flash-linear-attention's kernels
    # (fxlens.analyzer.capture.hf_gdn); the real CPU step runs transformers' reference rule,
    # saving its float32 copies and per-chunk matrices (KDA's per key channel) for the backward
    name: ("the real CPU step saves the reference gated delta rule's per-chunk matrices", bound)
    for name, bound in (("hf-qwen3_next", 0.76), ("hf-qwen3_5", 0.66), ("hf-olmo_hybrid", 0.64),
                        ("hf-kimi_linear", 0.08))
} | {
    # Mamba-2's scan is one op as mamba_ssm's kernel (fxlens.analyzer.capture.hf_ssd); the
    # real CPU step runs transformers' reference scan, saving its per-chunk matrices for the
    # backward (in the hybrids their attention and MLP layers set the peak: 0.98)
    "hf-mamba2": ("the real CPU step saves the reference scan's per-chunk matrices", 0.68),
    # Mamba-1's selective scan is one op as mamba_ssm's kernel
    # (fxlens.analyzer.capture.hf_selective_scan); the real CPU step runs transformers'
    # reference, saving its discretised A and B·u per channel, token and state
    "hf-mamba": ("the real CPU step saves the reference scan's per-token states", 0.40),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_first_step_peak_within_10_percent_of_a_real_run(name: str) -> None:
    """A real forward, backward and AdamW step on CPU, storages followed as they live: its
    peak against ours for a first step, less the weights and buffers that existed before."""
    module, inputs = ZOO[name]()
    report = analyze_loaded(LoadedModel(module, inputs, name, name),
                            AnalysisOptions(train=True, precision="fp32", device="cpu"))
    section = report.to_dict()["training"]
    states = section["states"]
    predicted = (section["first_step_peak_bytes"] - states["weights_bytes"]
                 - states["buffer_bytes"] - states["master_bytes"])
    module.train()
    with routed_llama4_experts():     # the routed experts a GPU runs, as the graph holds
        measured = measure_memory(module, inputs, train=True).peak_bytes
    if name not in STEP_DIVERGENCES:
        assert predicted == pytest.approx(measured, rel=0.10)
        return
    ratio = predicted / measured
    assert STEP_DIVERGENCES[name][1] <= ratio < 0.90, f"{name}: {ratio:.3f}: update the table"


def test_the_step_names_its_inputs_as_forward_does() -> None:
    report = step("tests/models/dict_io.py")
    assert [i.name for i in report.model.inputs] == ["token_ids", "features", "mask"]
    assert [i.name for i in step(GPT).model.inputs] == ["idx"]


def test_the_peak_names_the_phase_that_decides_it() -> None:
    """The step's peak is the persistent state plus the larger of the forward/backward's live
    tensors and the optimizer step's gradients and temporaries: the label names which."""
    from fxlens.analyzer.core.sections import PeakBreakdown

    forward = PeakBreakdown(persistent_bytes=10, fwd_bwd_peak_bytes=7, gradients_at_peak_bytes=2,
                            optimizer_phase_bytes=5)
    optimizer = PeakBreakdown(persistent_bytes=10, fwd_bwd_peak_bytes=3,
                              gradients_at_peak_bytes=2, optimizer_phase_bytes=5)
    assert forward.on_top == ("activations and gradients", 7)
    assert optimizer.on_top == ("optimizer step (gradients + temporaries)", 5)


@pytest.mark.parametrize("target", [GPT, MLP])
def test_the_live_set_splits_into_saved_working_and_gradients(target: str) -> None:
    """`PeakBreakdown.moments`, against the definition node by node: at the forward/backward's
    peak and where the activations autograd does not save peak, the live saved activations,
    the other activations and the weight gradients."""
    from fxlens.analyzer.capture.load import load
    from fxlens.analyzer.core.graph import NodeKind
    from fxlens.analyzer.core.sections import LiveSplit, Training
    from fxlens.analyzer.memory.liveness import Category, Lifetimes, plan_storages
    from fxlens.pipeline import Context, run_context

    ctx = Context(load(target), AnalysisOptions(train=True, precision="amp-bf16"),
                  lambda _: None)
    parts = run_context(ctx).require(Training).peak_breakdown
    assert ctx.step is not None
    graph = ctx.step.graph
    st = plan_storages(graph, ctx.registry, Lifetimes.EAGER)
    saved = {st.of_ref[r] for r in ctx.step.saved if r in st.of_ref}
    splits = []
    for position, node in enumerate(graph.nodes):
        if node.kind is not NodeKind.CALL:
            continue
        live = [i for i in range(len(st.size)) if st.producer[i] <= position <= st.last[i]]
        acts = [i for i in live if st.category[i] is Category.ACTIVATION]
        splits.append(LiveSplit(
            saved_bytes=sum(st.size[i] for i in acts if i in saved),
            working_bytes=sum(st.size[i] for i in acts if i not in saved),
            gradient_bytes=sum(st.size[i] for i in live if st.category[i] is Category.GRADIENT),
            node=node.id))
    at_peak, working_peak = parts.moments
    assert at_peak in splits and working_peak in splits
    assert (at_peak.saved_bytes + at_peak.working_bytes + at_peak.gradient_bytes
            == parts.fwd_bwd_peak_bytes)
    assert working_peak.working_bytes == max(s.working_bytes for s in splits)
    # both steps peak late in their backward, most of the saved set freed, the working
    # tensors past their own peak: what a plan holding other shares of each must tell apart
    assert at_peak.saved_bytes < max(s.saved_bytes for s in splits) // 2
    assert working_peak != at_peak
