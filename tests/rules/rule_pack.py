"""A third-party rule pack, as an entry point would name it (``tests.rules.rule_pack``): one
cost rule for an op of its own, one fusion rule and one quantization risk rule, declared with
the public decorators. Imported only by tests/rules/test_coded.py."""

from __future__ import annotations

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.analyzer.core.graph import Node
from fxlens.analyzer.fusion.types import FusionGraph, Match, fusion_rule
from fxlens.analyzer.quant.types import LayerView, RiskMatch, risk_rule

PACK_OP = "fxlens_pack.scale"


@cost_rule(PACK_OP)
def scale(call: OpCall) -> Cost:
    """One multiply per output element."""
    return Cost(flops=call.out.numel)


@fusion_rule("FUS901", priority=45)
def never_matches(fg: FusionGraph, node: Node) -> Match | None:
    """A pack's fusion rule that never matches.

    It only shows where a pack's rule slots in between the built-in ones.

    Fix: nothing to fix
    """
    return None


@risk_rule("QNT901")
def named_risky(layer: LayerView) -> RiskMatch | None:
    """A layer whose name says it is risky.

    Packs know their own layers.

    Fix: Rename it.
    """
    return RiskMatch(layer.name) if "risky" in layer.name else None
