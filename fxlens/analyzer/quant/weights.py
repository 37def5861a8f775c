"""Quantization sensitivity per layer: the candidates (every weight matrix), data-free scores
from the weights, structure from the graph; `quant_section` joins them with the Fisher scores
(`fxlens.analyzer.quant.fisher`), the measured damage (`fxlens.analyzer.quant.calibrated`) and a
precision plan (`fxlens.analyzer.quant.plan`) into the report's ``quant`` section.

The op knowledge (which modules are layers, the formats, the risk rules, what random init looks
like) comes in as a `QuantKnowledge` (`fxlens.analyzer.quant.types`) built by `fxlens.pipeline`
from `fxlens.rules.quant`.

Candidates: every floating weight matrix of the model (`QuantKnowledge.weight_matrices`): a known
layer's ``weight`` under the layer's name, any other (GRU/LSTM ``weight_ih_l0``, attention's
``in_proj_weight``, custom tables) under its parameter path.

BatchNorm folding: a batch norm whose input is only a linear or conv layer's output is folded
into that layer before anything is scored, as deployment does: the weight quantized is
``w·s`` with ``s = γ/√(var + ε)`` per output channel, so a layer's quantization error, in its
own units, is ``Q(w·s)/s − w`` (`Layer.quantize`).

Weights-only prior (`DataFree.score_db`, used when no forward can run): the per-channel
averaged weight SQNR ``−10·log10(mean_c Σ(w_c − ŵ_c)² / Σw_c²)`` (rescaling an output channel
leaves it unchanged), each weight's error and signal weighed by the scale of the input channel it
multiplies where the feeding layer is known through a positively homogeneous link
(`fxlens.analyzer.quant.links`: rescaling across a ReLU then moves the score as it moves the
real damage), minus the structural
terms: `risk_penalty_db` per risk, `propagation_db` times (½ − the layer's position in
execution order, 0…1: the middle layer unchanged), `role_db` for first layers, embeddings and
heads. NB: the terms are priors of the
size measured damage spreads over, not a propagation model; the Fisher on synthetic inputs
(`fxlens.analyzer.quant.fisher`) replaces the prior whenever the example inputs can run.

Weights on the meta device, or that look like the layer's own default initialisation (see
`fxlens.rules.quant.random_init_reason`), get statistics but no score, with the reason.

Known limitations: a tied weight (LM head = embedding) is scored once, under its owner.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef
from fxlens.analyzer.quant.types import (
    LayerView,
    NumberFormatLike,
    QuantKnowledge,
    Risk,
    WeightStats,
)

OUTLIER_RATIO = 4.0     # NB: a channel is an outlier when its max|w| exceeds 4× the median's
BATCH_NORM_OPS = frozenset({"aten.batch_norm", "aten._native_batch_norm_legit_no_training",
                            "aten.native_batch_norm", "aten._batch_norm_impl_index"})


@dataclass(frozen=True)
class Layer:
    """A quantization candidate: one weight matrix, its module and output-channel axis."""

    name: str
    module: nn.Module
    module_type: str
    axis: int
    initializer_range: float | None = None     # the model's (transformers configs have one)
    param: str = "weight"                      # the attribute of `module` holding the weight
    path: str = ""                             # the parameter's qualified name in the model
    fold: torch.Tensor | None = field(default=None, compare=False)  # folded BN, per channel
    folded_into: str = ""                      # that batch norm's module path

    @property
    def weight(self) -> torch.Tensor:
        return getattr(self.module, self.param)

    @property
    def fans(self) -> tuple[int, int]:
        """(fan_in, fan_out) of the weight."""
        shape = tuple(self.weight.shape)
        return math.prod(shape) // max(shape[self.axis], 1), shape[self.axis]

    def _scale(self) -> torch.Tensor:
        assert self.fold is not None
        shape = [1] * self.weight.dim()
        shape[self.axis] = -1
        return self.fold.reshape(shape)

    def deployed(self) -> torch.Tensor:
        """The weight as deployment quantizes it: with its batch norm folded in."""
        w = self.weight.detach().float()
        return w if self.fold is None else w * self._scale()

    def quantize(self, fmt: NumberFormatLike) -> torch.Tensor:
        """The weight after folding, quantizing at `fmt` and unfolding (its dtype)."""
        w = self.weight
        if self.fold is None:
            return fmt.fake_quantize(w, self.axis)
        scale = self._scale()
        return (fmt.fake_quantize(self.deployed(), self.axis).float() / scale).to(w.dtype)


def find_layers(module: nn.Module, knowledge: QuantKnowledge) -> list[Layer]:
    """Every weight matrix, in `named_modules` order (shared weights once)."""
    seen: set[int] = set()
    layers = []
    init_range = getattr(getattr(module, "config", None), "initializer_range", None)
    for name, sub in module.named_modules():
        for param, axis in _matrices(sub, knowledge):
            weight = getattr(sub, param)
            if id(weight) in seen:
                continue
            seen.add(id(weight))
            path = f"{name}.{param}" if name else param
            own = param == "weight" and knowledge.channel_axis(sub) is not None
            layers.append(Layer(name if own else path, sub, type(sub).__name__, axis,
                                init_range if isinstance(init_range, float) else None,
                                param, path))
    return layers


def _matrices(sub: nn.Module, knowledge: QuantKnowledge) -> Sequence[tuple[str, int]]:
    if knowledge.weight_matrices is not None:
        return knowledge.weight_matrices(sub)
    axis = knowledge.channel_axis(sub)
    return [] if axis is None else [("weight", axis)]


def fold_batch_norms(module: nn.Module, graph: Graph, layers: Sequence[Layer],
                     knowledge: QuantKnowledge) -> list[Layer]:
    """`layers` with each batch norm that reads only a foldable layer's output folded in."""
    consumers = _consumers(graph)
    constant = _param_derived(graph)
    computes = _compute_nodes(graph, layers, consumers, constant)
    modules = dict(module.named_modules())
    out = []
    for layer in layers:
        bn = None
        if layer.module_type in knowledge.foldable_types and not layer.weight.is_meta:
            bn = _batch_norm_after(computes.get(layer.name, []), consumers, modules, knowledge)
        if bn is None:
            out.append(layer)
            continue
        name, norm = bn
        var = _tensor(norm, "running_var").float()
        gamma = getattr(norm, "weight", None)
        scale = gamma.detach().float() if isinstance(gamma, torch.Tensor) else torch.ones_like(var)
        scale = scale / (var + float(getattr(norm, "eps", 1e-5))).sqrt()
        out.append(replace(layer, fold=scale, folded_into=name))
    return out


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    value = getattr(module, name)
    assert isinstance(value, torch.Tensor)
    return value


