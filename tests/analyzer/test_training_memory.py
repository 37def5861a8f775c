"""Training-state accounting, fits, largest batch, sizes, checkpointing: worked by hand.

Bytes per parameter come from the policy tables (fxlens/rules/training.py): AMP + Adam =
bf16 weights 2 + fp32 master 4 + bf16 grads 2 + fp32 m, v 8 = 16; fp32 + Adam 4 + 4 + 8 = 16;
bf16 + Adam with bf16 states 2 + 2 + 4 = 8.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from torch import nn

from fxlens.analyzer.capture.chain import param_infos
from fxlens.analyzer.capture.fx_convert import type_name
from fxlens.analyzer.core.codec import encode
from fxlens.analyzer.core.graph import ParamInfo, repeated_blocks
from fxlens.analyzer.memory.training_state import (
    BlockActivations,
    LinearActivation,
    StateBytes,
    checkpoint_what_if,
    fits,
    largest_batch,
    optimizer_step_bytes,
    optimizer_step_flops,
    parse_bytes,
    state_memory,
)
from fxlens.rules.training import Optimizer, Precision
from tests.helpers import T

GIB = 2**30
ADAM = Optimizer.ADAM.spec

# --- state memory -----------------------------------------------------------------------------

N7B = 7_000_000_000
SEVEN_B = [ParamInfo("model.w", T(7000, 1_000_000))]      # 7e9 parameters in one matrix


@pytest.mark.parametrize(("precision", "bytes_per_param"), [
    (Precision.AMP_BF16, 2 + 4 + 2 + 8),
    (Precision.AMP_FP16, 2 + 4 + 2 + 8),
    (Precision.AUTOCAST_BF16, 4 + 4 + 8),
    (Precision.AUTOCAST_FP16, 4 + 4 + 8),
    (Precision.FP32, 4 + 4 + 8),
    (Precision.BF16, 2 + 2 + 4),
])
def test_seven_billion_parameters_with_adam(precision: Precision, bytes_per_param: int) -> None:
    memory = state_memory(SEVEN_B, precision.spec, ADAM)
    assert memory.total == bytes_per_param * N7B
    assert memory.trainable_numel == N7B and memory.frozen_numel == 0


def test_seven_billion_amp_adam_is_112_gb_split_by_category() -> None:
    memory = state_memory(SEVEN_B, Precision.AMP_BF16.spec, ADAM)
    assert memory.total == 112 * 10**9
    assert (memory.weights_bytes, memory.master_bytes, memory.grad_bytes,
            memory.optimizer_bytes, memory.buffer_bytes) == (
        2 * N7B, 4 * N7B, 2 * N7B, 8 * N7B, 0)


def test_seven_billion_autocast_adam_is_112_gb_split_otherwise() -> None:
    memory = state_memory(SEVEN_B, Precision.AUTOCAST_BF16.spec, ADAM)
    assert memory.total == 112 * 10**9
    assert (memory.weights_bytes, memory.master_bytes, memory.grad_bytes,
            memory.optimizer_bytes, memory.buffer_bytes) == (
        4 * N7B, 0, 4 * N7B, 8 * N7B, 0)


@pytest.mark.parametrize(("optimizer", "optimizer_bytes"), [
    (Optimizer.SGD, 0),
    (Optimizer.MOMENTUM, 4 * N7B),
    (Optimizer.ADAMW, 8 * N7B),
    (Optimizer.ADAFACTOR, (7000 + 1_000_000) * 4),
])
def test_optimizers_on_seven_billion_fp32(optimizer: Optimizer, optimizer_bytes: int) -> None:
    memory = state_memory(SEVEN_B, Precision.FP32.spec, optimizer.spec)
    assert memory.optimizer_bytes == optimizer_bytes
    assert memory.total == (4 + 4) * N7B + optimizer_bytes


def test_frozen_parameters_keep_working_weights_only() -> None:
    params = [ParamInfo("base.w", T(100, 10), requires_grad=False),
              ParamInfo("lora.a", T(10, 4)), ParamInfo("lora.b", T(4, 10))]
    memory = state_memory(params, Precision.AMP_BF16.spec, ADAM)
    frozen, trainable = 1000, 80
    assert memory.weights_bytes == 2 * (frozen + trainable)
    assert memory.master_bytes == 4 * trainable
    assert memory.grad_bytes == 2 * trainable
    assert memory.optimizer_bytes == 8 * trainable
    assert memory.by_module["base"] == StateBytes(weights_bytes=2 * frozen)
    assert (memory.trainable_numel, memory.frozen_numel) == (trainable, frozen)


def test_buffers_keep_their_dtype() -> None:
    params = [ParamInfo("bn.weight", T(16)),
              ParamInfo("bn.running_mean", T(16), is_buffer=True, requires_grad=False),
              ParamInfo("bn.num_batches_tracked", T(dtype="int64"), is_buffer=True,
                        requires_grad=False)]
    memory = state_memory(params, Precision.BF16.spec, ADAM)
    assert memory.buffer_bytes == 16 * 4 + 8            # fp32 stays fp32 under bf16
    assert memory.weights_bytes == 16 * 2
    assert memory.trainable_numel == 16                 # buffers are not parameters


def test_roll_up_the_module_hierarchy() -> None:
    params = [ParamInfo("enc.layers.0.w", T(10, 10)), ParamInfo("enc.layers.1.w", T(10, 10)),
              ParamInfo("head.w", T(10, 3)), ParamInfo("scale", T(1))]
    memory = state_memory(params, Precision.FP32.spec, Optimizer.SGD.spec)
    per = 4 + 4                                          # fp32 weights + grads, no state
    total_of = {path: s.total for path, s in memory.by_module.items()}
    assert total_of == {
        "": per * (100 + 100 + 30 + 1),
        "enc": per * 200, "enc.layers": per * 200,
        "enc.layers.0": per * 100, "enc.layers.1": per * 100,
        "head": per * 30,
    }
    assert memory.by_module[""].total == memory.total
    assert list(memory.by_module) == sorted(memory.by_module)


def test_to_json_is_plain_and_sorted() -> None:
    params = [ParamInfo("b.w", T(2)), ParamInfo("a.w", T(2))]
    data = encode(state_memory(params, Precision.FP32.spec, ADAM).to_section())
    assert json.loads(json.dumps(data)) == data
    assert list(data["by_module"]) == ["", "a", "b"]
    assert data["total"] == 2 * 2 * 16 and data["by_module"]["a"]["optimizer_bytes"] == 2 * 8


def test_optimizer_step_flops_counts_trainable_parameters_only() -> None:
    params = [ParamInfo("w", T(10, 10)), ParamInfo("frozen", T(10, 10), requires_grad=False),
              ParamInfo("buf", T(10), is_buffer=True, requires_grad=False)]
    assert optimizer_step_flops(params, Optimizer.ADAMW.spec) == 14 * 100


@pytest.mark.parametrize(("precision", "optimizer", "bytes_per_param"), [
    # torch.optim's foreach AdamW: 21 accesses of the fp32 master copy, then master → bf16
    (Precision.AMP_BF16, Optimizer.ADAMW, 21 * 4 + 4 + 2),
    (Precision.FP32, Optimizer.ADAMW, 21 * 4),
    (Precision.BF16, Optimizer.ADAM, 19 * 2),
    (Precision.FP32, Optimizer.SGD, 3 * 4),
    (Precision.FP32, Optimizer.MOMENTUM, 8 * 4),
    # no foreach path modelled: one pass, read every state, write all but the gradient
    (Precision.FP32, Optimizer.ADAM8BIT, 2 * (4 + 2 * (1 + 4 / 256)) + 4),
])
def test_optimizer_step_bytes_follow_the_step_implementation(
        precision: Precision, optimizer: Optimizer, bytes_per_param: float) -> None:
    params = [ParamInfo("w", T(1024, 1024)), ParamInfo("frozen", T(8, 8), requires_grad=False)]
    moved = optimizer_step_bytes(params, precision.spec, optimizer.spec)
    assert moved == pytest.approx(bytes_per_param * 1024 * 1024)


# --- a real module tree: tiny Llama on meta ----------------------------------------------------

V, H, INTER, LAYERS, HEADS, KV_HEADS = 128, 32, 64, 3, 4, 2


@pytest.fixture(scope="module")
def tiny_llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False,
    )
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


def test_llama_state_memory_by_hand(tiny_llama: nn.Module) -> None:
    kv = KV_HEADS * (H // HEADS)
    per_layer = H * H + 2 * H * kv + H * H + 3 * H * INTER + 2 * H   # q k v o, MLP, 2 norms
    n = V * H + LAYERS * per_layer + H + V * H                      # embed, layers, norm, head
    params = param_infos(tiny_llama)
    memory = state_memory(params, Precision.AMP_BF16.spec, ADAM)
    buffers = sum(p.spec.nbytes for p in params if p.is_buffer)      # rotary inv_freq
    assert memory.total - memory.buffer_bytes == 16 * n
    assert memory.buffer_bytes == buffers
    assert memory.by_module["model.layers.1"].total == 16 * per_layer

    embedding = tiny_llama.get_parameter("model.embed_tokens.weight")
    embedding.requires_grad_(False)
    try:
        frozen = state_memory(param_infos(tiny_llama), Precision.AMP_BF16.spec, ADAM)
    finally:
        embedding.requires_grad_(True)
    assert frozen.total - frozen.buffer_bytes == 16 * (n - V * H) + 2 * V * H


# --- fits and largest batch ---------------------------------------------------------------------

def test_fits() -> None:
    verdict = fits(70 * GIB, 80 * GIB)
    assert verdict.fits and verdict.headroom_bytes == 10 * GIB
    assert verdict.utilisation == pytest.approx(70 / 80)
    assert fits(80 * GIB, 80 * GIB).fits                         # exactly full fits
    over = fits(81 * GIB, 80 * GIB)
    assert not over.fits and over.headroom_bytes == -GIB
    with pytest.raises(ValueError):
        fits(1, 0)


def test_largest_batch_linear_closed_form() -> None:
    persistent, per_sample, fixed, device = 40 * GIB, 3 * GIB, GIB, 80 * GIB
    batch = largest_batch(persistent, (per_sample, fixed), device)
    assert batch == (80 - 40 - 1) // 3 == 13
    assert persistent + fixed + per_sample * batch <= device
    assert persistent + fixed + per_sample * (batch + 1) > device


def test_largest_batch_zero_when_batch_one_does_not_fit() -> None:
    assert largest_batch(79 * GIB, (2 * GIB, 0), 80 * GIB) == 0
    assert largest_batch(79 * GIB, lambda b: 2 * GIB * b, 80 * GIB) == 0
    assert largest_batch(81 * GIB, (0, 0), 80 * GIB) == 0


@pytest.mark.parametrize("device", [1, 7, 100, 1000, 12345])
def test_largest_batch_search_matches_brute_force(device: int) -> None:
    def quadratic(b: int) -> int:            # e.g. unfused attention scores grow with b²
        return 5 + 3 * b + b * b
    expected = max(b for b in range(0, 200) if b == 0 or 10 + quadratic(b) <= device)
    assert largest_batch(10, quadratic, device) == expected


def test_largest_batch_search_agrees_with_closed_form() -> None:
    def searched(line: LinearActivation) -> Callable[[int], int]:
        return lambda b: line(b)           # a plain function: no closed form, a search

    for per_sample, fixed, device in [(3, 1, 100), (7, 0, 7), (1, 5, 1000), (10, 10, 19)]:
        line = LinearActivation(per_sample, fixed)
        assert largest_batch(0, searched(line), device) == largest_batch(0, line, device) == \
            largest_batch(0, (per_sample, fixed), device)


def test_largest_batch_is_capped() -> None:
    assert largest_batch(0, (0, 0), 10) == 1 << 20
    assert largest_batch(0, (1, 0), 10**9, max_batch=64) == 64
    assert largest_batch(0, lambda b: b, 10**9, max_batch=100) == 100


def test_linear_activation_models() -> None:
    per_sample, fixed = 3000, 500
    line = LinearActivation.through(2, fixed + 2 * per_sample, 6, fixed + 6 * per_sample)
    assert line == LinearActivation(per_sample, fixed)
    assert LinearActivation.through(6, line(6), 2, line(2)) == line
    assert LinearActivation.proportional(4, 1001) == LinearActivation(251, 0)   # rounded up
    with pytest.raises(ValueError):
        LinearActivation.through(2, 10, 2, 10)


# --- parse_bytes --------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("80GiB", 80 * 2**30),
    ("80GB", 80 * 10**9),
    ("24 GiB", 24 * 2**30),
    ("1.5e9", 1_500_000_000),
    ("512mib", 512 * 2**20),
    ("0.5 GiB", 2**29),
    ("2.01GB", 2_010_000_000),          # exact: int(2.01 * 1e9) in floats is 2009999999
    ("2TB", 2 * 10**12),
    ("1024", 1024),
    ("64 B", 64),
    ("4KiB", 4096),
])
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["80G", "GB", "", "-1GB", "eighty GB", "80 GiBs", "1e400x"])
def test_parse_bytes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="GiB = 2\\^30"):
        parse_bytes(text)


# --- activation checkpointing -------------------------------------------------------------------

def test_checkpoint_what_if_by_hand() -> None:
    blocks = [BlockActivations("layers.0", 100, 10, 1000),
              BlockActivations("layers.1", 120, 10, 1000),
              BlockActivations("layers.2", 110, 10, 1000)]
    what_if = checkpoint_what_if(blocks)
    assert what_if.blocks == ("layers.0", "layers.1", "layers.2")
    assert what_if.saved_bytes_before == 100 + 120 + 110
    assert what_if.saved_bytes_after == 3 * 10 + 120    # inputs + one block recomputed
    assert what_if.memory_saved_bytes == 330 - 150
    assert what_if.recompute_flops == 3000


def test_checkpoint_costs_a_third_of_a_step_when_applied_everywhere() -> None:
    # backward ≈ 2 × forward, so a step is 3 forwards; recomputing every block adds one
    blocks = [BlockActivations(f"h.{i}", 50, 5, 700) for i in range(4)]
    what_if = checkpoint_what_if(blocks)
    assert what_if.flops_overhead(3 * 4 * 700) == pytest.approx(1 / 3)


def test_checkpoint_can_cost_memory_and_handles_nothing() -> None:
    tiny = checkpoint_what_if([BlockActivations("a", 5, 10, 1), BlockActivations("b", 5, 10, 1)])
    assert tiny.memory_saved_bytes == 10 - (20 + 5)     # inputs larger than what is saved
    empty = checkpoint_what_if([])
    assert (empty.saved_bytes_before, empty.saved_bytes_after, empty.recompute_flops) == (0, 0, 0)
    assert empty.flops_overhead(0) == 0.0


# --- repeated blocks ----------------------------------------------------------------------------

def test_repeated_blocks_synthetic() -> None:
    types = {"": "M", "enc": "Enc", "enc.0": "L", "enc.1": "L", "enc.norm": "N",
             "enc.0.experts": "ML", "enc.0.experts.0": "E", "enc.0.experts.1": "E",
             "dec": "Dec", "dec.0": "D", "dec.1": "D", "dec.2": "D",
             "seq": "S", "seq.0": "Linear", "seq.1": "ReLU",       # mixed leaf types: no
             "gap": "G", "gap.0": "X", "gap.2": "X",               # not 0..N-1: no
             "one": "O", "one.0": "Y",                              # a single child: no
             # a hybrid's layers, of two kinds, each with modules of its own: a run
             "mix": "H", "mix.0": "Mamba", "mix.0.mixer": "SSM", "mix.1": "Attn",
             "mix.1.attn": "SDPA", "mix.2": "Mamba", "mix.2.mixer": "SSM"}
    assert repeated_blocks(types) == ("enc.0", "enc.1", "dec.0", "dec.1", "dec.2",
                                      "mix.0", "mix.1", "mix.2")


def test_repeated_blocks_order_is_numeric() -> None:
    types = {f"h.{i}": "B" for i in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9)}
    assert repeated_blocks(types) == tuple(f"h.{i}" for i in range(11))


def test_repeated_blocks_in_llama(tiny_llama: nn.Module) -> None:
    types = {p: type_name(type(m)) for p, m in tiny_llama.named_modules()}
    assert repeated_blocks(types) == ("model.layers.0", "model.layers.1", "model.layers.2")


def test_repeated_blocks_in_tiny_gpt() -> None:
    from tests.models.tiny_gpt import GPTConfig, TinyGPT
    with torch.device("meta"):
        model = TinyGPT(GPTConfig(n_layer=3))
    types = {p: type_name(type(m)) for p, m in model.named_modules()}
    assert repeated_blocks(types) == ("blocks.0", "blocks.1", "blocks.2")


def test_foreach_adamw_holds_a_temporary_of_every_parameter_at_once() -> None:
    """torch's multi-tensor AdamW computes sqrt(v) for all parameters in one call: a
    state-sized copy of them all, where a single-tensor step holds two of the largest."""
    from fxlens.analyzer.core.graph import Graph
    from fxlens.analyzer.memory.training_step import _optimizer_temporaries

    params = tuple(ParamInfo(f"w{i}", T(256, 256)) for i in range(8))
    graph = Graph((), "synthetic", params=params)
    every = 8 * 256 * 256 * 4
    amp = Precision.AMP_BF16.spec
    assert _optimizer_temporaries(graph, amp, Optimizer.ADAMW.spec) == every
    assert _optimizer_temporaries(graph, amp, Optimizer.ADAFACTOR.spec) == 2 * 256 * 256 * 4
    assert _optimizer_temporaries(graph, amp, Optimizer.SGD.spec) == 2 * 256 * 256 * 4
    # torch.optim steps one tensor at a time on a CPU
    assert _optimizer_temporaries(graph, amp, Optimizer.ADAMW.spec, foreach=False) == (
        2 * 256 * 256 * 4)
