"""Elementwise ops: one factory, `pointwise(flops_per_element)`, and one table, `POINTWISE`.

FLOPs count per OUTPUT element: a broadcast input is not charged again per element it is
broadcast to. Bytes are the engine's default (each distinct input's storage read once, each
output written once), which is right for an elementwise kernel: an expanded (stride-0) input
reads only its storage, and a Tensor-Scalar overload reads one tensor. ``.out`` variants do
not read their ``out=`` tensor. In-place packets (``add_``, ``relu_``, ``__iand__``...) cost
the same as their out-of-place packet and are registered with it.

How counts are derived: an IEEE-754 basic operation (add, sub, mul, div, sqrt), a compare, a
select, a min/max or a rounding counts 1; a compare feeding a select (``x > 0 ? a : b``)
counts 1 together; a function that needs a polynomial or a special-function unit (exp, log,
sin, tanh, erf, ...) counts ``SPECIAL_FUNCTION_FLOPS`` = S = 4. NB: 4 is between the
quarter-rate special-function units of NVIDIA GPUs (one SFU op ≈ 4 FMA-lane slots) and the
~10 vector ops of a CPU polynomial; pointwise kernels are memory-bound, so the choice moves
the compute side of the roofline only. Random draws are not FLOPs (data_movement.py).

Counts (FLOPs per output element; the names are ``aten.<name>`` packets, in-place included,
or single overloads where the packet also holds non-elementwise ones):

    add, sub, rsub, mul, div, true_divide, neg, abs, reciprocal, sqrt, square  1  basic op
    sign, sgn, signbit, floor, ceil, trunc, round, relu, relu6, hardtanh  1  basic op
    threshold, clamp, clamp_min, clamp_max, maximum, minimum, fmax, fmin  1  min/max/select
    max.other, min.other, max.out, min.out, copysign, heaviside, nextafter  1  basic op
    eq, ne, lt, le, gt, ge, isnan, isinf, isposinf, isneginf, isfinite  1  compare
    logical_and, logical_or, logical_xor, logical_not, bitwise_and, bitwise_or  1  logic
    bitwise_xor, bitwise_not, bitwise_left_shift, bitwise_right_shift  1  logic
    __and__, __or__, __xor__, __lshift__, __rshift__, conj_physical  1  logic, sign flip
    where.self, where.ScalarSelf, where.ScalarOther, where.Scalar, where.self_out  1  select
    clip, deg2rad, rad2deg, frexp  1  clamp / one mul / exponent and mantissa bits
    threshold_backward, native_dropout_backward  1  g where x > t else 0 / mask ? g·scale : 0
    frac  2  x - trunc(x)
    rsqrt  2  sqrt, div
    floor_divide  2  div, floor
    leaky_relu, _prelu_kernel, prelu  2  compare-select, mul by the slope
    rrelu, rrelu_with_noise, rrelu_with_noise_functional  2  compare-select, mul (draw free)
    hardshrink  2  abs, compare-select
    addcmul, addcdiv  2  self + t1 * t2 (or t1 / t2)
    hardtanh_backward, leaky_relu_backward, softshrink_backward  2  compare(s), mul
    hardshrink_backward, rrelu_with_noise_backward  2  compare-select, mul
    lerp, nan_to_num  3  sub, mul, add / three compare-selects
    softshrink  3  two compare-selects, add
    hardsigmoid  3  add 3, clamp, div 6
    sigmoid_backward  3  g * y * (1 - y): sub, mul, mul
    tanh_backward  3  g * (1 - y * y): mul, sub, mul
    hardsigmoid_backward, logit_backward  3  two compares, mul / sub, mul, div
    hardswish  4  x * hardsigmoid(x)
    fmod, remainder  4  div, trunc (floor), mul, sub
    hypot  4  mul, mul, add, sqrt
    _prelu_kernel_backward  4  two outputs, each a compare-select and a mul
    exp, exp2, expm1, log, log2, log10, log1p, sin, cos, tan, asin, acos, atan  4  S
    sinh, cosh, tanh, asinh, acosh, atanh, erf, erfc, erfinv, lgamma, digamma  4  S
    i0, atan2, angle, igamma, igammac, polygamma, mvlgamma, special_zeta  4  S (NB: series)
    special_i0e, special_i1, special_i1e, special_erfcx, special_ndtri, special_log_ndtr  4  S
    hardswish_backward, log_sigmoid_backward  5  compares, div, add, mul
    ldexp  5  x · exp2(e): S, mul
    glu_backward  6  per pair: sigmoid 7 + g*s 1 + g*a*s*(1-s) 4, i.e. 12 per 2 outputs
    xlogy, logit, sinc  6  log + mul + select / sub, div, log / mul, sin, div
    special_xlog1py, special_entr  6  x · log1p(y) + select / -x · log(x) + select
    sigmoid, elu  7  1 / (1 + exp(-x)): neg, S, add, div / select, S, sub 1, mul alpha
    elu_backward, selu, celu, silu, glu  8  elu's 7 + one scale / x * sigmoid(x)
    gelu  8  0.5 * x * (1 + erf(x / sqrt 2)): div, S, add, mul, mul
    softplus_backward  9  g * sigmoid(beta x) via exp: mul, S, add, div, select, mul
    pow, float_power  9  exp(y * log x): S, mul, S
    polar  10  abs * cos, abs * sin: 2 S, 2 mul
    softplus  11  log1p(exp(beta x)) / beta: mul, S, S, div, threshold select
    log_sigmoid, log_sigmoid_forward, logaddexp, logaddexp2  12  max, sub, abs, S, S, add
    silu_backward  12  s = sigmoid 7; g * s * (1 + x * (1 - s)): 5
    mish  16  x * tanh(softplus(x)): 11 + S + mul
    gelu_backward  17  Phi(x) 7 + x * phi(x) 8 (x^2, -1/2, S, mul, mul) + add, mul g
    mish_backward  28  tanh(softplus) 15, sigmoid 7, 6 to combine

Argument-dependent counts (the table holds the base count):

- add, sub, rsub: +1 when ``alpha`` != 1; addcmul, addcdiv: +1 when ``value`` != 1.
- div (and true_divide): +1 with a ``rounding_mode`` (trunc or floor after the divide).
- round: +2 with ``decimals`` (scale, round, unscale).
- gelu with ``approximate="tanh"``: 12, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): x³ 2,
  mul, add, mul, S, add, mul, mul; its backward 22 (inner 5, S, 13 to combine).
- elu: +1 when ``scale`` != 1, +1 when ``input_scale`` != 1.
- pow/float_power: by exponent. Scalar exponent 0 or 1: 0 (fill or copy); 0.5: 1 (sqrt);
  -0.5: 2 (rsqrt); an integer n: multiplications of square-and-multiply,
  ``bit_length(|n|) + popcount(|n|) - 2`` (x² = 1, x³ = 2), plus 1 divide when n < 0;
  any other scalar or a tensor exponent: 9. Scalar base: 5 (b^x = exp(x · log b), log b
  hoisted).

`diff` (n-th forward difference) costs 1 sub per element of each of its n passes.

Known limitations: complex dtypes are counted as real ones (a complex mul is really 6 FLOPs);
integer and bool tensors count the same as floating point; series-evaluated special functions
(igamma, polygamma, zeta, Bessel i0e/i1...) cost more than S in real kernels, and the Bessel
and orthogonal-polynomial families, gcd and lcm have no rule. NB: SOFTMAX_FLOPS_PER_ELEMENT in
conventions.py counts exp as 1; a hand-written softmax built of these ops counts it as S.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from fxlens.analyzer.core.aten import resolve_op
from fxlens.analyzer.core.costs import Cost, OpCall, RuleFn, cost_rule
from fxlens.analyzer.core.graph import TensorRef, TensorSpec
from fxlens.rules.conventions import SIGMOID_FLOPS, SPECIAL_FUNCTION_FLOPS

S = SPECIAL_FUNCTION_FLOPS

PerElement = int | Callable[[OpCall], int]


def _table(*groups: tuple[str, int]) -> dict[str, int]:
    """``("add sub mul", 1), ...`` → ``{"aten.add": 1, ...}``."""
    return {f"aten.{name}": count for names, count in groups for name in names.split()}


POINTWISE: dict[str, int] = _table(
    ("add sub rsub mul div true_divide neg abs reciprocal sqrt square", 1),
    ("sign sgn signbit floor ceil trunc round relu relu6 hardtanh", 1),
    ("threshold clamp clamp_min clamp_max maximum minimum fmax fmin", 1),
    ("max.other min.other max.out min.out copysign heaviside nextafter", 1),
    ("eq ne lt le gt ge isnan isinf isposinf isneginf isfinite", 1),
    ("logical_and logical_or logical_xor logical_not bitwise_and bitwise_or", 1),
    ("bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift", 1),
    ("__and__ __or__ __xor__ __lshift__ __rshift__ conj_physical", 1),
    ("where.self where.ScalarSelf where.ScalarOther where.Scalar where.self_out", 1),
    ("clip deg2rad rad2deg frexp threshold_backward native_dropout_backward", 1),
    ("frac rsqrt floor_divide leaky_relu _prelu_kernel prelu hardshrink", 2),
    ("rrelu rrelu_with_noise rrelu_with_noise_functional addcmul addcdiv", 2),
    ("hardtanh_backward leaky_relu_backward softshrink_backward", 2),
    ("hardshrink_backward rrelu_with_noise_backward", 2),
    ("lerp nan_to_num softshrink hardsigmoid sigmoid_backward tanh_backward", 3),
    ("hardsigmoid_backward logit_backward", 3),
    ("hardswish fmod remainder hypot _prelu_kernel_backward", 4),
    ("exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan", S),
    ("sinh cosh tanh asinh acosh atanh erf erfc erfinv lgamma digamma", S),
    ("i0 atan2 angle igamma igammac polygamma mvlgamma special_zeta", S),
    ("special_i0e special_i1 special_i1e special_erfcx special_ndtri special_log_ndtr", S),
    ("hardswish_backward log_sigmoid_backward", 5),
    ("ldexp", S + 1),
    ("glu_backward xlogy logit sinc special_xlog1py special_entr", 6),
    ("sigmoid elu", SIGMOID_FLOPS),
    ("elu_backward selu celu silu glu", 1 + S + 1 + 1 + 1),
    ("gelu", 1 + S + 1 + 1 + 1),
    ("softplus_backward", 1 + S + 1 + 1 + 1 + 1),
    ("pow float_power", S + 1 + S),
    ("polar", 2 * S + 2),
    ("softplus", 1 + S + S + 1 + 1),
    ("log_sigmoid log_sigmoid_forward logaddexp logaddexp2", 1 + 1 + 1 + S + S + 1),
    ("silu_backward", 7 + 5),
    ("mish", 11 + S + 1),
    ("gelu_backward", 7 + 8 + 1 + 1),
    ("mish_backward", 15 + 7 + 6),
)

GELU_TANH_FLOPS = 2 + 1 + 1 + 1 + S + 1 + 1 + 1
GELU_TANH_BACKWARD_FLOPS = 5 + S + 13


def _differs(value: object, default: float = 1) -> int:
    """1 when a scalar argument is not its identity value (so the kernel does the op)."""
    return int(value is not None and value != default)


def _alpha(call: OpCall) -> int:
    return 1 + _differs(call.arg("alpha", 1))


def _value(call: OpCall) -> int:
    return 2 + _differs(call.arg("value", 1))


def _div(call: OpCall) -> int:
    return 1 + int(call.arg("rounding_mode") is not None)


def _round(call: OpCall) -> int:
    return 1 + 2 * _differs(call.arg("decimals", 0), 0)


def _gelu(call: OpCall) -> int:
    return GELU_TANH_FLOPS if call.arg("approximate") == "tanh" else POINTWISE["aten.gelu"]


def _gelu_backward(call: OpCall) -> int:
    tanh = call.arg("approximate") == "tanh"
    return GELU_TANH_BACKWARD_FLOPS if tanh else POINTWISE["aten.gelu_backward"]


def _elu(call: OpCall) -> int:
    scales = _differs(call.arg("scale", 1)) + _differs(call.arg("input_scale", 1))
    return POINTWISE["aten.elu"] + scales


def scalar_power_flops(exponent: float) -> int:
    """FLOPs per element of x ** exponent for a Python-number exponent."""
    if exponent in (0, 1):
        return 0
    if exponent == 0.5:
        return 1
    if exponent == -0.5:
        return 2
    if float(exponent).is_integer():
        n = abs(int(exponent))
        return n.bit_length() + n.bit_count() - 2 + int(exponent < 0)
    return POINTWISE["aten.pow"]


def _pow(call: OpCall) -> int:
    if not isinstance(call.arg("self"), TensorSpec):
        return S + 1
    exponent = call.arg("exponent")
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        return scalar_power_flops(exponent)
    return POINTWISE["aten.pow"]


ARG_DEPENDENT: dict[str, Callable[[OpCall], int]] = {
    **dict.fromkeys(["aten.add", "aten.sub", "aten.rsub"], _alpha),
    **dict.fromkeys(["aten.addcmul", "aten.addcdiv"], _value),
    **dict.fromkeys(["aten.div", "aten.true_divide"], _div),
    **dict.fromkeys(["aten.pow", "aten.float_power"], _pow),
    "aten.round": _round,
    "aten.gelu": _gelu,
    "aten.gelu_backward": _gelu_backward,
    "aten.elu": _elu,
}


@functools.cache
def _out_arguments(target: str) -> frozenset[str]:
    """Names of the ``out=``-style arguments (written, never read) of an overload."""
    try:
        schema = resolve_op(target)._schema
    except (AttributeError, ValueError, RuntimeError):
        return frozenset()
    return frozenset(a.name for a in schema.arguments if a.is_out)


def reads_except_out(call: OpCall) -> int | None:
    """Storage bytes of the distinct inputs other than ``out=`` tensors; None (the engine's
    default) when the call passes no ``out=`` argument."""
    outs = _out_arguments(call.target) & call.node.args.keys()
    if not outs:
        return None
    read: dict[TensorRef, TensorSpec] = {}
    for name in call.node.args.keys() - outs:
        pairs = zip(_flat(call.node.args[name]), _flat(call.arg(name)), strict=True)
        read.update((r, s) for r, s in pairs if isinstance(r, TensorRef) and s is not None)
    return sum(spec.storage_bytes for spec in read.values())


def _flat(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def out_numel(call: OpCall) -> int:
    """Elements of the first tensor output (0 for scalar overloads such as ``add.int``)."""
    return call.outputs[0].numel if call.outputs else 0


def pointwise(flops_per_element: PerElement) -> RuleFn:
    """A cost rule charging `flops_per_element` (a count, or a function of the call) per
    element of the output."""

    def rule(call: OpCall) -> Cost:
        per_element = flops_per_element
        if callable(per_element):
            per_element = per_element(call)
        return Cost(flops=per_element * out_numel(call), bytes_read=reads_except_out(call))

    rule.__qualname__ = f"pointwise({getattr(flops_per_element, '__name__', flops_per_element)})"
    return rule


def with_inplace(key: str) -> list[str]:
    """``aten.add`` → [``aten.add``, ``aten.add_``]; ``aten.__and__`` → [.., ``aten.__iand__``];
    single overloads and packets without an in-place twin → [key]."""
    parts = key.split(".")
    if len(parts) != 2:
        return [key]
    name = parts[1]
    inplace = f"__i{name[2:]}" if name.startswith("__") else f"{name}_"
    return [key, f"aten.{inplace}"] if hasattr(torch.ops.aten, inplace) else [key]


def _register_table() -> None:
    for key, count in POINTWISE.items():
        cost_rule(*with_inplace(key))(pointwise(ARG_DEPENDENT.get(key, count)))


_register_table()


@cost_rule(torch.ops.aten.diff)
def diff(call: OpCall) -> Cost:
    """n passes of neighbour subtraction along `dim` (after prepend/append): pass k makes
    (L - k) · rest outputs, one sub each."""
    n, out = call.arg("n", 1), call.out
    dim = call.arg("dim", -1) % max(len(out.shape), 1)
    length, rest = out.shape[dim] + n, out.numel // max(out.shape[dim], 1)
    return Cost(flops=sum(length - k for k in range(1, n + 1)) * rest)
