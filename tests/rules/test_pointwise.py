"""Elementwise rules: per-output-element counts, broadcasting, in-place ≡ out-of-place, bytes."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch

from fxlens.analyzer.core.costs import OpCall
from fxlens.analyzer.core.graph import TensorSpec
from fxlens.analyzer.cost.engine import cost_node
from fxlens.rules import load_rules, pointwise
from fxlens.rules.pointwise import POINTWISE, S, scalar_power_flops, with_inplace
from tests.helpers import T, cost_of, op_call

m, n = 3, 5
N = m * n  # output elements
F32 = 4
SIGMOID = 1 + S + 1 + 1  # neg, exp, add, div
SOFTPLUS = 1 + S + S + 1 + 1  # mul beta, exp, log1p, div beta, threshold select


def expanded(rows: int, cols: int) -> TensorSpec:
    """A (cols,) row broadcast to (rows, cols): stride 0, storage of one row."""
    return TensorSpec((rows, cols), "float32", (0, 1))


x, y = T(m, n), T(m, n)
b = T(m, n, dtype="bool")

CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    # basic ops: one FLOP per output element
    ("aten.add.Tensor", (x, y), {}, N * 1),
    ("aten.add.Tensor", (x, y), {"alpha": 2}, N * (1 + 1)),  # mul by alpha, add
    ("aten.sub.Tensor", (x, y), {"alpha": 1}, N * 1),
    ("aten.rsub.Scalar", (x, 1.0), {}, N * 1),
    ("aten.mul.Tensor", (x, y), {}, N * 1),
    ("aten.mul.Scalar", (x, 3.0), {}, N * 1),
    ("aten.div.Tensor", (x, y), {}, N * 1),
    ("aten.div.Tensor_mode", (x, y), {"rounding_mode": "floor"}, N * (1 + 1)),
    ("aten.neg.default", (x,), {}, N * 1),
    ("aten.abs.default", (x,), {}, N * 1),
    ("aten.relu.default", (x,), {}, N * 1),
    ("aten.clamp.default", (x, 0.0, 6.0), {}, N * 1),
    ("aten.hardtanh.default", (x,), {}, N * 1),
    ("aten.maximum.default", (x, y), {}, N * 1),
    ("aten.min.other", (x, y), {}, N * 1),
    ("aten.gt.Scalar", (x, 0.0), {}, N * 1),
    ("aten.eq.Tensor", (x, y), {}, N * 1),
    ("aten.logical_not.default", (b,), {}, N * 1),
    ("aten.bitwise_and.Tensor", (b, b), {}, N * 1),
    ("aten.__and__.Tensor", (b, b), {}, N * 1),
    ("aten.where.self", (b, x, y), {}, N * 1),
    ("aten.where.ScalarOther", (b, x, 0.0), {}, N * 1),
    ("aten.sqrt.default", (x,), {}, N * 1),
    ("aten.rsqrt.default", (x,), {}, N * (1 + 1)),  # sqrt, div
    ("aten.reciprocal.default", (x,), {}, N * 1),
    ("aten.round.decimals", (x,), {"decimals": 2}, N * (1 + 2)),  # scale, round, unscale
    # special functions
    ("aten.exp.default", (x,), {}, N * S),
    ("aten.log.default", (x,), {}, N * S),
    ("aten.tanh.default", (x,), {}, N * S),
    ("aten.erf.default", (x,), {}, N * S),
    ("aten.sin.default", (x,), {}, N * S),
    # activations
    ("aten.sigmoid.default", (x,), {}, N * SIGMOID),
    ("aten.silu.default", (x,), {}, N * (SIGMOID + 1)),
    ("aten.gelu.default", (x,), {}, N * (1 + S + 1 + 1 + 1)),  # div, erf, add, mul, mul
    ("aten.gelu.default", (x,), {"approximate": "tanh"},
     N * (2 + 1 + 1 + 1 + S + 1 + 1 + 1)),  # x³, ·c, +x, ·k, tanh, +1, ·x, ·½
    ("aten.softplus.default", (x,), {}, N * SOFTPLUS),
    ("aten.mish.default", (x,), {}, N * (SOFTPLUS + S + 1)),
    ("aten.elu.default", (x,), {}, N * (1 + S + 1 + 1)),  # select, exp, sub, mul alpha
    ("aten.elu.default", (x, 1.67, 1.05), {}, N * (1 + S + 1 + 1 + 1)),  # selu: + scale
    ("aten.leaky_relu.default", (x,), {}, N * (1 + 1)),
    ("aten.hardsigmoid.default", (x,), {}, N * (1 + 1 + 1)),
    ("aten.hardswish.default", (x,), {}, N * (1 + 1 + 1 + 1)),
    ("aten.glu.default", (T(m, 2 * n), -1), {}, N * (SIGMOID + 1)),  # per OUTPUT element
    # pow by exponent
    ("aten.pow.Tensor_Scalar", (x, 2), {}, N * 1),
    ("aten.pow.Tensor_Scalar", (x, 3), {}, N * 2),
    ("aten.pow.Tensor_Scalar", (x, 0.5), {}, N * 1),
    ("aten.pow.Tensor_Scalar", (x, -1), {}, N * 1),
    ("aten.pow.Tensor_Scalar", (x, 1.7), {}, N * (S + 1 + S)),
    ("aten.pow.Tensor_Tensor", (x, y), {}, N * (S + 1 + S)),
    ("aten.pow.Scalar", (2.0, x), {}, N * (1 + S)),
    # ternaries and modular ops
    ("aten.addcmul.default", (x, x, y), {}, N * 2),
    ("aten.addcdiv.default", (x, x, y), {"value": 0.5}, N * 3),
    ("aten.lerp.Scalar", (x, y, 0.5), {}, N * 3),
    ("aten.fmod.Scalar", (x, 2.0), {}, N * 4),
    ("aten.floor_divide.default", (x, y), {}, N * 2),
    # backward ops
    ("aten.threshold_backward.default", (x, y, 0.0), {}, N * 1),
    ("aten.sigmoid_backward.default", (x, y), {}, N * 3),
    ("aten.tanh_backward.default", (x, y), {}, N * 3),
    ("aten.gelu_backward.default", (x, y), {}, N * (7 + 8 + 1 + 1)),
    ("aten.gelu_backward.default", (x, y), {"approximate": "tanh"}, N * (5 + S + 13)),
    ("aten.silu_backward.default", (x, y), {}, N * (SIGMOID + 5)),
    ("aten.hardtanh_backward.default", (x, y, -1.0, 1.0), {}, N * 2),
    ("aten.leaky_relu_backward.default", (x, y, 0.01, False), {}, N * 2),
    ("aten.elu_backward.default", (x, 1.0, 1.0, 1.0, False, y), {}, N * 8),
    ("aten.softplus_backward.default", (x, y, 1.0, 20.0), {}, N * (1 + S + 1 + 1 + 1 + 1)),
    ("aten.mish_backward.default", (x, y), {}, N * (SOFTPLUS + S + SIGMOID + 6)),
    ("aten.hardswish_backward.default", (x, y), {}, N * 5),
    ("aten.hardsigmoid_backward.default", (x, y), {}, N * 3),
    # diff: n passes of neighbour subtraction
    ("aten.diff.default", (x,), {}, m * (n - 1)),
    ("aten.diff.default", (x, 2), {}, m * ((n - 1) + (n - 2))),
    ("aten.diff.default", (x, 1, 0), {}, (m - 1) * n),
    ("aten.diff.default", (x, 1, -1, T(m, 1)), {}, m * n),  # prepend lengthens by one
]


@pytest.mark.parametrize(("target", "args", "kwargs", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_flops_per_output_element(target: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                                  expected: int) -> None:
    assert cost_of(target, *args, **kwargs).flops == expected


BROADCASTS: list[tuple[str, tuple[Any, ...], int]] = [
    ("aten.add.Tensor", (T(m, 1), T(1, n)), N * 1),
    ("aten.mul.Tensor", (T(n), T(m, 1)), N * 1),
    ("aten.where.self", (T(m, 1, dtype="bool"), T(1, n), T(m, n)), N * 1),
    ("aten.sigmoid_backward.default", (T(m, n), T(1, n)), N * 3),
]


@pytest.mark.parametrize(("target", "args", "expected"), BROADCASTS,
                         ids=[c[0] for c in BROADCASTS])
def test_broadcast_inputs_count_once_per_output_element(target: str, args: tuple[Any, ...],
                                                        expected: int) -> None:
    same_shape = tuple(T(m, n, dtype=a.dtype) for a in args)
    assert cost_of(target, *args).flops == cost_of(target, *same_shape).flops == expected


INPLACE: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = [
    ("aten.add.Tensor", "aten.add_.Tensor", (x, T(1, n)), {"alpha": 3}),
    ("aten.mul.Tensor", "aten.mul_.Tensor", (x, y), {}),
    ("aten.div.Scalar", "aten.div_.Scalar", (x, 2.0), {}),
    ("aten.relu.default", "aten.relu_.default", (x,), {}),
    ("aten.sigmoid.default", "aten.sigmoid_.default", (x,), {}),
    ("aten.tanh.default", "aten.tanh_.default", (x,), {}),
    ("aten.gelu.default", "aten.gelu_.default", (x,), {"approximate": "tanh"}),
    ("aten.pow.Tensor_Scalar", "aten.pow_.Scalar", (x, 3), {}),
    ("aten.clamp.default", "aten.clamp_.default", (x, 0.0), {}),
    ("aten.logical_and.default", "aten.logical_and_.default", (b, b), {}),
    ("aten.__and__.Tensor", "aten.__iand__.Tensor", (b, b), {}),
    ("aten.silu.default", "aten.silu_.default", (x,), {}),
]


@pytest.mark.parametrize(("out_of_place", "in_place", "args", "kwargs"), INPLACE,
                         ids=[c[1] for c in INPLACE])
def test_inplace_costs_the_same_as_out_of_place(out_of_place: str, in_place: str,
                                                args: tuple[Any, ...],
                                                kwargs: dict[str, Any]) -> None:
    expected = cost_of(out_of_place, *args, **kwargs)
    assert expected.flops > 0
    assert cost_of(in_place, *args, **kwargs) == expected


def engine_bytes(target: str, *args: Any, **kwargs: Any) -> tuple[int, int]:
    """(read, written) as the engine charges them, defaults applied."""
    call = op_call(target, *args, **kwargs)
    cost = cost_node(call.node, call._graph, load_rules(), strict=True)
    return cost.bytes_read, cost.bytes_written


def test_expanded_input_reads_its_storage_only() -> None:
    read, written = engine_bytes("aten.add.Tensor", x, expanded(m, n))
    assert (read, written) == ((N + n) * F32, N * F32)


def test_tensor_scalar_overload_reads_one_tensor() -> None:
    assert engine_bytes("aten.mul.Scalar", x, 2.0) == (N * F32, N * F32)


def rebind(call: OpCall, **refs: str) -> OpCall:
    """`call` with argument `name` pointing at the tensor of argument `refs[name]`."""
    args = {**call.node.args, **{k: call.node.args[v] for k, v in refs.items()}}
    return OpCall(dataclasses.replace(call.node, args=args), call._graph)


def test_same_tensor_twice_is_read_once() -> None:
    call = rebind(op_call("aten.mul.Tensor", x, x), other="self")  # x * x: one input node
    cost = cost_node(call.node, call._graph, load_rules(), strict=True)
    assert cost.bytes_read == N * F32


def test_out_variant_does_not_read_out() -> None:
    cost = cost_of("aten.add.out", x, expanded(m, n), out=T(m, n))
    assert cost.flops == N * 1
    assert cost.bytes_read == (N + n) * F32


def test_out_variant_aliasing_an_input_still_reads_it() -> None:
    call = rebind(op_call("aten.mul.out", x, y, out=T(m, n)), out="self")  # mul(x, y, out=x)
    rule = load_rules().lookup(call.node)
    assert callable(rule)
    assert rule(call).bytes_read == 2 * N * F32


def test_scalar_overloads_cost_nothing() -> None:
    """TorchScript's int overloads share the packet; they have no tensor output."""
    assert cost_of("aten.add.int", 2, 3).flops == 0


