"""Training policies (fxlens/rules/training.py) and device table (fxlens/rules/hardware.py).

Every expectation is derived by hand from the policy tables in the module docstrings:
bytes per element of each copy (fp32 4, bf16/fp16 2, fp8 1), moments per optimizer, and the
FLOPs of each optimizer's single-tensor step in torch.optim.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from fxlens.rules.hardware import DEVICES, GIB, device
from fxlens.rules.training import (
    ADAM8BIT_LEGACY_BLOCK,
    OPTIMIZERS,
    PRECISIONS,
    Optimizer,
    Precision,
    factored_elements,
)
from tests.helpers import T

R, C = 4096, 11008          # a Llama-7B MLP matrix
n = R * C


def per_param(precision: Precision) -> tuple[int, int, int]:
    """(weights, master, grads) bytes of one (R, C) fp32-declared matrix under `precision`."""
    p = precision.spec
    t = T(R, C)
    return p.weight_bytes(t), p.master_bytes(t), p.grad_bytes(t)


@pytest.mark.parametrize(("precision", "weights", "master", "grads", "state_dtype"), [
    (Precision.FP32, 4 * n, 0, 4 * n, "float32"),
    (Precision.BF16, 2 * n, 0, 2 * n, "bfloat16"),
    (Precision.AMP_BF16, 2 * n, 4 * n, 2 * n, "float32"),
    (Precision.AMP_FP16, 2 * n, 4 * n, 2 * n, "float32"),
    # autocast: fp32 parameters and gradients, no master copy, fp32 states (fp16 too)
    (Precision.AUTOCAST_BF16, 4 * n, 0, 4 * n, "float32"),
    (Precision.AUTOCAST_FP16, 4 * n, 0, 4 * n, "float32"),
    # fp8: bf16 working weights 2 + the cached fp8 copy of a matrix 1; fp32 master; bf16 grads
    (Precision.FP8, (2 + 1) * n, 4 * n, 2 * n, "float32"),
])
def test_precision_copies_per_matrix(precision: Precision, weights: int, master: int,
                                     grads: int, state_dtype: str) -> None:
    assert per_param(precision) == (weights, master, grads)
    assert precision.spec.state_dtype == state_dtype


@pytest.mark.parametrize(("precision", "bytes_per_param"), [
    (Precision.FP32, 4 + 4 + 2 * 4),                # 16
    (Precision.BF16, 2 + 2 + 2 * 2),                # 8: states in bf16
    (Precision.AMP_BF16, 2 + 4 + 2 + 2 * 4),        # 16
    (Precision.AMP_FP16, 2 + 4 + 2 + 2 * 4),        # 16
    (Precision.AUTOCAST_BF16, 4 + 0 + 4 + 2 * 4),   # 16, split differently
    (Precision.AUTOCAST_FP16, 4 + 0 + 4 + 2 * 4),   # 16
    (Precision.FP8, 2 + 1 + 4 + 2 + 2 * 4),         # 17 for a matrix
])
def test_adam_bytes_per_parameter(precision: Precision, bytes_per_param: int) -> None:
    p, t = precision.spec, T(R, C)
    state = Optimizer.ADAM.spec.state_bytes(t, p.state_dtype)
    assert sum(per_param(precision)) + state == bytes_per_param * n


@pytest.mark.parametrize(("precision", "autocast_dtype"), [
    (Precision.AUTOCAST_BF16, "bfloat16"), (Precision.AUTOCAST_FP16, "float16"),
    (Precision.AMP_BF16, None), (Precision.FP32, None),
])
def test_only_autocast_precisions_record_under_autocast(precision: Precision,
                                                        autocast_dtype: str | None) -> None:
    assert precision.spec.autocast_dtype == autocast_dtype


def test_fp8_caches_matrices_only() -> None:
    vector = T(R)
    assert Precision.FP8.spec.weight_bytes(vector) == 2 * R       # bf16 only, no fp8 copy


def test_policy_sets_float_dtypes_and_keeps_integers() -> None:
    declared_bf16 = T(8, 8, dtype="bfloat16")
    assert Precision.FP32.spec.weight_bytes(declared_bf16) == 4 * 64   # cast to fp32
    declared_fp64 = T(8, 8, dtype="float64")
    assert Precision.AMP_BF16.spec.weight_bytes(declared_fp64) == 2 * 64
    ints = T(8, 8, dtype="int64")
    for precision in Precision:
        assert precision.spec.weight_bytes(ints) == 8 * 64            # declared dtype
        assert precision.spec.master_bytes(ints) == 0


@pytest.mark.parametrize(("optimizer", "state_bytes"), [
    (Optimizer.SGD, 0),
    (Optimizer.MOMENTUM, 1 * n * 4),
    (Optimizer.ADAM, 2 * n * 4),
    (Optimizer.ADAMW, 2 * n * 4),
    (Optimizer.ADAFACTOR, (R + C) * 4),             # row + column statistics, no m
])
def test_optimizer_state_fp32(optimizer: Optimizer, state_bytes: int) -> None:
    assert optimizer.spec.state_bytes(T(R, C), "float32") == state_bytes


def test_optimizer_state_takes_the_state_dtype() -> None:
    assert Optimizer.ADAM.spec.state_bytes(T(R, C), "bfloat16") == 2 * n * 2
    assert Optimizer.ADAFACTOR.spec.state_bytes(T(R, C), "bfloat16") == (R + C) * 2


def test_adamw_bf16_keeps_its_moments_in_bf16_and_the_master_as_the_precision_does() -> None:
    # DeepSeek-V3's recipe: amp-bf16 keeps its fp32 master (4 B), the moments 2 × 2 B
    spec = Optimizer.ADAMW_BF16.spec
    assert spec.state_bytes(T(R, C), "float32") == 2 * n * 2
    assert spec.step_flops(T(R, C)) == Optimizer.ADAMW.spec.step_flops(T(R, C))
    amp = Precision.AMP_BF16.spec
    assert amp.master_bytes(T(R, C)) == n * 4
    assert Optimizer("adamw-bf16") is Optimizer.ADAMW_BF16


def test_adafactor_factoring() -> None:
    assert factored_elements((R, C)) == R + C
    assert factored_elements((C,)) == C                   # vectors keep a full second moment
    assert factored_elements(()) == 1
    # (E, R, C): the leading dim batches rows (E·R) and columns (E·C)
    assert factored_elements((8, 64, 32)) == 8 * 64 + 8 * 32
    assert factored_elements((0, 5)) == 0
    assert Optimizer.ADAFACTOR.spec.state_bytes(T(C), "float32") == C * 4


def test_adam8bit_is_about_two_bytes_per_parameter() -> None:
    spec = Optimizer.ADAM8BIT.spec
    # two moments of 1 B each, plus one fp32 absmax per block of 256 per moment
    expected = 2 * (n * 1 + math.ceil(n / 256) * 4)
    got = spec.state_bytes(T(R, C), "float32")
    assert got == expected
    assert got / n == pytest.approx(2 + 2 * 4 / 256)            # 2.03 B/param
    # the state dtype of the precision does not matter once quantised
    assert spec.state_bytes(T(R, C), "bfloat16") == expected


def test_adam8bit_blocks_small_tensors_and_legacy_block() -> None:
    spec = Optimizer.ADAM8BIT.spec
    assert spec.state_bytes(T(5000), "float32") == 2 * (5000 + 20 * 4)  # ceil(5000/256) = 20
    assert spec.state_bytes(T(4096), "float32") == 2 * (4096 + 16 * 4)  # at min_8bit_size
    # under 4096 elements bitsandbytes keeps fp32 states, whatever the precision
    assert spec.state_bytes(T(4095), "bfloat16") == 2 * 4095 * 4
    assert spec.quantization is not None
    legacy = dataclasses.replace(
        spec, quantization=dataclasses.replace(spec.quantization,
                                               block_size=ADAM8BIT_LEGACY_BLOCK))
    assert legacy.state_bytes(T(R, C), "float32") == 2 * (n + math.ceil(n / 2048) * 4)


@pytest.mark.parametrize(("optimizer", "shape", "flops_per_element"), [
    (Optimizer.SGD, (R, C), 1 + 1),                       # mul by lr, add
    (Optimizer.MOMENTUM, (R, C), 2 + 2),                  # buffer update, parameter update
    (Optimizer.ADAM, (R, C), 3 + 4 + 3 + 3),              # lerp, v update, denom, addcdiv
    (Optimizer.ADAMW, (R, C), 3 + 4 + 3 + 3 + 1),         # + decoupled decay
    (Optimizer.ADAFACTOR, (R, C), 2 + 1 + 2 + 2 + 2 + 1 + 1 + 2 + 1 + 2 + 2),
    (Optimizer.ADAFACTOR, (C,), 2 + 1 + 1 + 3 + 1 + 2 + 1 + 2 + 2),
    (Optimizer.ADAM8BIT, (R, C), 13 + 2 * (1 + 3)),       # + dequantise/requantise per moment
    (Optimizer.ADAM8BIT, (64,), 13),                      # small tensor: plain 32-bit Adam
])
def test_step_flops(optimizer: Optimizer, shape: tuple[int, ...],
                    flops_per_element: int) -> None:
    assert optimizer.spec.step_flops(T(*shape)) == flops_per_element * math.prod(shape)


def test_enums_parse_cli_names_and_every_member_has_a_policy() -> None:
    assert Precision("amp-bf16") is Precision.AMP_BF16
    assert Optimizer("adam8bit") is Optimizer.ADAM8BIT
    assert set(PRECISIONS) == set(Precision)
    assert set(OPTIMIZERS) == set(Optimizer)
    with pytest.raises(ValueError):
        Precision("fp16")


# --- hardware ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "gib"), [
    ("h100", 80), ("h200", 141), ("a100-40gb", 40), ("a100-80gb", 80), ("l4", 24),
    ("a10g", 24), ("t4", 16), ("rtx4090", 24), ("mi300x", 192), ("b200", 180), ("gb200", 186),
    ("b300", 270), ("gb300", 279),
])
def test_device_memory_is_the_datasheet_figure_in_gib(name: str, gib: int) -> None:
    spec = device(name)
    assert spec.memory_bytes == gib * 2**30
    assert spec.name == name and spec.source


def test_device_lookup() -> None:
    assert device(" H100 ") is DEVICES["h100"]
    assert GIB == 1024**3
    with pytest.raises(ValueError, match="known devices: .*h100"):
        device("h1000")
