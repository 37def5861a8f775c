"""One JSON codec for every frozen dataclass that crosses into a report.

`encode(value)` turns a dataclass into plain JSON values by walking its fields; `decode(cls,
data)` reads it back by the fields' type hints, so a section class is its own schema: a key
renamed in the class is renamed in the JSON, and mypy sees every reader that still uses the
old name. Supported field types: int, float, str, bool, None, enums of those, dataclasses,
``tuple[X, ...]`` / ``tuple[X, Y]`` (JSON lists), ``Mapping[str, X]`` / ``dict[str, X]`` (JSON
objects; int keys are written as strings and read back as ints), ``X | None`` and `Any` (kept
as loaded JSON).

A field declared with `optional()` is left out of the JSON while it is None, so sections that
only sometimes carry a part (a training step's fit verdict) keep the shape they always had.
Decoding never executes anything and fails with `CodecError` naming the dotted path of the
field that did not match. A report may come from anyone, so a float field takes only a finite
number (``NaN`` would make every comparison, hence every gate, pass) and an integer field at
most `MAX_INT` in magnitude (a ratio of two figures must stay a finite float); the error
message quotes at most 60 characters of the offending value.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin

T = TypeVar("T")

_OMIT_NONE = "fxlens_omit_none"


#: The largest magnitude an integer figure may have: far above any real count (a training
#: step of a 1T-parameter model over a million tokens is ~10**25 FLOPs), small enough that
#: every figure converts to a float and any ratio of two figures stays finite.
MAX_INT = 10**30


class CodecError(ValueError):
    """A JSON value does not match the dataclass field it is read into."""


def optional(default: Any = None) -> Any:
    """A dataclass field that is absent from the JSON while it is None."""
    return dataclasses.field(default=default, metadata={_OMIT_NONE: True})


def is_optional(field: dataclasses.Field[Any]) -> bool:
    """Whether `field` was declared with `optional` (left out of the JSON while None)."""
    return bool(field.metadata.get(_OMIT_NONE))


def encode(value: Any) -> Any:
    """Plain JSON values (dict, list, str, int, float, bool, None) for `value`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None and is_optional(f):
                continue
            out[f.name] = encode(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def decode(cls: type[T], data: Any, where: str = "") -> T:
    """Read `data` (as `encode` wrote it) into the dataclass `cls`."""
    return typing.cast(T, _decode(cls, data, where or cls.__name__))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(tp: Any, data: Any, where: str) -> Any:
    if tp is Any:
        return data
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return _decode_union(tp, data, where)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode_dataclass(tp, data, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise CodecError(f"{where}: {_short(data)} is not one of "
                             f"{', '.join(str(m.value) for m in tp)}") from None
    if origin in (tuple, list) or tp in (tuple, list):
        return _decode_sequence(tp, data, where)
    if origin in (dict, Mapping) or origin is getattr(typing, "Mapping", None):
        return _decode_mapping(tp, data, where)
    return _decode_scalar(tp, data, where)


def _decode_union(tp: Any, data: Any, where: str) -> Any:
    options = get_args(tp)
    if data is None:
        if type(None) in options:
            return None
        raise CodecError(f"{where}: missing value")
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _decode(option, data, where)
        except CodecError as error:
            errors.append(str(error))
    raise CodecError(errors[0] if len(errors) == 1 else f"{where}: {_short(data)} matches no type "
                     f"of {tp}")


def _decode_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise CodecError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise CodecError(f"{where}.{f.name}: missing")
            continue
        values[f.name] = _decode(hints[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**values)


def _decode_sequence(tp: Any, data: Any, where: str) -> Any:
    if not isinstance(data, (list, tuple)):
        raise CodecError(f"{where}: expected a list, got {type(data).__name__}")
    args = get_args(tp)
    if not args:
        return tuple(data)
    if len(args) == 2 and args[1] is Ellipsis or get_origin(tp) is list:
        items = tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        return list(items) if get_origin(tp) is list else items
    if len(args) != len(data):
        raise CodecError(f"{where}: expected {len(args)} items, got {len(data)}")
    return tuple(_decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data,
                                                                             strict=True)))


def _decode_mapping(tp: Any, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise CodecError(f"{where}: expected an object, got {type(data).__name__}")
    key_type, value_type = get_args(tp) or (str, Any)
    out = {}
    for key, value in data.items():
        k = _decode_scalar(key_type, int(key) if key_type is int and _is_int(key) else key,
                           f"{where} key")
        out[k] = _decode(value_type, value, f"{where}[{_short(key)}]")
    return out


def _is_int(text: Any) -> bool:
    return isinstance(text, str) and len(text) <= 40 and text.lstrip("-").isdigit()


def _decode_scalar(tp: Any, data: Any, where: str) -> Any:
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise CodecError(f"{where}: expected a number, got {_short(data)}")
        if isinstance(data, int) and abs(data) > MAX_INT or not math.isfinite(data):
            raise CodecError(f"{where}: expected a finite number, got {_short(data)}")
        return float(data)
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise CodecError(f"{where}: expected an integer, got {_short(data)}")
        if abs(data) > MAX_INT:
            raise CodecError(f"{where}: {_short(data)} is out of range (|n| ≤ 10**30)")
        return data
    if tp is type(None):
        if data is not None:
            raise CodecError(f"{where}: expected null, got {_short(data)}")
        return None
    if tp in (str, bool):
        if not isinstance(data, tp):
            raise CodecError(f"{where}: expected {tp.__name__}, got {_short(data)}")
        return data
    raise CodecError(f"{where}: cannot decode into {tp!r}")


def _short(data: Any) -> str:
    """`data` for an error message: its repr, cut to 60 characters (a hostile report may hold
    a 4000-digit integer or a megabyte string)."""
    if isinstance(data, int) and not isinstance(data, bool) and abs(data) > MAX_INT:
        return f"an integer of {len(str(abs(data)))} digits"
    text = repr(data)
    return text if len(text) <= 60 else text[:57] + "..."