@pytest.mark.parametrize(("exponent", "expected"), [
    (0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (-1, 1), (-2, 2), (2.0, 1),
    (0.5, 1), (-0.5, 2), (1.5, S + 1 + S),
])
def test_scalar_power_flops(exponent: float, expected: int) -> None:
    assert scalar_power_flops(exponent) == expected


@pytest.mark.parametrize("key", sorted(POINTWISE))
def test_table_keys_name_real_ops(key: str) -> None:
    parts = key.split(".")
    packet = getattr(torch.ops.aten, parts[1])
    if len(parts) == 3:
        assert parts[2] in packet.overloads(), key


def test_inplace_twins() -> None:
    assert with_inplace("aten.add") == ["aten.add", "aten.add_"]
    assert with_inplace("aten.__and__") == ["aten.__and__", "aten.__iand__"]
    assert with_inplace("aten.glu") == ["aten.glu"]
    assert with_inplace("aten.where.self") == ["aten.where.self"]


def test_other_families_ops_are_left_alone() -> None:
    keys = load_rules().keys
    for key in ("aten.masked_fill", "aten.where", "aten.max", "aten.sum", "aten.index_put"):
        assert "rules/pointwise.py" not in keys.get(key, ""), key
    assert "aten.where.self" in POINTWISE  # the elementwise overloads only


ROW = re.compile(r"^ {4}([\w.]+(?:, [\w.]+)*)  (\d+)  \S")


def test_docstring_states_every_count() -> None:
    """The module docstring's table and POINTWISE agree, name for name."""
    stated: dict[str, int] = {}
    for line in (pointwise.__doc__ or "").splitlines():
        if match := ROW.match(line):
            stated.update(dict.fromkeys(match[1].split(", "), int(match[2])))
    assert stated == {key.removeprefix("aten."): count for key, count in POINTWISE.items()}
