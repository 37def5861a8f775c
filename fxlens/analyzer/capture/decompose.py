"""Decompose ops that no rule knows into ops that rules do know.

Capture keeps ops whole wherever a rule knows them (``linear``, ``scaled_dot_product_attention``,
``layer_norm``…). A node whose op has no rule and is not declared free is replaced by the
graph of PyTorch's own decomposition of that op, traced on meta tensors of the node's input
specs; the new nodes inherit the module path and source line of the node they replace. This
repeats until every op is known or has no decomposition (those stay, shown as unsupported).

NB: only the unknown nodes are traced again, which keeps a 70B-parameter graph fast; running
``ExportedProgram.run_decompositions`` over the whole graph costs as much as the export itself.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxlens.analyzer.capture.fx_convert import FxConverter
from fxlens.analyzer.core.aten import meta_tensor, resolve_op
from fxlens.analyzer.core.graph import Node, NodeKind, TensorRef, TensorSpec, map_refs

log = logging.getLogger(__name__)

MAX_ROUNDS = 6


@functools.cache
def decomposition_table() -> Mapping[Any, Callable[..., Any]]:
    """PyTorch's decompositions, CompositeImplicitAutograd ones included."""
    return dict(torch.export.default_decompositions().items())


def decompose_unknown(
    nodes: list[Node], known: Callable[[str], bool], refs: tuple[TensorRef, ...] = ()
) -> tuple[list[Node], tuple[TensorRef, ...]]:
    """`nodes` with every unknown, decomposable op replaced by its decomposition, and `refs`
    (e.g. the graph outputs) renumbered to match."""
    for _ in range(MAX_ROUNDS):
        todo = {n.id for n in nodes if n.kind is NodeKind.CALL and not known(n.target)
                and _decomposition(n.target) is not None}
        if not todo:
            break
        nodes, moved = _splice(nodes, todo)
        refs = tuple(moved[(r.node, r.index)] for r in refs)
    return nodes, refs


def _decomposition(target: str) -> Callable[..., Any] | None:
    try:
        op = resolve_op(target)
    except (AttributeError, ValueError):
        return None
    return decomposition_table().get(op)


def _splice(nodes: list[Node], todo: set[int]) -> tuple[list[Node], dict[tuple[int, int], Any]]:
    """Renumber `nodes`, replacing those in `todo` by their traced decompositions."""
    out: list[Node] = []
    moved: dict[tuple[int, int], Any] = {}   # old (node, index) -> new ref or value

    for node in nodes:
        args = map_refs(node.args, lambda ref: moved[(ref.node, ref.index)])
        if node.id in todo:
            results = _trace_decomposition(node, args, out)
        else:
            out.append(dataclasses.replace(node, id=len(out), args=args))
            results = tuple(TensorRef(len(out) - 1, i) for i in range(max(len(node.outputs), 1)))
        for index, ref in enumerate(results):
            moved[(node.id, index)] = ref
    return out, moved


def _trace_decomposition(node: Node, args: dict[str, Any], out: list[Node]) -> tuple[Any, ...]:
    """Trace the decomposition of `node` on meta inputs, append its nodes to `out`."""
    decomposition = _decomposition(node.target)
    assert decomposition is not None
    refs = list(dict.fromkeys(v for v in _flat(args.values()) if isinstance(v, TensorRef)))
    specs = [_spec(out, r) for r in refs]

    schema = resolve_op(node.target)._schema

    def run(*tensors: torch.Tensor) -> Any:
        feed = dict(zip(refs, tensors, strict=True))
        values = map_refs(args, feed.__getitem__)
        positional = [values[a.name] for a in schema.arguments if not a.kwarg_only]
        keywords = {a.name: values[a.name] for a in schema.arguments if a.kwarg_only}
        return decomposition(*positional, **keywords)

    gm = make_fx(run, tracing_mode="real")(*[meta_tensor(s) for s in specs])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    converter = FxConverter(input_kind=lambda n: (NodeKind.INPUT, n.name), nodes=out)
    first = len(out)
    converter.convert(gm.graph, gm, dict(zip(placeholders, refs, strict=True)))
    for i in range(first, len(out)):
        out[i] = dataclasses.replace(out[i], module=node.module, module_type=node.module_type,
                                     source=node.source, phase=node.phase)
    log.debug("decomposed %s into %d nodes", node.target, len(out) - first)
    return converter.outputs


def _spec(nodes: list[Node], ref: TensorRef) -> TensorSpec:
    spec = nodes[ref.node].outputs[ref.index]
    assert spec is not None
    return spec


def _flat(values: Any) -> list[Any]:
    flat: list[Any] = []
    for v in values:
        flat.extend(_flat(v) if isinstance(v, (list, tuple)) else [v])
    return flat

