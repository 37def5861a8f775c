"""Our own plain graph: what capture produces and everything else reads.

A `Graph` is a frozen, topologically ordered tuple of `Node`s. Each node keeps the aten
overload it calls (as its qualified name, e.g. ``aten.addmm.default``), its arguments bound
to the op schema's names (tensors replaced by `TensorRef`s that point at the producing node),
its output `TensorSpec`s, the module path and type it ran under, and the user's source line.

Nothing here knows about torch.fx: capture converts fx graphs (or dispatch recordings) into
these types, so rules, memory and reports never touch ``torch.fx.Node.meta``.

Known limitations: symbolic (dynamic) shapes are concretised at capture time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

DTYPE_BYTES: Mapping[str, float] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16, "uint16": 2, "uint32": 4, "uint64": 8,
    "float4_e2m1fn_x2": 1,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype named as in torch (``float32``, ``bfloat16``...)."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}") from None


def ancestors(path: str) -> list[str]:
    """A module path and every module above it, root first: ``a.b`` → ``["", "a", "a.b"]``."""
    parts = path.split(".") if path else []
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def is_module_name(name: str) -> bool:
    """A module path or its tail: identifiers (or list indices) joined by dots."""
    return bool(name) and all(part.isidentifier() or part.isdigit() for part in name.split("."))


@dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype, strides and device of one tensor; no data."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...] = ()
    device: str = "meta"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the logical tensor (numel × itemsize)."""
        return int(self.numel * dtype_bytes(self.dtype))

    @property
    def allocation_bytes(self) -> int:
        """Bytes of a fresh storage holding the tensor: its strided extent, gaps included."""
        if not self.stride or len(self.stride) != len(self.shape):
            return self.nbytes
        if self.numel == 0:
            return 0
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.stride, strict=True))
        return int(extent * dtype_bytes(self.dtype))

    @property
    def storage_bytes(self) -> int:
        """Bytes the tensor can actually touch in its storage: its extent, gaps left out.

        NB: an expanded view (stride 0) of a small tensor reads only the small tensor, so a
        kernel reading it moves ``storage_bytes``, not ``nbytes``.
        """
        return min(self.allocation_bytes, self.nbytes)

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class TensorRef:
    """An argument that is the `index`-th output of node `node`."""

    node: int
    index: int = 0


@dataclass(frozen=True)
class Subgraph:
    """A function argument of a higher-order op (FlexAttention's ``score_mod`` and
    ``mask_mod``): the targets of the ops it runs, per element it is applied to."""

    ops: tuple[str, ...]


class NodeKind(str, Enum):
    INPUT = "input"
    PARAM = "param"
    BUFFER = "buffer"
    CALL = "call"


@functools.cache   # a graph has few distinct targets; rules and matchers ask per node
def packet(target: str) -> str:
    """The overload packet of an op name: ``aten.mm`` for ``aten.mm.default``."""
    parts = target.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 else target


CONSTANT_INPUT = "constant"   # the name of a recorded input that was no given input


@dataclass(frozen=True)
class Node:
    """One op call (or one graph input) in the captured graph."""

    id: int
    kind: NodeKind
    target: str                      # aten overload ("aten.mm.default") or input name
    args: Mapping[str, Any]          # schema-bound; tensors as TensorRef (lists of them too)
    outputs: tuple[TensorSpec | None, ...]
    module: str = ""                 # dotted module path, "" for the root
    module_type: str = ""            # qualified class name of that module
    source: str = ""                 # "path/to/file.py:123" of the user's line
    phase: str = "forward"           # "forward" or "backward" (joint graphs)
    # An input's values where the capture saw them real and they are small integers: a
    # BlockMask made before the forward, an index table (`fxlens.analyzer.core.aten.
    # known_value`). Rules that need values read them (`fxlens.rules.mask_values`).
    value: Any = field(default=None, compare=False, repr=False)

    @property
    def packet(self) -> str:
        """The overload packet, e.g. ``aten.mm`` for ``aten.mm.default``."""
        return packet(self.target)

    def input_refs(self) -> Iterator[TensorRef]:
        """Every TensorRef among the arguments, in schema order."""
        for value in self.args.values():
            if isinstance(value, TensorRef):
                yield value
            elif isinstance(value, (list, tuple)):
                yield from (v for v in value if isinstance(v, TensorRef))


