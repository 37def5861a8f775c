"""The host's floor under a layout's micro-batch (`fxlens.analyzer.plan.host`): every GPU of a
stage launches its units' kernels at the device's framework cost each, whatever the layout
splits; CUDA graphs (``graphs``) take launches away; a micro-batch takes the longer of the
host's time and the GPUs'."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.host import launches
from fxlens.analyzer.plan.strategy import parse
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.plan.workload import ModulePart
from tests.analyzer.conftest import FakeLinks

LAUNCH_S = 40e-6
HOST = FakeLinks(framework_launch_s=LAUNCH_S)


def block(name: str, forward_s: float = 0.0) -> Unit:
    """A block launching 30 kernels forward, 50 backward: 10 + 20 of them its attention's."""
    parts = (ModulePart(f"{name}.self_attn", forward_whole_s=forward_s / 2, types=("attention",),
                        launches=(10, 20)),
             ModulePart(f"{name}.mlp", forward_whole_s=forward_s / 2, types=("mlp",),
                        launches=(20, 30)))
    return Unit(name=name, forward_whole_s=forward_s, backward_whole_s=2 * forward_s,
                launches=(30, 50), parts=parts)


def facts(forward_s: float = 0.0, layers: int = 4) -> ModelFacts:
    units = (Unit(name="pre", launches=(2, 1)),
             *(block(f"layers.{i}", forward_s) for i in range(layers)),
             Unit(name="post", launches=(5, 4)))
    return ModelFacts(units=units, blocks=layers, experts=0, moments=(),
                      optimizer_temporaries_bytes=0, optimizer_s=0.0, samples=1, tokens=1024,
                      dtype_key="bf16", peak_flops=1e15)


def test_each_gpu_launches_every_kernel_of_its_stage_whatever_the_split() -> None:
    model = facts()
    whole = 3 + 4 * 80 + 9
    for text in ("dp=1", "dp=1,tp=4", "dp=1,cp=2", "dp=2,tp=2,sp"):
        assert launches(parse(text), model.units) == whole
    # a recomputed forward launches again: every block's, or the recomputed parts'
    assert launches(parse("dp=1,ckpt"), model.units) == whole + 4 * 30
    assert launches(parse("dp=1,ckpt=attn"), model.units) == whole + 4 * 10


def test_cuda_graphs_replay_launches_the_host_no_longer_makes() -> None:
    model = facts()
    assert launches(parse("dp=1,graphs"), model.units) == 0
    assert launches(parse("dp=1,graphs=layers"), model.units) == 3 + 9      # pre and post
    assert launches(parse("dp=1,graphs=attn"), model.units) == 3 + 4 * 50 + 9
    # a recomputed part that a graph replays launches nothing again
    assert launches(parse("dp=1,graphs=attn,ckpt=attn"), model.units) == 3 + 4 * 50 + 9


@pytest.mark.parametrize("m", [1, 8])
def test_a_micro_batch_takes_the_longer_of_the_host_and_the_gpus(m: int) -> None:
    host_s = (3 + 4 * 80 + 9) * LAUNCH_S             # 13.3 ms per micro-batch
    quick = estimate(facts(forward_s=1e-4), parse("dp=1", None, m), HOST).time
    gpu_s = 4 * 3e-4                                 # forward + backward of the four blocks
    assert quick.host_s == pytest.approx(m * host_s)
    assert quick.compute_s == pytest.approx(m * gpu_s)
    assert quick.host_wait_s == pytest.approx(m * (host_s - gpu_s))
    assert quick.step_s == pytest.approx(m * host_s + quick.optimizer_s)
    slow = estimate(facts(forward_s=1e-2), parse("dp=1", None, m), HOST).time
    assert slow.host_wait_s == 0.0 and slow.step_s == pytest.approx(m * 4 * 3e-2
                                                                    + slow.optimizer_s)
    graphed = estimate(facts(forward_s=1e-4), parse("dp=1,graphs", None, m), HOST).time
    assert graphed.host_s == 0.0 and graphed.host_wait_s == 0.0


