"""Serving steps against closed forms on synthetic kernels (no capture): the tensor-parallel
all-reduces with their per-call latency, routed experts read per step, a step that runs
decode and prompt tokens together, and the in-flight batcher's steady state
(`fxlens.analyzer.serve.steps`, `.kernels`, `.mixed`, `.inflight`)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from fxlens.analyzer.serve.inflight import Engine, steady_state
from fxlens.analyzer.serve.kernels import AffineStep, Kernel, Routing
from fxlens.analyzer.serve.mixed import mixed_s, shared_rows
from fxlens.analyzer.serve.steps import Link, Steps
from fxlens.rules.hardware import device
from fxlens.rules.links import ring_all_reduce_options

H100 = device("h100")
RATE = H100.achievable_flops("bf16")
BW = H100.achievable_bandwidth
LINEAR, ATTENTION = "aten.linear.default", "aten.scaled_dot_product_attention.default"
W, A, F = 2e9, 3e4, 4e7             # a linear kernel's weight bytes, bytes and FLOPs per token
FA, CA = 2e4, 5e3                   # decode attention's FLOPs and bytes per sequence and token
FP, BP = 9e8, 2e6                   # a whole prompt's attention FLOPs and bytes
P = 90                              # prompt tokens


def _step(rows: list[tuple[str, str, list[float], list[float]]], layers: float = 1.0,
          routing: Routing | None = None) -> AffineStep:
    kernels = tuple(Kernel(t, m, "bf16", "", 0.0, 0.0, layers) for t, m, _, _ in rows)
    return AffineStep(kernels, torch.tensor([r[2] for r in rows], dtype=torch.float64),
                      torch.tensor([r[3] for r in rows], dtype=torch.float64),
                      torch.full((len(rows),), layers, dtype=torch.float64), routing)


def _decode(layers: float = 1.0) -> AffineStep:
    """A linear layer (weights W, A bytes and F FLOPs per token) and attention over the
    cache (FA FLOPs and CA bytes per cached token of each sequence)."""
    return _step([(LINEAR, "mlp", [0, F, 0, 0], [W, A, 0, 0]),
                  (ATTENTION, "attn", [0, 0, 0, FA], [0, 0, 0, CA])], layers)


def _prefill(layers: float = 1.0) -> AffineStep:
    """The same linear layer over P tokens per prompt, and a prompt's causal attention."""
    return _step([(LINEAR, "mlp", [0, F * P, 0, 0], [W, A * P, 0, 0]),
                  (ATTENTION, "attn", [0, FP, 0, 0], [0, BP, 0, 0])], layers)


def _steps() -> Steps:
    decode, prefill = _decode(), _prefill()
    return Steps(prefill, decode, shared=shared_rows(decode, prefill,
                                                     lambda k: k.target == LINEAR))


def _roofline(flops: float, moved: float) -> float:
    """A kernel's roofline time, plus the device's gap at a kernel boundary when it runs."""
    return max(flops / RATE, moved / BW) + (H100.graph_launch_s if flops or moved else 0.0)


def _mixed(decodes: float, context: float, prompts: float) -> float:
    """The closed form: one GEMM over decode and prompt tokens reading W once; each
    attention on its own tokens."""
    return (_roofline(F * (decodes + prompts * P), W + A * (decodes + prompts * P))
            + _roofline(FA * decodes * context, CA * decodes * context)
            + _roofline(FP * prompts, BP * prompts))


# --- all-reduces --------------------------------------------------------------------------


def test_each_all_reduce_call_pays_the_links_latency_then_its_ring_bytes() -> None:
    """2 row-parallel outputs per layer, 3 layers, tp = 4: 6 calls a step, each its latency
    plus 2(t−1)/t of its payload (P bytes per sequence) at the link bandwidth."""
    payload, latency, bandwidth = 16384.0, 11e-6, 300e9
    reduce = _step([("all-reduce", "o_proj", [0, 0, 0, 0], [0, payload, 0, 0]),
                    ("all-reduce", "down_proj", [0, 0, 0, 0], [0, payload, 0, 0])], 3.0)
    steps = Steps(_prefill(), _decode(), 4, Link(bandwidth, latency), reduce, reduce)
    for batch in (1, 64):
        expected = 6 * (latency + 2 * 3 / 4 * payload * batch / bandwidth)
        assert float(steps.reduce_s(reduce, batch, [100])[0]) == pytest.approx(expected)
    assert float(Steps(_prefill(), _decode()).reduce_s(reduce, 8, [1])[0]) == 0.0


