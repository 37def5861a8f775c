"""Input-channel scales for the weights-only prior: how large each input channel of a layer is,
read from the weights of the layer that feeds it, so that a quantization error is weighed by
what it multiplies.

Why: a linear or conv layer B fed by A through a positively homogeneous, channel-wise link
(ReLU, leaky ReLU, max/avg pooling, reshapes; `QuantKnowledge.homogeneous_ops`) can have A's
output channel c scaled by s and B's input channel c by 1/s without changing the function. The
real damage of quantizing B does change: B's column c, now small, is rounded on the same grid
as before, and the error multiplies an input s× larger (measured on a trained 8-layer MLP,
×50 on one channel: B's output SQNR at int8 per channel 64 → 40 dB, A's unchanged at 51 dB).
A weight SQNR blind to the input scale calls B unchanged. So B's error, and its signal, are
weighed per input channel by that channel's scale: the feeding layer's row norm (per output
channel, BatchNorm folded, itself weighted by its own input scales, so a rescaling further up
cancels), ``r_c = ‖A_c ⊙ m_A‖``.

Not cross-layer equalisation (Nagel et al. 2019): scoring layers as equalised predicts the
damage of a deployment that equalises first, and is blind to rescaling by construction, while
fxlens's formats, its calibration and the measured damage quantize the weights as they are
(on the example above, equalised scores moved by < 0.2 dB for both layers; the measured
damage moved by 24 dB for B at int8 per channel and 28 dB for A at int8 per tensor).

Where the link is anything else (GELU, SiLU, a norm, an unfolded BatchNorm, a residual add,
two producers, a reshape that moves the channel), nothing is weighted, and `Link.reason` says
through what. NB: the scale ignores the feeding layer's bias and the model input's own
per-channel scale (unknown without data: all 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef
from fxlens.analyzer.quant.types import QuantKnowledge
from fxlens.analyzer.quant.weights import BATCH_NORM_OPS, Layer, applications


@dataclass(frozen=True)
class Link:
    """How a layer's input channels are weighed: by `source`'s output channel scales through
    `through`, or not at all (`weighting` None) and why (`reason`, "" for a first layer)."""

    source: str = ""
    through: tuple[str, ...] = ()
    weighting: torch.Tensor | None = field(default=None, compare=False)  # like the weight
    reason: str = ""
    nodes: tuple[int, ...] = ()      # the source's compute node, then the link's nodes


def input_links(graph: Graph, layers: Sequence[Layer], knowledge: QuantKnowledge
                ) -> dict[str, Link]:
    """Per layer (by name), its `Link`; layers taken in execution order, so a feeding layer's
    own input weighting is known before it feeds."""
    computes, constant = applications(graph, layers)
    owner = {i: name for name, ids in computes.items() for i in ids}
    by_name = {layer.name: layer for layer in layers}
    folded = {layer.folded_into: layer.name for layer in layers if layer.folded_into}
    order = sorted(layers, key=lambda lay: min(computes.get(lay.name) or [len(graph.nodes)]))
    links: dict[str, Link] = {}
    scales: dict[str, torch.Tensor] = {}      # output channel scales of the layers seen
    for layer in order:
        ids = computes.get(layer.name, [])
        link = Link()
        if _in_axis(layer, knowledge) is not None and len(ids) == 1:
            link = _link(graph, graph.nodes[ids[0]], owner, folded, constant, knowledge)
        if link.source:
            link = _weigh(graph, layer, link, by_name[link.source], scales.get(link.source),
                          knowledge)
        links[layer.name] = link
        if _in_axis(layer, knowledge) is not None and not layer.weight.is_meta:
            scales[layer.name] = _output_scales(layer, link.weighting)
    return links


def weighting_of(layer: Layer, scale: torch.Tensor, knowledge: QuantKnowledge
                 ) -> torch.Tensor | None:
    """A weight-shaped tensor holding, at each weight, the scale of the input channel it
    multiplies (conv groups mapped); None when `scale` does not match the layer's inputs."""
    axis = _in_axis(layer, knowledge)
    if axis is None:
        return None
    w = layer.weight
    groups = int(getattr(layer.module, "groups", 1)) if axis == 1 else 1
    width = w.shape[axis]
    if scale.numel() != width * groups:
        return None
    shape = [1] * w.dim()
    if groups == 1:
        shape[axis] = width
        return scale.reshape(shape).expand_as(w)
    out = w.shape[0]
    index = (torch.arange(out) // (out // groups))[:, None] * width + torch.arange(width)
    shape[:2] = [out, width]                                  # (C_out, C_in / groups, 1 …)
    return scale[index].reshape(shape).expand_as(w)


def _in_axis(layer: Layer, knowledge: QuantKnowledge) -> int | None:
    if layer.param != "weight" or knowledge.input_axis is None:
        return None
    return knowledge.input_axis(layer.module)


def _output_scales(layer: Layer, weighting: torch.Tensor | None) -> torch.Tensor:
    """‖A_c ⊙ m‖ per output channel c of the deployed (BatchNorm-folded) weight."""
    w = layer.deployed().double()
    if weighting is not None:
        w = w * weighting.double()
    return w.movedim(layer.axis, 0).reshape(w.shape[layer.axis], -1).norm(dim=1)


def _link(graph: Graph, node: Node, owner: Mapping[int, str], folded: Mapping[str, str],
          constant: set[int], knowledge: QuantKnowledge) -> Link:
    """Walk back from a layer's input through link ops to the layer that feeds it."""
    through: list[Node] = []
    ref = _activation(node, constant)
    while ref is not None:
        current = graph.nodes[ref.node]
        if current.id in owner:
            through.reverse()
            return Link(owner[current.id], tuple(n.packet for n in through),
                        nodes=(current.id, *(n.id for n in through)))
        if current.kind is not NodeKind.CALL:
            return Link()                        # the model's input: nothing feeds it
        packet = current.packet
        passes = (packet in knowledge.homogeneous_ops or packet in knowledge.layout_ops
                  or (packet in BATCH_NORM_OPS and current.module in folded))
        if not passes:
            return Link(reason=f"fed through {packet}")
        through.append(current)
        ref = _activation(current, constant)
    return Link(reason="fed by more than one tensor")


def _activation(node: Node, constant: set[int]) -> TensorRef | None:
    """The one tensor `node` reads that is not computed from parameters alone (None when
    there are several)."""
    refs = [r for r in node.input_refs() if r.node not in constant]
    return refs[0] if len(refs) == 1 else None


def _weigh(graph: Graph, layer: Layer, link: Link, source: Layer,
           scale: torch.Tensor | None, knowledge: QuantKnowledge) -> Link:
    """`link` with its weighting, or with why none."""
    if scale is None:
        kind = ("has no output channels to scale" if _in_axis(source, knowledge) is None
                else "is on the meta device")
        return Link(reason=f"fed by {source.name}, which {kind}")
    repeat = _channel_path(graph, link.nodes, scale.numel(), source.weight.dim() > 2,
                           layer.weight.dim() > 2)
    weighting = None if repeat is None else weighting_of(
        layer, scale.repeat_interleave(repeat).float(), knowledge)
    if weighting is None:
        return Link(reason=f"fed by {source.name} through a reshape that moves its channels")
    return Link(link.source, link.through, weighting)


def _channel_path(graph: Graph, nodes: Sequence[int], channels: int, first_in: bool,
                  first_out: bool) -> int | None:
    """How many features each source channel becomes at the reading layer's channel axis
    (a flatten of ``N, C, H, W`` from dim 1 makes each channel H·W features, channel-major),
    or None when a node moves the channels elsewhere. `first_*`: channels on dim 1 (convs)
    rather than on the last dim (linear layers)."""
    shapes = [graph.nodes[i].outputs[0] for i in nodes]
    if any(s is None for s in shapes):
        return None
    dims = [tuple(s.shape) for s in shapes if s is not None]
    if not dims[0]:
        return None
    pos, width = (1 if first_in else len(dims[0]) - 1), channels
    for before, after in zip(dims, dims[1:], strict=False):
        if len(after) == len(before) and pos < len(after) and after[pos] == width:
            continue
        if pos == len(before) - 1 and after and after[-1] == width:
            pos = len(after) - 1                                   # (B, T, C) → (B·T, C)
        elif pos == 1 and len(after) == 2 and after[1] == width * math.prod(before[2:]):
            width, pos = after[1], 1                               # flatten from dim 1
        else:
            return None
    last = dims[-1]
    reads = 1 if first_out else len(last) - 1
    if pos != reads or width % channels:
        return None
    return width // channels

