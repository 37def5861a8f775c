"""`analyze(graph) -> Report`: cost every node with the rules, roll costs up per module.

Every call node ends in exactly one status: ``costed`` (a rule ran), ``free`` (declared free:
views, metadata), ``unsupported`` (no rule: listed in coverage, never silently zero) or
``failed`` (the rule raised: recorded in coverage; `strict` re-raises instead).

Byte defaults, when a rule leaves them out: each distinct input tensor is read once (its
storage bytes, so a broadcast view counts its small base) and each output is written once.
Module roll-ups add each node to its module and every ancestor up to the root (``""``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import torch

import fxlens
from fxlens.analyzer.core.costs import Cost, CostRegistry, OpCall, Recurrence
from fxlens.analyzer.core.errors import RuleError
from fxlens.analyzer.core.graph import Graph, Node, ancestors
from fxlens.analyzer.core.report import (
    Coverage,
    InputSpec,
    ModelInfo,
    ModuleReport,
    NodeReport,
    Report,
    Totals,
)

log = logging.getLogger(__name__)

FREE = Cost(0, 0, 0)


@dataclass(frozen=True)
class NodeCost:
    status: str
    flops: int
    bytes_read: int
    bytes_written: int
    error: str = ""
    note: str = ""          # the convention the rule applied (causal attention…)
    kernel: str = ""        # the kernel class, where it has its own rate
    recurrence: Recurrence | None = None   # steps walked in order (`Cost`)


def cost_node(node: Node, graph: Graph, registry: CostRegistry, strict: bool = False) -> NodeCost:
    """Cost one call node; never raises unless `strict`."""
    rule = registry.lookup(node)
    if rule is None:
        return NodeCost("unsupported", 0, 0, 0)
    if isinstance(rule, str):
        return NodeCost("free", 0, 0, 0)
    call = OpCall(node, graph)
    try:
        cost = rule(call)
    except Exception as error:
        where = f"{node.target} (node {node.id}, module {node.module or '<root>'}, {node.source})"
        if strict:
            raise RuleError(f"cost rule failed on {where}: {error}") from error
        log.warning("cost rule failed on %s: %s", where, error)
        return NodeCost("failed", 0, 0, 0, f"{type(error).__name__}: {error}")
    read = call.default_bytes_read if cost.bytes_read is None else cost.bytes_read
    written = call.default_bytes_written if cost.bytes_written is None else cost.bytes_written
    return NodeCost("costed", int(cost.flops), int(read), int(written), note=cost.note,
                    kernel=cost.kernel, recurrence=cost.recurrence)


def analyze(
    graph: Graph,
    registry: CostRegistry,
    name: str = "model",
    source: str = "",
    strict: bool = False,
) -> Report:
    costs = {n.id: cost_node(n, graph, registry, strict) for n in graph.calls()}
    nodes = tuple(_node_report(n, costs[n.id]) for n in graph.calls())
    totals = Totals(
        flops=sum(n.flops for n in nodes),
        macs=sum(n.flops for n in nodes) // 2,
        bytes_read=sum(n.bytes_read for n in nodes),
        bytes_written=sum(n.bytes_written for n in nodes),
    )
    return Report(
        model=_model_info(graph, name, source),
        totals=totals,
        nodes=nodes,
        modules=_roll_up(graph, nodes),
        coverage=_coverage(graph, costs),
        meta={"fxlens_version": fxlens.__version__, "torch_version": torch.__version__},
    )


def _node_report(node: Node, cost: NodeCost) -> NodeReport:
    return NodeReport(
        id=node.id, target=node.target, status=cost.status, module=node.module,
        module_type=node.module_type, source=node.source,
        inputs=tuple(dict.fromkeys(r.node for r in node.input_refs())),
        outputs=tuple(o.to_json() for o in node.outputs if o is not None),
        flops=cost.flops, bytes_read=cost.bytes_read, bytes_written=cost.bytes_written,
        phase=node.phase, note=cost.note, kernel=cost.kernel,
        recurrence=cost.recurrence,
    )


def _model_info(graph: Graph, name: str, source: str) -> ModelInfo:
    params = [p for p in graph.params if not p.is_buffer]
    buffers = [p for p in graph.params if p.is_buffer]
    return ModelInfo(
        name=name, source=source, capture_method=graph.capture_method,
        capture_notes=graph.notes,
        params=sum(p.spec.numel for p in params),
        param_bytes=sum(p.spec.nbytes for p in params),
        trainable_params=sum(p.spec.numel for p in params if p.requires_grad),
        buffers=sum(p.spec.numel for p in buffers),
        buffer_bytes=sum(p.spec.nbytes for p in buffers),
        inputs=tuple(InputSpec(name, spec.shape, spec.dtype)
                     for name, spec in graph.example_inputs()),
    )


def _roll_up(graph: Graph, nodes: tuple[NodeReport, ...]) -> tuple[ModuleReport, ...]:
    sums: dict[str, Counter[str]] = {p: Counter() for p in graph.module_types}
    sums.setdefault("", Counter())
    # Each module's own nodes first, then each module's sums onto its ancestors: the same
    # sums, and new paths join `sums` in the same order (a module's first node) as when
    # every node is added to every ancestor.
    own: dict[str, list[int]] = {}
    for node in nodes:
        acc_own = own.setdefault(node.module, [0, 0, 0, 0])
        acc_own[0] += node.flops
        acc_own[1] += node.bytes_read
        acc_own[2] += node.bytes_written
        acc_own[3] += 1
    for module, (flops, read, written, count) in own.items():
        for path in ancestors(module):
            acc = sums.setdefault(path, Counter())
            acc.update(flops=flops, bytes_read=read, bytes_written=written, nodes=count)
    for param in graph.params:
        if param.is_buffer:
            continue
        for path in ancestors(param.owner):
            sums.setdefault(path, Counter()).update(params=param.spec.numel,
                                                    param_bytes=param.spec.nbytes)
    types = {n.module: n.module_type for n in nodes if n.module_type}
    types.update(graph.module_types)
    return tuple(
        ModuleReport(
            path=path, type=types.get(path, ""), depth=len(ancestors(path)) - 1,
            flops=acc["flops"], macs=acc["flops"] // 2, bytes_read=acc["bytes_read"],
            bytes_written=acc["bytes_written"], params=acc["params"],
            param_bytes=acc["param_bytes"], nodes=acc["nodes"],
        )
        for path, acc in sums.items()
    )


def _coverage(graph: Graph, costs: dict[int, NodeCost]) -> Coverage:
    statuses = Counter(c.status for c in costs.values())
    unsupported = Counter(graph.nodes[i].target for i, c in costs.items()
                          if c.status == "unsupported")
    failed = {graph.nodes[i].target: c.error for i, c in costs.items() if c.status == "failed"}
    return Coverage(costed=statuses["costed"], free=statuses["free"],
                    unsupported=dict(sorted(unsupported.items())),
                    failed=dict(sorted(failed.items())))

