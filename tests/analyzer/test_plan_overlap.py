"""What a step's compute hides of its data-parallel transfers, against the schedules' closed
forms: without interleaving the gradient reduce hides behind the last backward and ZeRO-1's
weight gather behind the first forward; interleaved 1F1B hides chunk k's share behind the
``k·g + 1`` chunk phases after it (g = min(p, m) micro-batches per group); FSDP behind all of
its compute. And ZeRO-1/2 gathers the trainable weights in their working dtype: an fp8 run's
cached fp8 copies are not sent."""

from __future__ import annotations

import pytest

from fxlens.analyzer.capture.load import load
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Collective
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.overlap import exposed_s, halves_s, late_s
from fxlens.analyzer.plan.strategy import Strategy, parse
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.plan_pass import plan_facts
from fxlens.rules.hardware import device
from tests.analyzer.conftest import MODELS, FakeLinks
from tests.analyzer.test_plan import layout


@pytest.mark.parametrize("transfer, phase, late", [(1.0, 0.4, 0.6), (0.3, 0.4, 0.0)])
def test_one_chunk_hides_behind_one_micro_batch(transfer: float, phase: float,
                                                late: float) -> None:
    for s in (Strategy(dp=8, micro_batches=4), Strategy(dp=2, pp=4, micro_batches=8)):
        assert late_s(transfer, phase, s) == pytest.approx(late)


def test_interleaved_chunks_hide_behind_the_groups_after_them() -> None:
    # p = 4, v = 2, m = 8: chunk 0 (half the transfer, 0.5 s) has one chunk phase (0.2 s),
    # chunk 1 runs after it and has 4 + 1 of them: late by max(0.5 − 0.2, 1.0 − 1.0)
    s = Strategy(dp=2, pp=4, v=2, micro_batches=8)
    assert late_s(1.0, 0.4, s) == pytest.approx(0.3)
    # a longer transfer: chunk 1 decides, 2.0 − 5 · 0.2
    assert late_s(2.0, 0.4, s) == pytest.approx(1.0)
    # fewer micro-batches than stages: groups of m (2), chunk 1 has 2 + 1 phases
    short = Strategy(dp=2, pp=4, v=2, micro_batches=2)
    assert late_s(1.0, 0.4, short) == pytest.approx(max(0.5 - 0.2, 1.0 - 3 * 0.2))
    assert late_s(0.0, 0.4, s) == 0.0


def collective(kind: str, seconds: float) -> Collective:
    return Collective(kind=kind, cause="", group=8, across_nodes=False, bytes=1, calls=1,
                      time_s=seconds, overlapped=True)


def test_zero1_gathers_beside_forwards_and_fsdp_beside_everything() -> None:
    moved = [collective("reduce-scatter", 0.5), collective("all-gather", 0.3)]
    zero1, fsdp = Strategy(dp=8, zero=1, micro_batches=2), Strategy(dp=8, zero=3,
                                                                    micro_batches=2)
    assert halves_s(zero1, moved, extra_s=0.1) == pytest.approx((0.6, 0.3))
    assert halves_s(fsdp, moved) == pytest.approx((0.8, 0.0))
    # forwards 0.4 s and backwards 0.6 s over two micro-batches: 0.2 and 0.3 s each
    assert exposed_s(zero1, 0.5, 0.3, 0.4, 0.6) == pytest.approx((0.5 - 0.3) + (0.3 - 0.2))
    assert exposed_s(fsdp, 0.5, 0.3, 0.4, 0.6) == 0.0
    assert exposed_s(fsdp, 0.9, 0.3, 0.4, 0.6) == pytest.approx(0.2)


def test_interleaving_hides_more_of_the_same_transfers(gpt: tuple[Report, ModelFacts]
                                                       ) -> None:
    _, facts = gpt
    slow = FakeLinks(nvlink=2e7, nic=2e7)         # transfers longer than a micro-batch
    plain = estimate(facts, parse("dp=16,pp=2,zero=1", None, 8), slow).time
    interleaved = estimate(facts, parse("dp=16,pp=2,v=2,zero=1", None, 8), slow).time
    assert interleaved.data_parallel_s == pytest.approx(plain.data_parallel_s)
    assert 0 < interleaved.data_parallel_exposed_s < plain.data_parallel_exposed_s


def test_zero1_gathers_the_working_weights_not_the_fp8_copies() -> None:
    loaded = load(str(MODELS / "tiny_gpt.py"))
    options = AnalysisOptions(train=True, precision="fp8", plan=True, strategy="zero1",
                              gpus=8, strict=True)
    ctx = Context(loaded, options, lambda _: None)
    facts = plan_facts(ctx, run_context(ctx), device("h100"))
    moved = {c.kind: c.bytes for c in layout(facts, "zero1", 8).collectives}
    weights = sum(u.states.weights_bytes for u in facts.units)
    assert weights > moved["all-gather"]            # the fp8 copies are state, not sent
    assert moved["all-gather"] == moved["reduce-scatter"]