def test_each_all_reduce_call_runs_the_fastest_of_the_links_protocols() -> None:
    """Two protocols, (5 µs, 50 GB/s) and (20 µs, 400 GB/s), tp = 2 (the ring moves the
    whole payload): a 16 KiB call takes the first's 5 µs + S/50 GB/s, a 16 MiB call the
    second's 20 µs + S/400 GB/s; the link's own pair is not used when protocols are given."""
    fast, bulk = (5e-6, 50e9), (20e-6, 400e9)
    steps = Steps(_prefill(), _decode(), 2, Link(1e9, 1.0, (fast, bulk)))
    small, large = 16384.0, 16 * 2**20
    times = steps.calls_s(torch.tensor([small, large], dtype=torch.float64))
    assert float(times[0]) == pytest.approx(5e-6 + small / 50e9)
    assert float(times[1]) == pytest.approx(20e-6 + large / 400e9)


def test_nccl_ring_protocols_are_its_cost_model() -> None:
    """NCCL 2.20.3 (src/graph/tuning.cc), all-reduce over 4 GPUs (6 ring steps) of one node:
    LL 6.6 + 6·0.6 µs at min(bus/4, 87.7 GB/s), LL128 14 + 6·1.9 µs at 0.92 of the bus
    (NVLink only), Simple 8.4 + 6·3.4 µs (6·1.0 and 6·5.7 over PCIe) at the bus."""
    bus = 360e9
    def flat(options: tuple[tuple[float, float], ...]) -> list[float]:
        return [x for pair in options for x in pair]

    assert flat(ring_all_reduce_options("nvlink", 4, bus)) == pytest.approx(
        [10.2e-6, 87.7e9, 25.4e-6, 0.92 * bus, 28.8e-6, bus])
    assert flat(ring_all_reduce_options("pcie", 4, 51.2e9)) == pytest.approx(
        [12.6e-6, 51.2e9 / 4, 42.6e-6, 51.2e9])
    assert ring_all_reduce_options("", 4, bus) == ()
    assert ring_all_reduce_options("nvlink", 1, bus) == ()
    # a decode step's 4 MiB payload: LL128's latency and bandwidth win
    steps = Steps(_prefill(), _decode(), 4, Link(bus, 10.2e-6,
                                                 ring_all_reduce_options("nvlink", 4, bus)))
    payload = 4.0 * 2**20
    assert float(steps.calls_s(torch.tensor([payload], dtype=torch.float64))[0]) == (
        pytest.approx(25.4e-6 + 1.5 * payload / (0.92 * bus)))


# --- routed experts -------------------------------------------------------------------------


@pytest.mark.parametrize("experts, top_k, tokens", [(4, 2, 2), (8, 2, 3), (6, 1, 4),
                                                    (5, 3, 2)])
def test_expected_distinct_experts_is_the_mean_over_every_routing(experts: int, top_k: int,
                                                                   tokens: int) -> None:
    """E·(1 − (1 − k/E)^T) against the mean over every way T tokens pick k of E."""
    choices = list(itertools.combinations(range(experts), top_k))
    mean = sum(len(set().union(*picks)) for picks in itertools.product(choices, repeat=tokens)
               ) / len(choices) ** tokens
    routing = Routing(experts, top_k, (0,))
    share = float(routing.share(torch.tensor(float(tokens), dtype=torch.float64)))
    assert experts * share == pytest.approx(mean)


def test_a_step_reads_only_the_experts_its_tokens_route_to() -> None:
    """A grouped expert GEMM (all E experts' weights W as captured, A bytes and F FLOPs per
    token): a decode step of b sequences reads W·(1 − (1 − k/E)^b), a prefill of b prompts
    of L tokens W·(1 − (1 − k/E)^(b·L)); FLOPs stay per routed token."""
    experts, k = 8, 2
    rows = [("aten._grouped_mm.default", "experts", [0, F, 0, 0], [W, A, 0, 0]),
            (LINEAR, "gate", [0, 1.0, 0, 0], [1e6, 1.0, 0, 0])]
    decode = _step(rows, routing=Routing(experts, k, (0,)))
    prefill = _step(rows, routing=Routing(experts, k, (0,), prefill=True))
    for batch in (1, 3, 40):
        flops, moved = decode.work(batch, 500)
        assert float(moved[0]) == pytest.approx(W * (1 - (1 - k / experts) ** batch) + A * batch)
        assert float(flops[0]) == F * batch
        assert float(moved[1]) == 1e6 + batch                        # dense: read whole
        _, moved = prefill.work(batch, 7)
        assert float(moved[0]) == pytest.approx(W * (1 - (1 - k / experts) ** (batch * 7))
                                                + A * batch)
    one = float(decode.times_s(H100, 1, [500])[0])
    assert one == pytest.approx(_roofline(F, W * k / experts + A) + _roofline(1, 1e6 + 1))


# --- a step running decode and prompt tokens together --------------------------------------


@pytest.mark.parametrize("decodes, context, prompts", [(90, 94, 10), (1, 500, 1),
                                                       (400, 2000, 0.25), (3000, 200, 2)])
def test_a_mixed_step_reads_the_shared_weights_once(decodes: float, context: float,
                                                    prompts: float) -> None:
    assert mixed_s(_steps(), H100, decodes, context, prompts, P) == pytest.approx(
        _mixed(decodes, context, prompts))


