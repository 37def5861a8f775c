"""Selective activation recomputation: which modules of a block ``ckpt=…`` recomputes.

Megatron-core's selective recompute names module kinds (``--recompute-modules core_attn
moe_act layernorm mla_up_proj mlp moe shared_experts``); each recomputed module keeps its input
(made outside it) and drops what its own ops saved, then runs its forward again in the
backward. Here a block's forward is cut by module (`ModulePart`: a module's own ops, its
children being parts of their own), and ``ckpt=`` takes '+'-joined kinds or module-path globs:

- ``attn``: every attention module with its projections, a linear-attention mixer's too
  (Qwen3-Next's gated DeltaNet, ``linear_attn``: Megatron-core runs it as the layer's
  self-attention); ``core_attn``: an attention module's own ops (scores, softmax, the fused
  kernel, RoPE), not its projections;
- ``mlp``: the feed-forward (dense or MoE); ``moe``: the MoE layer (router, experts, shared
  experts); ``shared_experts``; ``mla_up_proj``: MLA's ``q_b_proj`` and ``kv_b_proj``;
- ``norm`` (or ``layernorm``): every normalisation; ``act``: activation-function modules;
  ``moe_act``: those inside a MoE layer, where a layer's activation is one part,
  ``<experts>.act_fn``: every op between the experts' up and down projections, written as a
  module or inline (`fxlens.analyzer.plan.workload.expert_activation_parts`);
- ``moe_router``, ``moe_preprocess`` (a MoE module's own ops, outside its router and
  experts) and ``mamba`` name CUDA graph scopes (``graphs=``: `fxlens.analyzer.plan.host`);
- anything else: a glob over the module path inside the block (``self_attn.o_proj``,
  ``*norm``), its children included.

A kind is recognised by the path's segments and the module types (``…Attention``, ``…MoE…``,
``…Norm``, ``…Activation``), as `transformers` names them, its model's prefix left out
(``Qwen3MoeRMSNorm`` is a norm, not a MoE module).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from functools import cache
from typing import TYPE_CHECKING

from fxlens.analyzer.plan.types import remembered
from fxlens.analyzer.plan.workload import ModulePart

if TYPE_CHECKING:
    from fxlens.analyzer.plan.structure import Unit


def _bare(qualified: str) -> str:
    """A module type without its `transformers` model's name, in its path or its class:
    Qwen3-MoE's ``transformers.models.qwen3_moe.modeling_qwen3_moe.qwen3moermsnorm`` is
    ``transformers.models.rmsnorm``, not a MoE module; other types stay as they are."""
    parts = qualified.split(".")
    if "models" not in parts[:-2]:
        return qualified
    at = parts.index("models")
    family, name = parts[at + 1].replace("_", ""), parts[-1]
    if name.startswith(family) and len(name) > len(family):
        name = name[len(family):]
    return ".".join([*parts[:at + 1], name])


ATTENTION = re.compile(r"(self_|cross_|linear_)?(attn|attention)")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe")
MOE_NAMES = ("experts", "block_sparse_moe", "moe")
ACTIVATION_NAMES = ("act", "act_fn", "activation", "activation_fn")

Test = Callable[[Sequence[str], Sequence[str]], bool]


def _attention(segments: Sequence[str], types: Sequence[str]) -> bool:
    return (any(ATTENTION.fullmatch(s) for s in segments)
            or any("attention" in t for t in types))


def _core_attention(segments: Sequence[str], types: Sequence[str]) -> bool:
    return bool(segments) and (ATTENTION.fullmatch(segments[-1]) is not None
                               or "attention" in types[-1])


def _mlp(segments: Sequence[str], types: Sequence[str]) -> bool:
    return any(s in MLP_NAMES for s in segments) or any("mlp" in t for t in types) or \
        _moe(segments, types)


def _moe(segments: Sequence[str], types: Sequence[str]) -> bool:
    return any(s in MOE_NAMES for s in segments) or any("moe" in t for t in types)


def _norm(segments: Sequence[str], types: Sequence[str]) -> bool:
    return any("norm" in s for s in segments) or any("norm" in t for t in types)


def _activation(segments: Sequence[str], types: Sequence[str]) -> bool:
    return bool(segments) and (segments[-1] in ACTIVATION_NAMES or "activation" in types[-1])


KINDS: dict[str, Test] = {
    "attn": _attention,
    "core_attn": _core_attention,
    "mlp": _mlp,
    "moe": _moe,
    "shared_experts": lambda seg, _: any(s.startswith("shared_expert") for s in seg),
    "mla_up_proj": lambda seg, _: any(s in ("q_b_proj", "kv_b_proj") for s in seg),
    "norm": _norm,
    "layernorm": _norm,
    "act": _activation,
    "moe_act": lambda seg, types: _activation(seg, types) and _moe(seg, types),
    # CUDA graph scopes (``graphs=``, Megatron-core's cuda_graph_scope names)
    "moe_router": lambda seg, types: bool(seg) and (
        seg[-1] == "router" or "router" in types[-1]
        or seg[-1] == "gate" and _moe(seg[:-1], types[:-1])),
    "moe_preprocess": lambda seg, types: bool(seg) and seg[-1] != "experts" and (
        "moe" in types[-1] or "sparse" in types[-1]),
    "mamba": lambda seg, types: any("mamba" in t for t in types),
}


def recomputed(block: str, parts: Sequence[ModulePart], patterns: Sequence[str]
               ) -> list[ModulePart]:
    """The parts of `block` (a module path) that `patterns` recompute."""
    chosen = []
    for part in parts:
        inside = part.name[len(block) + 1:].lower() if part.name.startswith(block + ".") else ""
        if any(_matches(pattern, inside, part.types) for pattern in patterns):
            chosen.append(part)
    return chosen


def recomputed_parts(unit: Unit, patterns: Sequence[str]) -> tuple[ModulePart, ...]:
    """`recomputed` for a block unit, remembered on the unit per set of patterns."""
    key = tuple(patterns)
    return remembered(unit.answers, ("parts", key),
                      lambda: tuple(recomputed(unit.name, unit.parts, key)))


@cache    # a search asks it of every block's same parts for every pattern set it tries
def _matches(pattern: str, inside: str, types: tuple[str, ...]) -> bool:
    segments = inside.split(".") if inside else []
    test = KINDS.get(pattern)
    if test is not None:
        return test(segments, tuple(_bare(t) for t in types))
    return bool(inside) and (fnmatchcase(inside, pattern) or fnmatchcase(inside, pattern + ".*"))
