"""The engine: statuses, byte defaults, roll-ups — on synthetic graphs with a private registry."""

from __future__ import annotations

from typing import Any

import pytest

from fxlens.analyzer.core.costs import Cost, CostRegistry, OpCall
from fxlens.analyzer.core.errors import RuleError
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, ParamInfo, TensorRef, ancestors
from fxlens.analyzer.cost.engine import analyze
from tests.helpers import T


def graph() -> Graph:
    """x (4, 8) → mm with W (8, 16) in "a.b" → relu in "a" → sum at the root."""
    nodes = (
        Node(0, NodeKind.INPUT, "x", {}, (T(4, 8),)),
        Node(1, NodeKind.PARAM, "a.b.weight", {}, (T(8, 16),)),
        Node(2, NodeKind.CALL, "aten.mm.default", {"self": TensorRef(0), "mat2": TensorRef(1)},
             (T(4, 16),), module="a.b", module_type="Linear"),
        Node(3, NodeKind.CALL, "aten.relu.default", {"self": TensorRef(2)}, (T(4, 16),),
             module="a", module_type="Block"),
        Node(4, NodeKind.CALL, "aten.view.default", {"self": TensorRef(3)}, (T(64),),
             module="a"),
        Node(5, NodeKind.CALL, "aten.sum.default", {"self": TensorRef(4)}, (T(),)),
    )
    params = (ParamInfo("a.b.weight", T(8, 16)),)
    return Graph(nodes, "synthetic", params, {"": "Top", "a": "Block", "a.b": "Linear"})


def registry(mm=lambda c: Cost(flops=2 * 4 * 8 * 16)) -> CostRegistry:  # type: ignore[no-untyped-def]
    reg = CostRegistry()
    reg.register(["aten.mm"], mm)
    reg.register(["aten.relu"], lambda c: Cost(flops=c.out.numel, bytes_read=7))
    reg.declare_free(["aten.view"], "view")
    return reg


def test_statuses_and_coverage() -> None:
    report = analyze(graph(), registry())
    statuses = {n.target: n.status for n in report.nodes}
    assert statuses == {"aten.mm.default": "costed", "aten.relu.default": "costed",
                        "aten.view.default": "free", "aten.sum.default": "unsupported"}
    assert report.coverage.unsupported == {"aten.sum.default": 1}
    assert report.coverage.ratio == pytest.approx(3 / 4)
    assert not report.coverage.complete


def test_default_bytes_read_inputs_once_and_write_outputs() -> None:
    mm = analyze(graph(), registry()).nodes[0]
    assert mm.bytes_read == (4 * 8 + 8 * 16) * 4
    assert mm.bytes_written == 4 * 16 * 4
    relu = analyze(graph(), registry()).nodes[1]
    assert relu.bytes_read == 7  # a rule's explicit figure wins


def test_roll_up_reaches_every_ancestor() -> None:
    report = analyze(graph(), registry())
    mm_flops, relu_flops = 2 * 4 * 8 * 16, 4 * 16
    assert report.module("a.b").flops == mm_flops
    assert report.module("a").flops == mm_flops + relu_flops
    assert report.module("").flops == report.totals.flops == mm_flops + relu_flops
    assert report.module("a").params == report.module("").params == 8 * 16
    assert report.module("a.b").depth == 2
    assert report.totals.macs == report.totals.flops // 2


def test_failing_rule_is_recorded_or_raised_when_strict() -> None:
    def broken(call: OpCall) -> Cost:
        raise ValueError("bad shape")

    report = analyze(graph(), registry(mm=broken))
    assert report.nodes[0].status == "failed"
    assert "bad shape" in report.coverage.failed["aten.mm.default"]
    with pytest.raises(RuleError, match="aten.mm.default.*module a.b"):
        analyze(graph(), registry(mm=broken), strict=True)


def test_duplicate_registration_names_both_sites() -> None:
    reg = registry()
    with pytest.raises(RuleError, match="duplicate cost rule for aten.mm.*test_engine.py"):
        reg.register(["aten.mm"], lambda c: Cost())


def test_report_round_trips_through_json() -> None:
    import json

    from fxlens.analyzer.core.report import report_from_dict

    report = analyze(graph(), registry())
    again = report_from_dict(json.loads(report.to_json()))
    assert again.to_json() == report.to_json()


def test_ancestors() -> None:
    assert ancestors("") == [""]
    assert ancestors("a.b") == ["", "a", "a.b"]


def test_report_dict_is_dataclasses_asdict() -> None:
    """`Report.to_dict`'s own converter gives what `dataclasses.asdict` gives (types included:
    tuples stay tuples, named tuples and dicts are copies), on a report with every kind of
    field, a frozen dataclass with a dict field among them, less the `optional` fields that
    are None (a node's recurrence), as the codec leaves them out."""
    import dataclasses
    from collections import namedtuple

    from fxlens.analyzer.core.report import _as_dict

    report = dataclasses.replace(analyze(graph(), registry()), meta={"k": [1, (2, 3)]})
    bare = dataclasses.replace(report, sections={})
    converted, expected = _as_dict(bare), dataclasses.asdict(bare)
    for node in expected["nodes"]:
        assert node.pop("recurrence") is None
    assert converted == expected
    assert repr(converted) == repr(expected)
    assert converted["meta"] is not bare.meta and converted["meta"]["k"] is not bare.meta["k"]
    Pair = namedtuple("Pair", "spec sizes")

    @dataclasses.dataclass(frozen=True)
    class Holder:
        pair: Any
        table: dict[str, Any]

    holder = Holder(Pair(T(2, 3), [1, 2]), {"a": (T(4),)})
    assert repr(_as_dict(holder)) == repr(dataclasses.asdict(holder))