def test_a_pipeline_stage_launches_only_its_own_units() -> None:
    stages = estimate(facts(), parse("dp=1,pp=2"), HOST).time
    whole = estimate(facts(), parse("dp=1"), HOST).time
    # the busier stage holds two blocks and the head: (2 · 80 + 9) of (3 + 4 · 80 + 9)
    assert stages.host_s == pytest.approx((2 * 80 + 9) * LAUNCH_S)
    assert whole.host_s == pytest.approx((3 + 4 * 80 + 9) * LAUNCH_S)


def test_graph_scopes_parse_and_read_back() -> None:
    assert parse("dp=1,graphs").label == "dp=1,graphs"
    assert parse("dp=1,graphs=attn+moe_router").graphs == ("attn", "moe_router")
    assert parse(parse("dp=1,graphs=attn+moe_router").label).graphs == ("attn", "moe_router")
    with pytest.raises(ValueError, match="graphs=full replays the whole step"):
        parse("dp=1,graphs=full+attn")
    with pytest.raises(ValueError, match="graphs is given twice"):
        parse("dp=1,graphs,graphs=attn")


def test_a_captured_units_launches_are_its_costed_ops_by_phase(
        gpt: tuple[Report, ModelFacts]) -> None:
    """tiny_gpt's units count the report's costed nodes, forward and backward, node by node;
    the blocks' parts split them by module."""
    report, model = gpt
    by_unit: Counter[tuple[str, str]] = Counter()
    for node in report.nodes:
        if node.status != "costed":
            continue
        unit = next((u.name for u in model.units if u.name not in ("pre", "post")
                     and (node.module == u.name or node.module.startswith(u.name + "."))),
                    None)
        by_unit[(unit or "outside", node.phase)] += 1
    blocks = [u for u in model.units if u.name not in ("pre", "post")]
    assert blocks
    for unit in blocks:
        assert unit.launches == (by_unit[(unit.name, "forward")],
                                 by_unit[(unit.name, "backward")])
        assert sum(p.launches[0] for p in unit.parts) == unit.launches[0]
    outside = sum(u.launches[0] + u.launches[1] for u in model.units
                  if u.name in ("pre", "post"))
    assert outside == by_unit[("outside", "forward")] + by_unit[("outside", "backward")]


def test_the_devices_framework_cost_is_the_published_traces() -> None:
    """10.6 ms of host time over 228 kernels launched per MoE layer's forward and backward in
    DeepSeek-V3's published training trace (fxlens.rules.hardware)."""
    from fxlens.rules.hardware import DEVICES

    assert DEVICES["h100"].framework_launch_s == pytest.approx(46.5e-6, rel=0.01)
    assert DEVICES["gb200"].framework_launch_s == DEVICES["h100"].framework_launch_s
    assert dataclasses.replace(DEVICES["h100"], framework_launch_s=0).framework_launch_s == 0


def test_the_verdict_names_a_host_bound_step_and_what_lifts_it() -> None:
    from fxlens.analyzer.core.sections import Plan
    from fxlens.reports.views.plan import plan_verdict

    def verdict(text: str) -> str:
        layout = estimate(facts(forward_s=1e-4), parse(text, None, 8), HOST)
        plan = Plan(device="test", device_bytes=HOST.usable_bytes, gpus_per_node=8,
                    intra_node_bytes_per_s=1.0, inter_node_bytes_per_s=1.0,
                    link_efficiency=1.0, link_source="", micro_batch_samples=1,
                    micro_batch_tokens=1024, blocks=4, experts=0, tensor_parallel_pairs=0,
                    ranked_by="requested", layouts=(layout,), considered=1, dropped=(),
                    dropped_by_reason={}, assumptions=())
        return plan_verdict(plan).detail

    assert "host-bound, 91% waits for launches (graphs)" in verdict("dp=1")
    assert "host-bound" not in verdict("dp=1,graphs")
