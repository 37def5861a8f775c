"""Quantization sensitivity per layer: data-free scores from the weights, structure from the
graph, and (`fxlens.analyzer.quant.calibrated`) measured output SQNR; `quant_section` joins them
with a precision plan (`fxlens.analyzer.quant.plan`) into the report's ``quant`` section.

The op knowledge (which modules are layers, the formats, the risk rules, what random init looks
like) comes in as a `QuantKnowledge` (`fxlens.analyzer.quant.types`) built by `fxlens.pipeline`
from `fxlens.rules.quant`.

Data-free score of a layer at a format: the weight SQNR ``10·log10(Σw² / Σ(w − ŵ)²)`` minus
`risk_penalty_db` per structural risk. NB: for a linear layer on isotropic inputs the output
SQNR equals the weight SQNR; how the error grows on its way to the model output is unknown
without data, which is what ``--calibrate`` measures.

Weights on the meta device, or that look like the layer's own default initialisation (see
`fxlens.rules.quant.random_init_reason`), get statistics but no score, with the reason.

Known limitations: a tied weight (LM head = embedding) is scored once, under its owner.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef
from fxlens.analyzer.quant.types import LayerView, QuantKnowledge, Risk, WeightStats

OUTLIER_RATIO = 4.0     # NB: a channel is an outlier when its max|w| exceeds 4× the median's


@dataclass(frozen=True)
class Layer:
    """A quantizable layer of the model: its module, weight and output-channel axis."""

    name: str
    module: nn.Module
    module_type: str
    axis: int
    initializer_range: float | None = None     # the model's (transformers configs have one)

    @property
    def weight(self) -> torch.Tensor:
        return self.module.weight  # type: ignore[return-value]

    @property
    def fans(self) -> tuple[int, int]:
        """(fan_in, fan_out) of the weight."""
        shape = tuple(self.weight.shape)
        return math.prod(shape) // max(shape[self.axis], 1), shape[self.axis]


def find_layers(module: nn.Module, knowledge: QuantKnowledge) -> list[Layer]:
    """Every quantizable layer, in `named_modules` order (shared weights once)."""
    seen: set[int] = set()
    layers = []
    init_range = getattr(getattr(module, "config", None), "initializer_range", None)
    for name, sub in module.named_modules():
        axis = knowledge.channel_axis(sub)
        if axis is None or id(sub.weight) in seen:
            continue
        seen.add(id(sub.weight))
        layers.append(Layer(name, sub, type(sub).__name__, axis,
                            init_range if isinstance(init_range, float) else None))
    return layers


# --- weights ---------------------------------------------------------------------------------


def weight_stats(weight: torch.Tensor, axis: int) -> WeightStats:
    w = weight.detach().float()
    mean, std = w.mean(), w.std(unbiased=False).clamp(min=1e-30)
    kurtosis = ((w - mean) ** 4).mean() / std**4
    channels = w.movedim(axis, 0).reshape(w.shape[axis], -1).abs().amax(dim=1)
    median = channels.median().clamp(min=1e-30)
    absmax = float(w.abs().max())
    return WeightStats(numel=w.numel(), mean=float(mean), std=float(std), absmax=absmax,
                       max_over_std=absmax / float(std), kurtosis=float(kurtosis),
                       outlier_channel_share=float((channels > OUTLIER_RATIO * median)
                                                   .float().mean()))


def sqnr_db(signal: torch.Tensor, noisy: torch.Tensor) -> float:
    """``10·log10(E[x²] / E[(x − x̂)²])``; +inf when exact."""
    s, n = signal.detach().double(), noisy.detach().double()
    noise = float((s - n).pow(2).sum())
    power = float(s.pow(2).sum())
    if noise == 0.0:
        return math.inf
    return 10 * math.log10(max(power, 1e-300) / noise)


@dataclass(frozen=True)
class DataFree:
    """One layer's data-free result."""

    status: str                              # "scored", "meta" or "random_init"
    reason: str
    stats: WeightStats | None
    weight_sqnr_db: Mapping[str, float]
    score_db: Mapping[str, float]            # weight SQNR − risk penalty


def data_free(layer: Layer, risks: Sequence[Risk], knowledge: QuantKnowledge) -> DataFree:
    weight = layer.weight
    if weight.is_meta:
        return DataFree("meta", "weights on the meta device: nothing to quantize", None, {}, {})
    stats = weight_stats(weight, layer.axis)
    reason = knowledge.random_init_reason(stats, *layer.fans, layer.module_type,
                                          layer.initializer_range)
    if reason is not None:
        return DataFree("random_init", f"looks like random initialisation: {reason}", stats,
                        {}, {})
    sqnr = {name: sqnr_db(weight, fmt.fake_quantize(weight, layer.axis))
            for name, fmt in knowledge.formats.items()}
    penalty = knowledge.risk_penalty_db * len(risks)
    return DataFree("scored", "", stats, sqnr, {k: v - penalty for k, v in sqnr.items()})


