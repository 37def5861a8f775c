"""What a captured training step says about its MoE layers, read from the graph alone: the
shapes of the expert weights and the ops that write tensors of those shapes, the experts per
layer, the routers, and the token rows GEMMs reading given weights take (the routed rows of
the experts, the scored rows of a router).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from fxlens.analyzer.core.graph import Graph, TensorRef


def expert_weight_shapes(graph: Graph, expert_params: Collection[str]
                         ) -> frozenset[tuple[int, ...]]:
    """The shapes of the 3-D expert weights, in either order of their last two dims (the
    weight, its transpose, their gradients)."""
    shapes = set()
    for p in graph.params:
        if p.name in expert_params and len(p.spec.shape) == 3:
            e, a, b = p.spec.shape
            shapes |= {(e, a, b), (e, b, a)}
    return frozenset(shapes)


def expert_weight_nodes(graph: Graph, shapes: Collection[tuple[int, ...]],
                        skip: Collection[int]) -> set[int]:
    """Calls outside `skip` that write a tensor of one of `shapes` (`expert_weight_shapes`)."""
    return {n.id for n in graph.calls() if n.id not in skip
            and any(o is not None and tuple(o.shape) in shapes for o in n.outputs)}


def expert_count(graph: Graph, expert_params: Collection[str]) -> int:
    """Experts per MoE layer: indexed expert modules, or a 3-D weight's leading dimension."""
    counts: dict[str, set[str]] = {}
    for p in graph.params:
        if p.name not in expert_params:
            continue
        parent, _, index = p.owner.rpartition(".")
        if index.isdigit():
            counts.setdefault(parent, set()).add(index)
        elif len(p.spec.shape) == 3:
            counts.setdefault(p.owner, set()).update(str(i) for i in range(p.spec.shape[0]))
    return max((len(v) for v in counts.values()), default=0)


def gemm_rows(graph: Graph, gemms: Iterable[tuple[Sequence[str], Iterable[TensorRef]]],
              params: Collection[str]) -> tuple[int, int]:
    """Bytes and rows of the token activations that the GEMMs among `gemms` ((weights,
    activations)) reading one of `params` take: for expert weights the routed rows, each
    token once per chosen expert; for a router's weight the rows it scores, one per token,
    whatever the model was fed (token ids or embeddings)."""
    refs = {ref for weights, activations in gemms if set(weights) & set(params)
            for ref in activations}
    specs = [spec for spec in (graph.spec(r) for r in refs)    # rows, not grouped offsets
             if spec is not None and len(spec.shape) >= 2 and "int" not in spec.dtype]
    return (sum(spec.nbytes for spec in specs),
            sum(spec.numel // max(spec.shape[-1], 1) for spec in specs))


def router_modules(graph: Graph, expert_params: Collection[str], experts: int) -> frozenset[str]:
    """The modules of a MoE's routers: owners of a 2-D weight, not an expert's, with one output
    feature per expert (the gate's scores: Mixtral's and Qwen3's ``gate``, GPT-OSS's
    ``router``, DeepSeek-V3's and Nemotron 3's ``gate``)."""
    if not experts:
        return frozenset()
    return frozenset(p.owner for p in graph.params
                     if not p.is_buffer and p.name not in expert_params
                     and len(p.spec.shape) == 2 and p.spec.shape[0] == experts)
