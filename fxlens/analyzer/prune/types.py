"""The pruning room's rule-facing API: what an axis rule sees of one op call, and what the
engine needs from `fxlens.rules.prune`.

An *axis layout* says which prunable units one tensor axis carries: a tuple of `Atom`s, each a
run of units of one *space* (a set of channels that must be removed together wherever they
appear), ``width`` tensor entries per unit. A linear layer's output features start as one fresh
space; a view to ``(…, H, d)`` makes its unit a head of ``d`` entries; a ``cat`` lays two
layouts end to end; a residual ``add`` unifies the spaces of both operands. An axis rule
(``AxisRule``: one per op packet, in the rules) reads its arguments' layouts through `AxisCall`
and says its outputs' layouts; anything it cannot follow it *pins* (a pinned space is never
pruned: a model input or output, a spatial or sequence axis, an op without a rule).

Only types live here, so rules import them without importing the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn

    from fxlens.analyzer.core.graph import Node


@dataclass(frozen=True)
class Atom:
    """`count` units of `space` from unit `start`, each `width` entries of the tensor axis."""

    space: int
    start: int
    count: int
    width: int

    @property
    def entries(self) -> int:
        return self.count * self.width


Layout = tuple[Atom, ...]
Axes = tuple[Layout, ...]          # one layout per dimension of a tensor
Removal = Mapping[int, frozenset[int]]    # group root → its units removed


def entries(layout: Layout) -> int:
    """How long the axis is."""
    return sum(a.entries for a in layout)


class AxisCall(Protocol):
    """One op call as an axis rule sees it: arguments by schema name, their layouts."""

    node: Node

    def arg(self, name: str, default: Any = None) -> Any: ...
    def shape(self, name: str) -> tuple[int, ...] | None: ...
    def out_shape(self, index: int = 0) -> tuple[int, ...]: ...
    def axes(self, name: str) -> Axes | None: ...
    def axes_list(self, name: str) -> list[Axes]: ...
    def output(self, axes: Axes, index: int = 0) -> None: ...
    def unify(self, a: Layout, b: Layout) -> None: ...
    def fresh(self, size: int, pinned: str | None = None) -> Layout: ...
    def pin(self, layout: Layout, reason: str) -> None: ...
    def cut(self, layout: Layout, start: int, end: int) -> Layout: ...
    def widen(self, layout: Layout, factor: int) -> Layout: ...
    def reshape(self, axes: Axes, shape: Sequence[int], new_shape: Sequence[int]) -> Axes: ...
    def broadcast(self, shape: Sequence[int], *operands: Axes | None) -> Axes: ...


AxisRule = Callable[[AxisCall], None]
# A module whose parameters were sliced → the attributes to set on it (``in_features``…)
AttributeFix = Callable[["nn.Module"], Mapping[str, Any]]


@dataclass(frozen=True)
class PruneKnowledge:
    """What the pruning engine needs from the rules."""

    axis_rules: Mapping[str, AxisRule]       # by op packet (``aten.linear``)
    ignored_ops: frozenset[str]              # no tensor output that matters (asserts)
    attribute_fixes: Callable[[nn.Module], Mapping[str, Any]]
    # module types whose weight is a scale per channel read as importance (|γ|)
    scale_types: tuple[str, ...]
    residual_ops: frozenset[str]             # a block whose input meets one is residual
    # dims the kernels like: a member dim that was a multiple and stops being one is noted
    alignments: tuple[int, ...] = (128, 64, 8)
    # the row alignment (bytes) below which the matmul rules mark a GEMM with the kernel
    # class `misaligned_kernel`, rated at the device's share for it
    aligned_bytes: int = 16
    misaligned_kernel: str = "gemm-misaligned"
    # `args` of a node whose tensors changed shape, fixed to match (a depthwise conv's groups)
    resize_args: Callable[[Node, Sequence[tuple[int, ...]], Sequence[tuple[int, ...]]],
                          Mapping[str, Any]] | None = None
