"""Checks on a model before and right after its capture: what eager PyTorch would refuse,
and what would take absurdly long.

- `mixed_dtypes(graph, operands)`: the first op whose two operands (named per op packet by
  the rules, `fxlens.rules.eager.SAME_DTYPE_OPERANDS`) have different dtypes, as one
  `LoadError` naming the op, module and the user's source line. This runs on the captured
  graph, before any costing, rather than before the capture: a dtype mismatch exists only per
  op, and fake kernels accept it, so the graph is the first place it can be seen without
  running the model for real.
- `estimate_scale(module)`: a node count and capture time estimated from the module tree,
  refused above `MAX_ESTIMATED_NODES` unless the caller allows large models.

NB: the estimate is coarse: ≈ 6 graph nodes per leaf module and ≈ 5 ms of capture and
analysis per node (hf:llama-2-7b: 1,925 nodes from ~290 leaf modules, 14.5 s end to end with
every page on 2 CPU cores). `MAX_ESTIMATED_NODES` (≈ 20 minutes) is far above any real model
(llama-3-70b: ~4.8 k nodes).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.graph import Graph, TensorRef

NODES_PER_LEAF = 6
SECONDS_PER_NODE = 5e-3
MAX_ESTIMATED_NODES = 250_000


def mixed_dtypes(graph: Graph, operands: Mapping[str, tuple[str, str]]) -> None:
    """`LoadError` for the first op whose paired operands differ in dtype."""
    for node in graph.calls():
        names = operands.get(node.packet)
        if names is None:
            continue
        refs = [ref for ref in (node.args.get(name) for name in names)
                if isinstance(ref, TensorRef)]
        if len(refs) != 2:
            continue
        specs = [graph.spec(ref) for ref in refs]
        if any(spec is None for spec in specs):
            continue
        dtypes = [spec.dtype for spec in specs if spec is not None]
        if dtypes[0] != dtypes[1]:
            where = f" in {node.module or '(root)'}" + (f" at {node.source}" if node.source
                                                        else "")
            raise LoadError(
                f"{node.packet}{where}: {names[0]} is {dtypes[0]} but {names[1]} is "
                f"{dtypes[1]}; eager PyTorch refuses mixed dtypes here, so the model cannot "
                f"run as given (cast the input, e.g. x.float(), or the layer)")


def estimate_scale(module: torch.nn.Module) -> tuple[int, float]:
    """(estimated graph nodes, estimated capture seconds) from the count of leaf modules."""
    leaves = sum(1 for m in module.modules() if next(m.children(), None) is None)
    nodes = max(leaves, 1) * NODES_PER_LEAF
    return nodes, nodes * SECONDS_PER_NODE


def check_scale(module: torch.nn.Module, name: str, allow_large: bool) -> None:
    """`LoadError` with the estimate when capturing `module` would take absurdly long."""
    nodes, seconds = estimate_scale(module)
    if nodes > MAX_ESTIMATED_NODES and not allow_large:
        raise LoadError(too_large(name, nodes, seconds))


def too_large(name: str, nodes: float, seconds: float) -> str:
    return (f"{name}: about {nodes:,.0f} graph nodes, roughly {_duration(seconds)} to capture "
            f"and analyse (more than {MAX_ESTIMATED_NODES:,} nodes is refused); lower the "
            f"layer count, or pass --allow-large to run it anyway")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
