"""``a2a-overlap`` as Megatron-core's combined 1F1B runs it: one layer's forward beside another
micro-batch's backward of a layer, each all-to-all hidden only behind the compute it is
paired with (`fxlens.analyzer.plan.a2a_overlap`), timed by hand on the two streams."""

from __future__ import annotations

import pytest

from fxlens.analyzer.plan.a2a_overlap import expert_exposed_s, layer_pair_s
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import Unit
from fxlens.analyzer.plan.workload import ExpertWork

EP = 8


def layer(attention: tuple[float, float], experts: tuple[float, float],
          routed_bytes: int = 1) -> Unit:
    """A MoE layer taking `attention` and `experts` seconds (forward, backward) on a GPU
    holding 1/EP of the experts."""
    return Unit(name="b0", routed_bytes=routed_bytes, routed_rows=1,
                forward_whole_s=attention[0], backward_whole_s=attention[1],
                expert_work=ExpertWork(experts[0] * EP, experts[1] * EP))


@pytest.mark.parametrize("q, expected", [
    (0.0, 6.0),       # nothing to send: the compute alone
    (0.5, 6.0),       # every transfer shorter than the compute it is paired with
    # combine bwd 1.5 beside attention fwd 1: 0.5 exposed; the rest hides
    # (dgrad 1.5–2.5, dispatch fwd 1.5–3, wgrad –3.5, dispatch bwd 3–4.5, experts fwd
    # 3.5–4.5, attention bwd 4.5–6.5 beside combine fwd 4.5–6)
    (1.5, 6.5),
    (3.0, 12.0),      # the four transfers back to back: the compute waits on each
])
def test_a_layer_pair_on_two_streams(q: float, expected: float) -> None:
    """Attention forward 1 s, experts forward 1 s, attention backward 2 s, experts backward
    2 s (1 s data gradient, then 1 s weight gradient)."""
    assert layer_pair_s(q, 1.0, 1.0, 2.0, 2.0) == pytest.approx(expected)


def test_no_compute_leaves_the_four_transfers_exposed() -> None:
    assert layer_pair_s(1.0, 0.0, 0.0, 0.0, 0.0) == pytest.approx(4.0)


def test_a_dispatch_longer_than_the_experts_is_exposed_though_the_step_is_longer() -> None:
    """The step's compute (4 × 10 s of attention) dwarfs its transfers (4 × 2 s), but the
    dispatch runs beside the experts' 0.2 s, not beside the attention: what a stage-wide
    budget would call hidden is not."""
    exposed = layer_pair_s(2.0, 10.0, 0.1, 10.0, 0.2) - (10.0 + 0.1 + 10.0 + 0.2)
    assert exposed == pytest.approx(2.0 + 2.0 - 0.2 - 0.1)   # dispatch fwd and bwd in a row


def test_without_a2a_overlap_every_transfer_is_exposed() -> None:
    units = [layer((1e9, 1e9), (1e9, 1e9))]
    assert expert_exposed_s(Strategy(dp=EP, ep=EP, micro_batches=4), units, 8.0) == 8.0


@pytest.mark.parametrize("compute_s, exposed", [
    (1e9, 8.0 / 4),           # all hidden but the first forward's and the last backward's
    (0.0, 8.0),               # nothing to hide behind
])
def test_a2a_overlap_pairs_the_steady_state_only(compute_s: float, exposed: float) -> None:
    """Four micro-batches, no pipeline: the first forward has no backward beside it, the last
    backward no forward (one micro-batch's transfers of four run alone)."""
    s = Strategy(dp=EP, ep=EP, micro_batches=4, a2a_overlap=True)
    units = [layer((compute_s, compute_s), (compute_s, compute_s))]
    assert expert_exposed_s(s, units, 8.0) == pytest.approx(exposed)


@pytest.mark.parametrize("stage, alone", [
    (0, (2 * 3 + 1 * 4 + 1) / 16),      # warm-up 2(p − 1) + (v − 1)p chunks, and one more
    (3, (0 + 1 * 4 + 1) / 16)])         # the last stage warms up (v − 1)p + 1
def test_a2a_overlap_leaves_an_interleaved_pipelines_warm_up_and_cool_down_exposed(
        stage: int, alone: float) -> None:
    """On stage i of p = 4, v = 2, m = 8 the chunks it warms up (forwards with no backward
    yet) and as many cool-down backwards run alone."""
    s = Strategy(dp=EP, pp=4, v=2, ep=EP, micro_batches=8, a2a_overlap=True)
    busy, idle = [layer((1e9, 1e9), (1e9, 1e9))], [layer((0.0, 0.0), (0.0, 0.0))]
    assert expert_exposed_s(s, busy, 8.0, stage) == pytest.approx(8.0 * alone)
    assert expert_exposed_s(s, idle, 8.0, stage) == pytest.approx(8.0)


def test_layers_share_the_transfers_by_their_routed_bytes() -> None:
    """16 s of transfers over two micro-batches, two layers routing 3:1: the first layer's
    four transfers of each micro-batch take 1.5 s each, the second's 0.5 s; beside 1 s of
    each compute only the first's exposes (by `layer_pair_s`), in the one paired
    micro-batch's half of the step."""
    s = Strategy(dp=EP, ep=EP, micro_batches=2, a2a_overlap=True)
    units = [layer((1.0, 2.0), (1.0, 2.0), routed_bytes=3), layer((1.0, 2.0), (1.0, 2.0))]
    paired = (layer_pair_s(1.5, 1.0, 1.0, 2.0, 2.0) - 6.0) + (layer_pair_s(0.5, 1.0, 1.0, 2.0,
                                                                          2.0) - 6.0)
    assert paired == pytest.approx(0.5)
    assert expert_exposed_s(s, units, 16.0) == pytest.approx(paired * 2 * 0.5 + 16.0 * 0.5)
