"""Bridges between torch objects and our graph types: op lookup, schema binding, specs.

Arguments are bound to the op schema's names, with schema defaults filled in, so a rule reads
``call.arg("is_causal")`` whether or not the caller passed it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fxlens.analyzer.core.graph import TensorSpec


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def spec_of(t: torch.Tensor) -> TensorSpec:
    """The spec of a real, fake or meta tensor (symbolic sizes must be concrete by now)."""
    return TensorSpec(
        shape=tuple(int(s) for s in t.shape),
        dtype=dtype_name(t.dtype),
        stride=tuple(int(s) for s in t.stride()) if t.layout == torch.strided else (),
        device=str(t.device),
    )


KNOWN_VALUE_ELEMENTS = 2**20    # a BlockMask's block table at 128 Ki tokens: 1 Mi entries


def known_value(t: Any) -> torch.Tensor | None:
    """A copy of `t`'s values when a capture may keep them on the graph input it becomes
    (`Node.value`): a real CPU tensor of integers or bools, at most ``KNOWN_VALUE_ELEMENTS``
    elements. Else None: floats are weights or data, fake and meta tensors hold no values."""
    if (not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor
            or t.device.type != "cpu" or t.numel() > KNOWN_VALUE_ELEMENTS
            or t.dtype.is_floating_point or t.dtype.is_complex):
        return None
    with torch.utils._python_dispatch._disable_current_modes():    # not a fake copy
        return t.detach().clone()


def meta_tensor(spec: TensorSpec) -> torch.Tensor:
    """An uninitialised meta tensor with the spec's shape, strides and dtype."""
    dtype = getattr(torch, spec.dtype)
    if spec.stride:
        return torch.empty_strided(spec.shape, spec.stride, dtype=dtype, device="meta")
    return torch.empty(spec.shape, dtype=dtype, device="meta")


@functools.cache
def resolve_op(target: str) -> torch._ops.OpOverload:
    """``"aten.mm.default"`` → ``torch.ops.aten.mm.default``."""
    namespace, name, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def bind_args(
    op: torch._ops.OpOverload,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    convert: Callable[[Any], Any] = lambda v: v,
) -> dict[str, Any]:
    """Arguments by schema name, defaults filled in, each value passed through `convert`."""
    bound: dict[str, Any] = {}
    for i, argument in enumerate(op._schema.arguments):
        if i < len(args) and not argument.kwarg_only:
            value = args[i]
        elif argument.name in kwargs:
            value = kwargs[argument.name]
        elif argument.has_default_value():
            value = argument.default_value
        else:
            continue
        bound[argument.name] = convert(value)
    return bound
