"""The base of typed report sections and the registry that maps JSON keys to their classes.

A section is a frozen dataclass subclassing `Section`, registered with `@section("key")`: the
key is its name in the report JSON, and `Report.get(KVCache)` finds it by type. Its JSON is
written and read by the one codec (`fxlens.analyzer.core.codec`); a section whose JSON is not
an object (``findings`` is a list) overrides `to_json` / `from_json` and nothing else.
Registering two classes under one key is refused, naming both.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from fxlens.analyzer.core.codec import decode, encode

S = TypeVar("S", bound="Section")


class Section:
    """A typed, frozen part of a report, written under `key` in the JSON."""

    key: ClassVar[str]

    def to_json(self) -> Any:
        return encode(self)

    @classmethod
    def from_json(cls: type[S], data: Any) -> S:
        return decode(cls, data, cls.key)


SECTION_TYPES: dict[str, type[Section]] = {}


def section(key: str) -> Any:
    """Register a `Section` class under its JSON key."""

    def register(cls: type[S]) -> type[S]:
        known = SECTION_TYPES.get(key)
        if known is not None and known is not cls:
            raise TypeError(f"section key {key!r} registered twice: {known.__module__}."
                            f"{known.__qualname__} and {cls.__module__}.{cls.__qualname__}")
        cls.key = key
        SECTION_TYPES[key] = cls
        return cls

    return register
