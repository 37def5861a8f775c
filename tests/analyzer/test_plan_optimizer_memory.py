"""The optimizer step's temporaries per GPU follow the state that GPU updates (its pipeline
stage's layers, 1/t of split weights, a ZeRO shard; none when the step runs on the host), on
tests/models/tiny_gpt.py under AMP bf16 + AdamW, whose step peaks in the optimizer phase: the
multi-tensor AdamW's temporaries are a copy of the states it updates at once."""

from __future__ import annotations

import pytest

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import PlanMemory
from fxlens.analyzer.plan.structure import ModelFacts
from tests.analyzer.test_plan import layout

Facts = tuple[Report, ModelFacts]


def _optimizer_phase_temporaries(m: PlanMemory) -> int:
    """What the peak holds beyond state, gradients and buffers when the optimizer phase is
    the larger one: its temporaries."""
    persistent = m.weights_bytes + m.master_bytes + m.optimizer_bytes + m.buffers_bytes
    return m.peak_bytes - persistent - m.gradients_bytes - m.gathered_bytes - m.communication_bytes


@pytest.mark.parametrize("text, gpus", [
    ("ddp", 1), ("ddp", 2), ("dp=1,pp=2", None), ("dp=1,tp=2", None), ("dp=2,zero=1", None),
    ("dp=2,zero=3", None), ("dp=2,pp=2,zero=1", None),
])
def test_temporaries_follow_the_state_a_gpu_updates(gpt: Facts, text: str, gpus: int | None
                                                    ) -> None:
    _, facts = gpt
    m = layout(facts, text, gpus).memory
    full = facts.states.master_bytes + facts.states.optimizer_bytes
    share = (m.master_bytes + m.optimizer_bytes) / full
    assert m.activations_bytes < facts.optimizer_temporaries_bytes * share   # phase dominates
    assert _optimizer_phase_temporaries(m) == pytest.approx(
        facts.optimizer_temporaries_bytes * share, abs=2)


def test_a_pipeline_stage_holds_its_layers_temporaries_only(gpt: Facts) -> None:
    _, facts = gpt
    whole = _optimizer_phase_temporaries(layout(facts, "ddp", 1).memory)
    staged = _optimizer_phase_temporaries(layout(facts, "dp=1,pp=2").memory)
    assert staged < 0.8 * whole


def test_offloaded_optimizer_leaves_no_temporaries_on_the_gpu(gpt: Facts) -> None:
    _, facts = gpt
    m = layout(facts, "dp=2,offload").memory
    assert m.master_bytes == m.optimizer_bytes == 0 and m.host_bytes > 0
    assert m.temporaries_bytes == 0