# --- structure -------------------------------------------------------------------------------


def layer_views(graph: Graph, layers: Sequence[Layer], knowledge: QuantKnowledge
                ) -> dict[str, LayerView]:
    """Where each layer's output goes: the ops it feeds, first/last, residual writes."""
    consumers: dict[int, list[tuple[Node, str]]] = {n.id: [] for n in graph.nodes}
    for node in graph.nodes:
        for arg, value in node.args.items():
            refs = value if isinstance(value, (list, tuple)) else [value]
            for ref in refs:
                if isinstance(ref, TensorRef):
                    consumers[ref.node].append((node, arg))
    constant = _param_derived(graph)
    computes = _compute_nodes(graph, layers, consumers, constant)
    owner = {node_id: name for name, ids in computes.items() for node_id in ids}
    upstream = _reach(graph.nodes, owner, lambda n: [r.node for r in n.input_refs()])
    downstream = _reach(reversed(graph.nodes), owner,
                        lambda n: [c.id for c, _ in consumers[n.id]])
    views = {}
    for layer in layers:
        ids = computes.get(layer.name, [])
        feeds, residual = _feeds(graph, ids, owner, consumers, constant, knowledge)
        views[layer.name] = LayerView(
            name=layer.name, module_type=layer.module_type, feeds=frozenset(feeds),
            is_first=bool(ids) and not any(upstream[i] for i in ids),
            is_last=bool(ids) and not any(downstream[i] for i in ids),
            feeds_residual=residual)
    return views


def _param_derived(graph: Graph) -> set[int]:
    derived: set[int] = set()
    for node in graph.nodes:
        refs = list(node.input_refs())
        if node.kind in (NodeKind.PARAM, NodeKind.BUFFER) or (
                node.kind is NodeKind.CALL and refs and all(r.node in derived for r in refs)):
            derived.add(node.id)
    return derived


def _compute_nodes(graph: Graph, layers: Sequence[Layer],
                   consumers: Mapping[int, list[tuple[Node, str]]], constant: set[int]
                   ) -> dict[str, list[int]]:
    """Per layer, the call nodes that apply its weight to an activation."""
    params = {n.target: n.id for n in graph.nodes if n.kind is NodeKind.PARAM}
    found: dict[str, list[int]] = {}
    for layer in layers:
        start = params.get(f"{layer.name}.weight" if layer.name else "weight")
        stack, ids = ([start] if start is not None else []), []
        while stack:
            for node, _ in consumers[stack.pop()]:
                if node.id in constant:
                    stack.append(node.id)
                elif node.id not in ids:
                    ids.append(node.id)
        found[layer.name] = ids
    return found


def _reach(nodes: Any, owner: Mapping[int, str], neighbours: Callable[[Node], list[int]]
           ) -> dict[int, bool]:
    """For each node: is some other layer's compute node strictly beyond it (one sweep)?"""
    beyond: dict[int, bool] = {}
    for node in nodes:
        beyond[node.id] = any(i in owner or beyond.get(i, False) for i in neighbours(node))
    return beyond


def _feeds(graph: Graph, start: Sequence[int], owner: Mapping[int, str],
           consumers: Mapping[int, list[tuple[Node, str]]], constant: set[int],
           knowledge: QuantKnowledge) -> tuple[set[str], bool]:
    feeds: set[str] = set()
    residual = False
    stack, seen = list(start), set(start)
    while stack:
        for node, arg in consumers[stack.pop()]:
            if node.id in seen or node.id in owner:
                continue
            seen.add(node.id)
            tag = f"{node.packet}:{arg}" if "attention" in node.packet else node.packet
            feeds.add(tag)
            residual |= node.packet in knowledge.residual_ops and _is_residual(graph, node,
                                                                                constant)
            if tag not in knowledge.stop_ops and node.packet not in knowledge.stop_ops:
                stack.append(node.id)
    return feeds, residual


def _is_residual(graph: Graph, node: Node, constant: set[int]) -> bool:
    refs = list(node.input_refs())
    if len(refs) != 2 or any(r.node in constant for r in refs):
        return False
    a, b = graph.spec(refs[0]), graph.spec(refs[1])
    return a is not None and b is not None and a.shape == b.shape