def test_a_mixed_step_without_one_kind_of_token_is_the_other_step() -> None:
    steps = _steps()
    assert mixed_s(steps, H100, 50, 300, 0, P) == pytest.approx(
        float(steps.decode_s(H100, 50, [300])[0]))
    assert mixed_s(steps, H100, 0, 300, 2, P) == pytest.approx(steps.prefill_s(H100, 2, P))


def test_a_mixed_step_all_reduces_once_per_output_for_all_its_tokens() -> None:
    latency, bandwidth, payload = 8e-6, 360e9, 16384.0
    decode = _step([("all-reduce", "o_proj", [0, 0, 0, 0], [0, payload, 0, 0])], 2.0)
    prefill = _step([("all-reduce", "o_proj", [0, 0, 0, 0], [0, payload * P, 0, 0])], 2.0)
    steps = Steps(_prefill(), _decode(), 2, Link(bandwidth, latency), prefill, decode,
                  shared_rows(_decode(), _prefill(), lambda k: k.target == LINEAR))
    kernels = _mixed(30, 100, 0.5)
    moved = payload * (30 + 0.5 * P)
    assert mixed_s(steps, H100, 30, 100, 0.5, P) == pytest.approx(
        kernels + 2 * (latency + moved / bandwidth))


# --- the in-flight steady state --------------------------------------------------------------


def test_in_flight_requests_bound_the_steady_state() -> None:
    """R = 100 requests of 90 + 10 tokens: r = R/O = 10 admitted per step, 90 decode tokens
    at mean context 90 + 8/2 and 900 prompt tokens in every step."""
    state = steady_state(_steps(), H100, P, 10, 100, Engine(8192, 2048))
    assert state.bound == "requests"
    assert (state.requests, state.decodes, state.prompt_tokens) == pytest.approx((100, 90, 900))
    step = _mixed(90, P + 4, 10)
    assert state.step_s == pytest.approx(step)
    assert state.output_tokens_per_s == pytest.approx(100 / step)


def test_the_token_cap_bounds_the_steady_state() -> None:
    """max_num_tokens = 500: r = 500 / (90 + 10 − 1) requests per step."""
    state = steady_state(_steps(), H100, P, 10, 10_000, Engine(500, 2048))
    rate = 500 / 99
    assert state.bound == "max_num_tokens"
    assert state.requests == pytest.approx(rate * 10)
    assert state.decodes + state.prompt_tokens == pytest.approx(500)
    assert state.output_tokens_per_s == pytest.approx(rate * 10 / _mixed(rate * 9, 94, rate))
    capped = steady_state(_steps(), H100, P, 10, 10_000, Engine(10 ** 6, 64))
    assert capped.bound == "max_num_seqs" and capped.requests == pytest.approx(64)


def test_one_request_in_flight_prefills_in_one_step_of_every_o() -> None:
    """R = 1: one prompt every O steps (its step also decodes ≈ nothing), the others decode
    alone: the static batch of one up to that one step's sliver of decode."""
    o = 10
    steps = _steps()
    state = steady_state(steps, H100, P, o, 1, Engine(8192, 2048))
    decodes = (o - 1) / o
    decode = float(steps.decode_s(H100, decodes, [P + 4])[0])
    step = _mixed(decodes, P + 4, 1) / o + decode * (o - 1) / o
    assert state.step_s == pytest.approx(step)
    static = o / (steps.prefill_s(H100, 1, P) + (o - 1) * float(
        steps.decode_s(H100, 1, [P + 4])[0]))
    assert state.output_tokens_per_s == pytest.approx(static, rel=0.02)


def test_each_kernel_pays_the_devices_gap_once_and_a_merged_gemm_once() -> None:
    """A kernel boundary costs the device's `graph_launch_s` (1.3 µs on Hopper, measured):
    per kernel and layer of a step, once for the GEMM a mixed step shares, nothing for a
    kernel a step does not run."""
    gap = 1e-3
    slow, bare = (dataclasses.replace(H100, graph_launch_s=s) for s in (gap, 0.0))
    assert H100.graph_launch_s == pytest.approx(1.3e-6)
    decode = _decode(layers=3)
    added = decode.times_s(slow, 4, [100]) - decode.times_s(bare, 4, [100])
    assert float(added[0]) == pytest.approx(2 * 3 * gap)             # 2 kernels × 3 layers
    steps = _steps()
    assert (mixed_s(steps, slow, 10, 100, 1, P) - mixed_s(steps, bare, 10, 100, 1, P)
            == pytest.approx(3 * gap))                 # one GEMM, two attentions
    assert (mixed_s(steps, slow, 0, 100, 1, P) - mixed_s(steps, bare, 0, 100, 1, P)
            == pytest.approx(2 * gap))                 # the prefill's kernels alone
