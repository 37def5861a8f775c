"""Fusion: the findings (``findings``) and the predicted kernels (``fusion``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fxlens.analyzer.core.codec import decode, encode
from fxlens.analyzer.core.section import Section, section


@dataclass(frozen=True)
class Finding:
    """One fusion opportunity: what a rule matched, what fusing it saves, how to fix it
    (`saved_flops`: work the fix skips as well, as FUS009's ``is_causal=True`` does)."""

    code: str
    nodes: tuple[int, ...]
    modules: tuple[str, ...]
    saved_bytes: int
    saved_s: float | None
    message: str
    fix: str
    saved_flops: int = 0


@section("findings")
@dataclass(frozen=True)
class Findings(Section):
    """Fusion findings, most time saved first (most bytes without a device); written as a
    JSON list."""

    items: tuple[Finding, ...] = ()

    def to_json(self) -> Any:
        return [encode(f) for f in self.items]

    @classmethod
    def from_json(cls, data: Any) -> Findings:
        return cls(decode(tuple[Finding, ...], data, cls.key))


@dataclass(frozen=True)
class KernelCounts:
    kernels_unfused: int = 0
    kernels_fused: int = 0
    bytes_unfused: int = 0
    bytes_fused: int = 0


@section("fusion")
@dataclass(frozen=True)
class Fusion(Section):
    """Kernels and bytes moved, op by op and as a fusing compiler would group them."""

    kernels_unfused: int
    kernels_fused: int
    bytes_unfused: int
    bytes_fused: int
    policy: str
    kernels_fused_with_epilogues: int | None
    by_module: Mapping[str, KernelCounts]
