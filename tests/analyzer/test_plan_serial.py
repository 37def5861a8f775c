"""A recurrence's serial steps in the plan (`fxlens.analyzer.plan.serial`): kept apart from the
seconds a layout divides, re-sized per layout — tensor parallelism divides the programs and so
the waves, context parallelism the chunks each rank walks — against closed forms; and on a
captured gated-DeltaNet model, the steps the roofline priced are the plan's."""

from __future__ import annotations

import dataclasses
import math

import pytest

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.plan.serial import SerialSteps
from fxlens.analyzer.plan.strategy import parse
from fxlens.analyzer.plan.unit_share import phase_s
from fxlens.analyzer.time.roofline import node_times
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.plan_pass import plan_facts
from fxlens.rules.hardware import device
from tests.models.hf_zoo_hybrid import build_qwen3_next


@pytest.mark.parametrize("programs, tp, cp, waves", [
    (128, 1, 1, 1), (128, 2, 1, 1),        # one wave on 132 SMs either way: tp shortens nothing
    (512, 1, 1, 4), (512, 2, 1, 2), (512, 4, 1, 1),
    (512, 1, 2, 4),                        # cp: half the chunks per rank, the same waves
])
def test_steps_follow_the_waves_tp_leaves_and_the_chunks_cp_leaves(
        programs: int, tp: int, cp: int, waves: int) -> None:
    steps = SerialSteps("forward", wave_s=1e-3, programs=programs, multiprocessors=132,
                        split=True)
    assert steps.on_rank(tp, cp) == pytest.approx(1e-3 * waves / cp)
    replicated = dataclasses.replace(steps, split=False)
    assert replicated.on_rank(tp, 1) == pytest.approx(1e-3 * math.ceil(programs / 132))


def test_a_captured_delta_rule_keeps_its_steps_apart_and_whole_under_tp() -> None:
    module, inputs = build_qwen3_next()
    options = AnalysisOptions(train=True, plan=True, strategy="ddp", gpus=2, device="h100")
    ctx = Context(LoadedModel(module, inputs, "qwen3-next", "zoo"), options, lambda _: None)
    report = run_context(ctx)
    h100 = device("h100")
    facts = plan_facts(ctx, report, h100)
    serial = {t.id: t.serial_s for t in node_times(report, ctx.step.graph, h100)
              if t.serial_s > 0}
    steps = [s for u in facts.units for s in u.serials]
    assert sorted(s.phase for s in steps) == ["backward", "forward"]     # one DeltaNet layer
    assert sum(s.on_rank(1, 1) for s in steps) == pytest.approx(sum(serial.values()))
    block = next(u for u in facts.units if u.serials)
    work_only = dataclasses.replace(block, serials=())
    for phase in ("forward", "backward"):
        mine = sum(s.on_rank(1, 1) for s in block.serials if s.phase == phase)
        assert mine > 0
        for text in ("dp=2", "tp=2"):   # 4 programs: one wave at either, the steps whole
            layout = parse(text, 2)
            assert phase_s(layout, block, phase) == pytest.approx(
                phase_s(layout, work_only, phase) + mine)
