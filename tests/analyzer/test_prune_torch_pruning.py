"""fxlens's coupled groups against Torch-Pruning's dependency groups (DepGraph), the oracle of
issue 33, on the conv nets and the ViT where both apply.

Both are normalised to the same comparable form: the set of *units*, each the set of
``(parameter or buffer name, dim, index)`` entries removed together. fxlens's unit ``u`` of a
group covers, in every member, the entries `entry_index` gives. Torch-Pruning's
`DependencyGraph.get_all_groups` gives, per group, every dependency (a layer and whether its
output or input channels go) with its indices and their root indices; one root index is one
unit, and each (layer, out/in) maps to the parameters its pruning function slices (`_entries`).
Torch-Pruning leaves two couplings to its pruner rather than its groups, and the comparison
applies them as the pruner does:

- grouped convolutions: the pruner removes the same channel of every convolution group
  (`BasePruner._get_channel_groups`: root index ``r`` is unit ``r mod (n / groups)``), which
  fxlens's groups say directly (`fxlens.rules.prune.layers`);
- attention heads: its groups tie Q, K, V and O channel by channel (it reads the products of
  the attention as elementwise ops), and the pruner cuts whole heads when given ``num_heads``
  (ViT in its examples); fxlens's unit is the head (a view to ``(…, H, d)``), so the root
  indices are merged by head: unit ``r // head_dim``. NB: pruning inside a head (fewer dims
  per head) is a coupling fxlens does not offer: the head size is read from the config.

The classifier's outputs are left out of Torch-Pruning's groups (``ignored_layers``, as its
users do); fxlens pins them as model outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch_pruning as tp
from torch import nn

from fxlens.analyzer.prune.groups import entry_index
from tests.analyzer.prune_models import MODELS, planned

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")   # its note on bare parameters

Entry = tuple[str, int, int]          # (parameter or buffer, dim, index)
Unit = frozenset[Entry]


def fxlens_units(build: Callable[[], Any]) -> set[Unit]:
    result = planned(build, None)[2]
    return {frozenset((m.param, m.dim, e) for m in g.members for e in entry_index(m, [u]))
            for g in result.section.groups if g.kind != "block"   # DepGraph has no blocks
            for u in range(g.units)}


def torch_pruning_units(build: Callable[[], Any]) -> set[Unit]:
    model, inputs = build()
    example = inputs if isinstance(inputs, dict) else inputs[0]
    graph = tp.DependencyGraph().build_dependency(model, example_inputs=example)
    classifier = [m for name in ("classifier", "head") if isinstance(
        getattr(model, name, None), nn.Module) for m in getattr(model, name).modules()]
    names = {m: n for n, m in model.named_modules()}
    params = {id(p): n for n, p in model.named_parameters()}
    heads = _heads(model)
    units: set[Unit] = set()
    for group in graph.get_all_groups(ignored_layers=classifier):
        by_root: dict[int, set[Entry]] = {}
        for item in group:
            module, out = item.dep.target.module, graph.is_out_channel_pruning_fn(
                item.dep.handler)
            for index, root in zip(item.idxs, item.root_idxs, strict=True):
                by_root.setdefault(root, set()).update(_entries(
                    module, names, params, out, int(index), item.dep.target.pruning_dim))
        per_unit = _unit_size(group, len(by_root), heads)
        merged: dict[int, set[Entry]] = {}
        for root, entries in by_root.items():
            merged.setdefault(per_unit(root), set()).update(entries)
        units |= {frozenset(e) for e in merged.values()}
    return units


def _unit_size(group: Iterable[Any], channels: int, heads: dict[nn.Module, int]
               ) -> Callable[[int], int]:
    """Root index → unit: channels of one head together, the same channel of every conv group
    together (module docstring)."""
    count = max((heads.get(item.dep.target.module, 1) for item in group
                 if item.dep.handler.__name__ == "prune_out_channels"), default=1)
    if count > 1:
        return lambda r, size=channels // count: r // size
    groups = max((item.dep.target.module.groups for item in group
                  if isinstance(item.dep.target.module, nn.modules.conv._ConvNd)
                  and not _depthwise(item.dep.target.module)), default=1)
    return lambda r, size=channels // groups: r % size


def _heads(model: nn.Module) -> dict[nn.Module, int]:
    """The Q, K and V projections and their attention's head count (Torch-Pruning's
    ``num_heads``)."""
    return {child: module.num_attention_heads for module in model.modules()
            if isinstance(getattr(module, "num_attention_heads", None), int)
            for name, child in module.named_children() if name in QKV}


def _depthwise(conv: nn.modules.conv._ConvNd) -> bool:
    return conv.groups == conv.out_channels and conv.groups > 1


def _entries(module: Any, names: dict[Any, str], params: dict[int, str], out: bool, i: int,
             pruning_dim: int) -> list[Entry]:
    """What Torch-Pruning's pruning function for `module` slices at index `i`."""
    if isinstance(module, nn.Parameter):
        return [(params[id(module)], pruning_dim % module.dim(), i)]
    if module not in names:                # an op of the graph (add, concat…): no tensor
        return []
    name = names[module]
    bias = [(f"{name}.bias", 0, i)] if getattr(module, "bias", None) is not None else []
    if isinstance(module, nn.Linear):
        return [(f"{name}.weight", 0, i), *bias] if out else [(f"{name}.weight", 1, i)]
    if isinstance(module, nn.modules.conv._ConvNd):
        w = module.weight
        if _depthwise(module):
            return [(f"{name}.weight", 0, i), *bias]
        if out:
            return [(f"{name}.weight", 1, i % w.shape[1]) if module.transposed
                    else (f"{name}.weight", 0, i), *bias]
        return [(f"{name}.weight", 0, i) if module.transposed
                else (f"{name}.weight", 1, i % w.shape[1])]
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return [(f"{name}.{p}", 0, i) for p in ("weight", "bias", "running_mean", "running_var")
                if getattr(module, p, None) is not None]
    if isinstance(module, nn.LayerNorm):
        return [(f"{name}.{p}", len(module.normalized_shape) - 1, i) for p in ("weight", "bias")
                if getattr(module, p, None) is not None]
    raise AssertionError(f"no entry map for {type(module).__name__} {name}")


QKV = ("q_proj", "k_proj", "v_proj", "query", "key", "value")
CNNS = ["concat", "convnet", "resnet", "resnet_bottleneck", "convnext", "regnet",
        "mobilenet_v2", "efficientnet"]
FAST = {"concat", "convnet"}        # the others take 1-9 s each on 2 cores: the full suite


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CNNS])
def test_the_groups_are_torch_prunings_dependency_groups(name: str) -> None:
    ours, theirs = fxlens_units(MODELS[name]), torch_pruning_units(MODELS[name])
    assert ours == theirs, (f"{len(ours - theirs)} units only fxlens finds, "
                            f"{len(theirs - ours)} only Torch-Pruning")
    assert len(ours) > 0


@pytest.mark.slow
def test_the_vit_heads_and_channels_are_torch_prunings_groups_merged_by_head() -> None:
    ours, theirs = fxlens_units(MODELS["vit"]), torch_pruning_units(MODELS["vit"])
    assert ours == theirs
    rows = {len({e for e in unit if e[0].endswith("q_proj.weight") and e[1] == 0})
            for unit in ours}
    assert rows == {0, 8}            # heads of 8 rows; the other units hold no query row