def map_refs(value: Any, f: Callable[[TensorRef], Any]) -> Any:
    """An argument value (or a node's whole ``args``) with every TensorRef in it replaced by
    ``f(ref)``; lists, tuples and mappings rebuilt, everything else as it is."""
    if isinstance(value, TensorRef):
        return f(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_refs(v, f) for v in value)
    if isinstance(value, Mapping):
        return {k: map_refs(v, f) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class ParamInfo:
    """A parameter or buffer of the captured module, by its qualified name."""

    name: str
    spec: TensorSpec
    is_buffer: bool = False
    requires_grad: bool = True

    @property
    def owner(self) -> str:
        """Path of the module that owns it (``a.b`` for ``a.b.weight``)."""
        return self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Graph:
    """A captured model: nodes in execution order plus what the module owns."""

    nodes: tuple[Node, ...]
    capture_method: str
    params: tuple[ParamInfo, ...] = ()
    module_types: Mapping[str, str] = field(default_factory=dict)  # path -> class name
    outputs: tuple[TensorRef, ...] = ()
    notes: tuple[str, ...] = ()
    # Tensors of a training step that outlive it, by role: "gradient" (a parameter's .grad),
    # "optimizer_state". Like `outputs`, they stay live to the end of the graph.
    roles: Mapping[TensorRef, str] = field(default_factory=dict)
    # A parameter or buffer held under several names (tied embeddings): further name → first.
    # A capture may give each name its own graph input; they are one storage.
    tied: Mapping[str, str] = field(default_factory=dict)

    def spec(self, ref: TensorRef) -> TensorSpec | None:
        outputs = self.nodes[ref.node].outputs
        return outputs[ref.index] if ref.index < len(outputs) else None

    def calls(self) -> Iterator[Node]:
        return (n for n in self.nodes if n.kind is NodeKind.CALL)

    def example_inputs(self) -> list[tuple[str, TensorSpec]]:
        """The inputs the model was given, by name, in order: not the tensors a recorded
        forward reached that were no input, parameter or buffer (``CONSTANT_INPUT``)."""
        return [(n.target, spec) for n in self.nodes
                if n.kind is NodeKind.INPUT and n.target != CONSTANT_INPUT and n.outputs
                and (spec := n.outputs[0]) is not None]


def repeated_blocks(module_types: Mapping[str, str]) -> tuple[str, ...]:
    """Paths of repeated blocks: the children ``0 … N-1`` (N ≥ 2) of one parent, of one type,
    or of several where each has modules of its own (a hybrid's layer list: Jamba's Mamba and
    attention layers, Zamba's; a ``Sequential`` of leaf layers, Linear then ReLU, is none).

    `module_types` maps module path → type name (``Graph.module_types``). A run nested in a
    block of another run (the experts inside each decoder layer) is left out: checkpointing
    the outer blocks already covers it. Runs come in the order of `module_types`.
    """
    children: dict[str, dict[str, str]] = {}
    for path in module_types:
        if path:
            parent, _, name = path.rpartition(".")
            children.setdefault(parent, {})[name] = path
    parents = set(children)
    runs: list[list[str]] = []
    for kids in children.values():
        numbered = {name for name in kids if name.isdigit()}
        if len(numbered) < 2 or numbered != {str(i) for i in range(len(numbered))}:
            continue
        run = [kids[str(i)] for i in range(len(numbered))]
        if len({module_types[p] for p in run}) == 1 or all(p in parents for p in run):
            runs.append(run)
    members = [p for run in runs for p in run]
    outer = [run for run in runs
             if not any(run[0].startswith(m + ".") for m in members)]
    return tuple(p for run in outer for p in run)


def block_of(module: str, blocks: Sequence[str]) -> str:
    """The block among `blocks` (module paths) that module path `module` is or lies inside;
    "" when none."""
    return next((b for b in blocks if module == b or module.startswith(b + ".")), "")