def _batch_norm_after(ids: Sequence[int], consumers: Mapping[int, list[tuple[Node, str]]],
                      modules: Mapping[str, nn.Module], knowledge: QuantKnowledge
                      ) -> tuple[str, nn.Module] | None:
    if len(ids) != 1:
        return None
    users = consumers[ids[0]]
    if len(users) != 1 or users[0][0].packet not in BATCH_NORM_OPS:
        return None
    name = users[0][0].module
    norm = modules.get(name)
    if (norm is None or type(norm).__name__ not in knowledge.batch_norm_types
            or getattr(norm, "running_var", None) is None or norm.training):
        return None
    return name, norm


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


def channel_sqnr_db(signal: torch.Tensor, noisy: torch.Tensor, axis: int) -> float:
    """``−10·log10(mean_c Σ(w_c − ŵ_c)² / Σw_c²)`` over the output channels c (all-zero
    channels left out); +inf when exact."""
    s = signal.detach().double().movedim(axis, 0).reshape(signal.shape[axis], -1)
    n = noisy.detach().double().movedim(axis, 0).reshape(signal.shape[axis], -1)
    power = s.pow(2).sum(1)
    live = power > 0
    if not bool(live.any()):
        return math.inf
    ratio = float(((s - n).pow(2).sum(1)[live] / power[live]).mean())
    return math.inf if ratio == 0.0 else -10 * math.log10(ratio)


@dataclass(frozen=True)
class DataFree:
    """One layer's data-free result."""

    status: str                              # "scored", "meta" or "random_init"
    reason: str
    stats: WeightStats | None
    weight_sqnr_db: Mapping[str, float]      # of the deployed (BN-folded) weight
    score_db: Mapping[str, float]            # the weights-only prior (module docstring)


