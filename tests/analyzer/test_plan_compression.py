"""Communication compression against closed forms on tests/models/tiny_gpt.py (AMP bf16:
2-byte gradients and working weights): 8-bit gradients move n·(1 + 4/256) bytes for n
elements; PowerSGD rank r moves r·(n + m) elements per n × m matrix (vectors whole); ZeRO++
gathers int8 weights forward, bf16 ones inside the node backward, and reduce-scatters int4
gradients; and a compression whose transfers compute already hid is said not to pay."""

from __future__ import annotations

import math

import pytest

from fxlens.analyzer.capture.load import load
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.plan.compression import quantized_bytes
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.strategy import parse
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.reports.views.plan import _compression_note
from tests.analyzer.conftest import MODELS, FakeLinks
from tests.analyzer.test_plan import BF16, layout

Facts = tuple[Report, ModelFacts]


def grads(facts: ModelFacts) -> int:
    return sum(u.states.grad_bytes for u in facts.units)


def collective(facts: ModelFacts, text: str, gpus: int, cause: str):  # noqa: ANN201
    (found,) = [c for c in layout(facts, text, gpus).collectives if c.cause.startswith(cause)]
    return found


def test_eight_bit_elements_carry_a_scale_per_256() -> None:
    assert quantized_bytes(2 * 1024, 2, 8) == 1024 * (1 + 4 / 256)
    assert quantized_bytes(4 * 1024, 4, 4) == 1024 * (0.5 + 4 / 256)


@pytest.mark.parametrize("text, cause", [("ddp", "gradients (DDP"),
                                         ("zero1", "gradients (ZeRO-1"),
                                         ("fsdp", "gradients (ZeRO-3")])
def test_gradq_halves_bf16_gradient_collectives(gpt: Facts, text: str, cause: str) -> None:
    _, facts = gpt
    plain = collective(facts, text, 8, cause)
    int8 = collective(facts, f"{text},gradq=int8", 8, cause)
    assert plain.bytes == grads(facts)
    assert int8.bytes == pytest.approx(grads(facts) / BF16 * (1 + 4 / 256), abs=1)
    assert int8.time_s < plain.time_s and "int8" in int8.cause


@pytest.mark.parametrize("rank", [1, 4, 16])
def test_powersgd_sends_rank_r_factors_of_each_matrix(gpt: Facts, rank: int) -> None:
    _, facts = gpt
    module = load(str(MODELS / "tiny_gpt.py")).module
    elements = 0
    for p in module.parameters():
        n, m = p.shape[0], math.prod(p.shape[1:])
        small = p.dim() < 2 or rank * (n + m) >= n * m
        elements += p.numel() if small else rank * (n + m)
    sent = collective(facts, f"ddp,powersgd={rank}", 8, "gradients (DDP")
    assert sent.bytes == pytest.approx(elements * BF16, abs=1)
    assert "PowerSGD rank" in sent.cause
    plain = layout(facts, "ddp", 8)
    compressed = layout(facts, f"ddp,powersgd={rank}", 8)
    # the error-feedback copy of the gradients stays on the GPU
    assert (compressed.memory.communication_bytes - plain.memory.communication_bytes
            >= plain.memory.gradients_bytes)


def test_zeropp_quantizes_gathers_and_keeps_backward_gathers_in_the_node(gpt: Facts) -> None:
    _, facts = gpt
    weights = sum(u.states.weights_bytes for u in facts.units)
    out = {c.cause: c for c in layout(facts, "fsdp,zeropp", 16).collectives}
    forward = out["weights, forward (ZeRO++ int8)"]
    backward = out["weights, backward (ZeRO++ node copy)"]
    gradients = out["gradients (ZeRO++ int4)"]
    assert forward.bytes == pytest.approx(weights / BF16 * (1 + 4 / 256), abs=1)
    assert forward.group == 16 and forward.across_nodes
    assert backward.bytes == weights and backward.group == 8 and not backward.across_nodes
    assert gradients.bytes == pytest.approx(grads(facts) / BF16 * (0.5 + 4 / 256), abs=1)


def test_compression_says_whether_it_pays(gpt: Facts) -> None:
    _, facts = gpt
    fast = layout(facts, "ddp,gradq=int8", 8).time
    assert fast.uncompressed_exposed_s == 0.0
    assert "does not pay" in _compression_note(fast)
    slow = estimate(facts, parse("ddp,gradq=int8", 8), FakeLinks(nvlink=1e6, nic=1e6)).time
    plain = estimate(facts, parse("ddp", 8), FakeLinks(nvlink=1e6, nic=1e6)).time
    assert slow.uncompressed_exposed_s == pytest.approx(plain.data_parallel_exposed_s)
    assert 0 < slow.data_parallel_exposed_s < plain.data_parallel_exposed_s
    assert "cuts the exposed" in _compression_note(slow)
    assert layout(facts, "ddp", 8).time.uncompressed_exposed_s is None
