"""Coded rules (fxlens/analyzer/core/coded.py): codes, docstrings as the only text, duplicate
refusal naming both sites, the order fusion rules apply in; and rule packs, which extend a
copy of the registry and never the default one (fxlens/rules/__init__.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from fxlens.analyzer.core.coded import RuleDoc, coded_rule
from fxlens.analyzer.core.costs import Cost, CostRegistry, cost_rule, declare_coded
from fxlens.analyzer.core.errors import DuplicateRuleError, RuleError
from fxlens.analyzer.fusion.types import fusion_rule
from fxlens.analyzer.quant.types import LayerView, risk_rule
from fxlens.rules import build_rules, load_rules
from fxlens.rules.fusion import FUSION_RULES, fusion_rules
from fxlens.rules.quant import knowledge

PACK = "tests.rules.rule_pack"


def _doc(layer: Any) -> None:
    """Title.

    Why.

    Fix: how.
    """


# (decorator that declares a second rule under a taken key, where the first one lives)
DUPLICATES: list[tuple[str, Callable[[Callable[..., Any]], Any], str]] = [
    ("FUS001 registered twice", fusion_rule("FUS001", priority=1),
     r"rules/fusion\.py:\d+ \(elementwise_chain\)"),
    ("FUS004 registered twice", fusion_rule("FUS004", priority=99),
     r"rules/fusion\.py:\d+ \(hand_attention\)"),
    ("QNT001 registered twice", risk_rule("QNT001"), r"rules/quant\.py:\d+ \(feeds_softmax\)"),
    ("QNT006 registered twice", risk_rule("QNT006"), r"rules/quant\.py:\d+ \(writes_residual\)"),
    ("FUS002 registered twice", risk_rule("FUS002"), r"rules/fusion\.py:\d+ \(gemm_epilogue\)"),
    ("duplicate cost rule for aten.mm", cost_rule("aten.mm"), r"rules/matmul\.py:\d+ \(mm\)"),
]


@pytest.mark.parametrize(("what", "declare", "first"), DUPLICATES)
def test_duplicate_code_is_refused_naming_both_sites(
        what: str, declare: Callable[[Callable[..., Any]], Any], first: str) -> None:
    load_rules()
    with pytest.raises(DuplicateRuleError, match=rf"{what}: .*{first} and .*test_coded\.py:\d+"):
        declare(_doc)


def test_a_refused_rule_leaves_no_trace() -> None:
    before = load_rules().coded.get("FUS001")
    with pytest.raises(DuplicateRuleError):
        fusion_rule("FUS001", priority=1)(_doc)
    assert build_rules().coded.get("FUS001") == before


@pytest.mark.parametrize(("doc", "problem"), [
    (None, "needs a docstring"),
    ("Title only.", "needs a docstring"),
    ("Title.\n\nWhy, and no fix line.", "needs a docstring"),
    ("Title.\n\nFix (conv): only a variant.", "needs a docstring"),
])
def test_a_rule_without_title_or_fix_is_refused(doc: str | None, problem: str) -> None:
    def handler(layer: LayerView) -> None:
        return None

    handler.__doc__ = doc
    with pytest.raises(RuleError, match=problem):
        declare_coded("risk", "QNT951")(handler)
    assert build_rules().coded.get("QNT951") is None


@pytest.mark.parametrize("code", ["fus010", "FUS", "F1", "FUS-010"])
def test_malformed_codes_are_refused(code: str) -> None:
    with pytest.raises(RuleError, match="letters then digits"):
        CostRegistry().add_coded(coded_rule("fusion", code, _doc, __name__))


@pytest.mark.parametrize(("doc", "title", "why", "fixes"), [
    ("""What.\n\n    Why it matters,\n    over two lines.\n\n    Fix: do this\n    and that.\n""",
     "What.", "Why it matters, over two lines.", {"": "do this and that."}),
    ("What.\n\nWhy.\n\nMore why.\n\nFix: a\nFix (conv): b\nc",
     "What.", "Why. More why.", {"": "a", "conv": "b c"}),
    ("What,\non two lines.\n\nFix: x", "What, on two lines.", "", {"": "x"}),
])
def test_docstrings_parse(doc: str, title: str, why: str, fixes: dict[str, str]) -> None:
    parsed = RuleDoc.parse(doc)
    assert (parsed.title, parsed.why, dict(parsed.fixes)) == (title, why, fixes)


def test_a_missing_fix_variant_names_the_ones_there_are() -> None:
    with pytest.raises(RuleError, match="Fix \\(epilogue\\).*has: ''"):
        RuleDoc.parse("T.\n\nFix: x").fix("epilogue")


RULES = list(load_rules().coded)


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_every_registered_code_has_a_title_why_and_fix(rule: Any) -> None:
    prefix = {"fusion": "FUS", "risk": "QNT"}[rule.family]
    assert re.fullmatch(rf"{prefix}\d{{3}}", rule.code)
    assert rule.doc.title and rule.doc.why and rule.doc.fix()
    assert all(rule.doc.fixes.values())
    assert rule.doc.title in rule.doc.text and "Fix: " in rule.doc.text


def test_every_code_is_registered() -> None:
    codes = [r.code for r in load_rules().coded]
    assert codes == [f"FUS00{i}" for i in range(1, 10)] + [f"QNT00{i}" for i in range(1, 7)]


def test_fusion_rules_apply_most_specific_first_by_priority() -> None:
    assert [r.code for r in FUSION_RULES] == [
        "FUS009", "FUS004", "FUS006", "FUS003", "FUS002", "FUS008", "FUS001", "FUS005",
        "FUS007"]
    assert fusion_rules(load_rules()) == FUSION_RULES
    assert [r.priority for r in FUSION_RULES] == sorted(r.priority for r in FUSION_RULES)


# --- rule packs --------------------------------------------------------------------------------

def test_a_rule_added_to_a_copy_leaves_the_default_registry_alone() -> None:
    default = load_rules()
    extended = default.copy()
    extended.register(["fxlens_copy.op"], lambda call: Cost())
    extended.add_coded(coded_rule("fusion", "FUS950", _doc, __name__, priority=1))
    assert extended.knows("fxlens_copy.op") and extended.coded.get("FUS950") is not None
    assert fusion_rules(extended)[0].code == "FUS950"
    assert not default.knows("fxlens_copy.op") and default.coded.get("FUS950") is None
    assert not load_rules().knows("fxlens_copy.op") and len(load_rules().coded) == 15


def test_the_shared_registry_refuses_registrations() -> None:
    with pytest.raises(RuleError, match="frozen: register into its copy"):
        load_rules().register(["fxlens_frozen.op"], lambda call: Cost())


def test_a_pack_declared_with_the_public_decorators_is_in_its_registry_only() -> None:
    from tests.rules import rule_pack

    with_pack = build_rules([PACK])
    assert with_pack.find(rule_pack.PACK_OP) is not None
    assert [r.code for r in fusion_rules(with_pack)] == [            # FUS901: priority 45
        "FUS009", "FUS004", "FUS006", "FUS003", "FUS002", "FUS901", "FUS008", "FUS001", "FUS005",
        "FUS007"]
    assert with_pack.coded.get("QNT901") is not None
    for registry in (load_rules(), build_rules()):
        assert registry.find(rule_pack.PACK_OP) is None
        assert registry.coded.get("FUS901") is None and registry.coded.get("QNT901") is None
    assert len(build_rules([PACK]).keys) == len(load_rules().keys) + 1


def test_a_packs_risk_rule_reaches_the_quant_engine_through_its_registry() -> None:
    view = LayerView("risky_proj", "Linear")
    with_pack = knowledge(registry=build_rules([PACK])).risks(view)
    assert [(r.code, r.message, r.fix, r.detail) for r in with_pack] == [
        ("QNT901", "A layer whose name says it is risky.", "Packs know their own layers. "
         "Rename it.", "risky_proj")]
    assert knowledge(registry=load_rules()).risks(view) == knowledge().risks(view) == ()


def test_cost_rules_declared_by_a_helper_belong_to_the_declaring_module() -> None:
    """pointwise's table registers closures from a helper: still the pointwise family."""
    found = load_rules().find("aten.add")
    assert not isinstance(found, str) and found is not None
    assert (found.module, found.family) == ("fxlens.rules.pointwise", "pointwise")


def test_cost_rule_sites_come_from_the_shared_helper() -> None:
    found = load_rules().find("aten.mm")
    assert not isinstance(found, str) and found is not None
    assert re.search(r"rules/matmul\.py:\d+ \(mm\)$", found.site)