def data_free(layer: Layer, risks: Sequence[Risk], knowledge: QuantKnowledge,
              view: LayerView | None = None, weighting: torch.Tensor | None = None
              ) -> DataFree:
    """`weighting`: the scale of the input channel each weight multiplies
    (`fxlens.analyzer.quant.links`); the prior's errors and signal are weighed by it."""
    weight = layer.weight
    if weight.is_meta:
        return DataFree("meta", "weights on the meta device: nothing to quantize", None, {}, {})
    stats = weight_stats(weight, layer.axis)
    reason = knowledge.random_init_reason(stats, *layer.fans, layer.module_type,
                                          layer.initializer_range)
    if reason is not None:
        return DataFree("random_init", f"looks like random initialisation: {reason}", stats,
                        {}, {})
    deployed = layer.deployed()
    quantized = {name: fmt.fake_quantize(deployed, layer.axis)
                 for name, fmt in knowledge.formats.items()}
    sqnr = {name: sqnr_db(deployed, q) for name, q in quantized.items()}
    m = torch.ones(()) if weighting is None else weighting.float()
    channel = {name: channel_sqnr_db(deployed * m, q.float() * m, layer.axis)
               for name, q in quantized.items()}
    penalty = knowledge.risk_penalty_db * len(risks) + _propagation_db(layer, view, knowledge)
    return DataFree("scored", "", stats, sqnr, {k: v - penalty for k, v in channel.items()})


def _propagation_db(layer: Layer, view: LayerView | None, knowledge: QuantKnowledge) -> float:
    if view is None:
        return 0.0
    role = (view.is_first or view.is_last or layer.module_type in knowledge.embedding_types)
    return knowledge.propagation_db * (0.5 - view.position) + knowledge.role_db * role


# --- structure -------------------------------------------------------------------------------


def layer_views(graph: Graph, layers: Sequence[Layer], knowledge: QuantKnowledge
                ) -> dict[str, LayerView]:
    """Where each layer's output goes: the ops it feeds, first/last, residual writes, and its
    position in execution order (0 first … 1 last)."""
    consumers = _consumers(graph)
    constant = _param_derived(graph)
    computes = _compute_nodes(graph, layers, consumers, constant)
    owner = {node_id: name for name, ids in computes.items() for node_id in ids}
    upstream = _reach(graph.nodes, owner, lambda n: [r.node for r in n.input_refs()])
    downstream = _reach(reversed(graph.nodes), owner,
                        lambda n: [c.id for c, _ in consumers[n.id]])
    order = {n.id: i for i, n in enumerate(graph.nodes)}
    starts = sorted({min(order[i] for i in ids) for ids in computes.values() if ids})
    rank = {start: k / max(len(starts) - 1, 1) for k, start in enumerate(starts)}
    views = {}
    for layer in layers:
        ids = computes.get(layer.name, [])
        feeds, residual = _feeds(graph, ids, owner, consumers, constant, knowledge)
        views[layer.name] = LayerView(
            name=layer.name, module_type=layer.module_type, feeds=frozenset(feeds),
            is_first=bool(ids) and not any(upstream[i] for i in ids),
            is_last=bool(ids) and not any(downstream[i] for i in ids),
            feeds_residual=residual,
            position=rank[min(order[i] for i in ids)] if ids else 0.5)
    return views


def _consumers(graph: Graph) -> dict[int, list[tuple[Node, str]]]:
    consumers: dict[int, list[tuple[Node, str]]] = {n.id: [] for n in graph.nodes}
    for node in graph.nodes:
        for arg, value in node.args.items():
            refs = value if isinstance(value, (list, tuple)) else [value]
            for ref in refs:
                if isinstance(ref, TensorRef):
                    consumers[ref.node].append((node, arg))
    return consumers


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
        start = params.get(layer.path or (f"{layer.name}.weight" if layer.name else "weight"))
        stack, ids = ([start] if start is not None else []), []
        while stack:
            for node, _ in consumers[stack.pop()]:
                if node.id in constant:
                    stack.append(node.id)
                elif node.id not in ids:
                    ids.append(node.id)
        found[layer.name] = ids
    return found


def applications(graph: Graph, layers: Sequence[Layer]) -> tuple[dict[str, list[int]], set[int]]:
    """Per layer, the call nodes that apply its weight to an activation; and the nodes
    computed from parameters and buffers alone."""
    constant = _param_derived(graph)
    return _compute_nodes(graph, layers, _consumers(graph), constant), constant


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
