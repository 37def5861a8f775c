"""`compare`, gates and the diff renderers on synthetic reports: no tracing, milliseconds each.

Reports are built as JSON dicts (what a baseline on disk is) and read with `report_from_dict`,
so these tests also pin what `compare` needs from the public report format.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fxlens.analyzer.core.codec import encode
from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.report import Report, load_report, report_from_dict
from fxlens.analyzer.core.sections import (
    DeviceFigures,
    Finding,
    Hotspots,
    Memory,
    ModuleTiming,
    Roofline,
    RooflineSettings,
    RooflineTotals,
    Throughput,
)
from fxlens.analyzer.review.diff import Delta, ModuleStatus, ReportDiff, compare, diff_to_json
from fxlens.analyzer.review.gates import Gate, check_gates, parse_gate, parse_gates
from fxlens.reports.diff_html import render_diff_html
from fxlens.reports.diff_markdown import render_diff_markdown
from fxlens.reports.diff_terminal import render_diff_terminal

LINEAR = "torch.nn.modules.linear.Linear"
RELU = "torch.nn.modules.activation.ReLU"
EVIL = "<script>alert(1)</script>|x"

# (path, type, flops, params, output shape); the root is rolled up from these.
Leaf = tuple[str, str, int, int, tuple[int, ...]]
BASE: list[Leaf] = [("fc1", LINEAR, 1000, 100, (4, 8)), ("act", RELU, 32, 0, (4, 8)),
                    ("fc2", LINEAR, 2000, 200, (4, 2))]


def report_dict(leaves: Sequence[Leaf], first_id: int = 1, **sections: Any) -> dict[str, Any]:
    """A schema-1 report: one node per leaf module (16 bytes written unless it is costless),
    the root rolled up."""
    nodes, modules = [], []
    for i, (path, kind, flops, params, shape) in enumerate(leaves):
        written = 16 if flops or params else 0
        nodes.append({"id": first_id + i, "target": "aten.linear.default" if params else
                      "aten.relu.default", "status": "costed", "module": path,
                      "module_type": kind, "source": "net.py:1", "inputs": [],
                      "outputs": [{"shape": list(shape), "dtype": "float32"}], "flops": flops,
                      "bytes_read": 4 * params, "bytes_written": written, "phase": "forward"})
        modules.append(_module(path, kind, 1, flops, params, 4 * params, written, 1))
    flops, params = sum(x[2] for x in leaves), sum(x[3] for x in leaves)
    written = sum(n["bytes_written"] for n in nodes)
    root = _module("", "net.Net", 0, flops, params, 4 * params, written, len(leaves))
    return {
        "schema_version": 1,
        "model": {"name": "net", "source": "net.py", "capture_method": "export",
                  "capture_notes": [], "params": params, "param_bytes": 4 * params,
                  "trainable_params": params, "buffers": 0, "buffer_bytes": 0},
        "totals": {"flops": flops, "macs": flops // 2, "bytes_read": 4 * params,
                   "bytes_written": written},
        "nodes": nodes, "modules": [root, *modules],
        "coverage": {"costed": len(nodes), "free": 0, "unsupported": {}, "failed": {},
                     "ratio": 1.0},
        "meta": {"fxlens_version": "0.1.0", "torch_version": "2.13.0"},
        **sections,
    }


def _module(path: str, kind: str, depth: int, flops: int, params: int, read: int, written: int,
            nodes: int) -> dict[str, Any]:
    return {"path": path, "type": kind, "depth": depth, "flops": flops, "macs": flops // 2,
            "bytes_read": read, "bytes_written": written, "params": params,
            "param_bytes": 4 * params, "nodes": nodes}


def memory_json(peak: int, allocated: dict[str, int], live: dict[str, int] | None = None
                ) -> dict[str, Any]:
    """A ``memory`` section as written on disk, with the figures diff reads."""
    return encode(Memory(lifetimes="graph", param_bytes=0, buffer_bytes=0, input_bytes=0,
                         peak_activation_bytes=peak, peak_node=None, peak_module="",
                         timeline=(), live_at_peak=(), live_at_peak_count=0,
                         allocated_by_module=allocated, live_at_peak_by_module=live or {}))


def roofline_json(module_s: dict[str, float]) -> dict[str, Any]:
    """A ``roofline`` section as written on disk, with the times diff reads."""
    device = DeviceFigures(name="toy", memory_bytes=1, source="test", peak_flops={"fp32": 1.0},
                           bandwidth_bytes_per_s=1.0, kind="gpu", compute_efficiency=1.0,
                           bandwidth_efficiency=1.0, launch_s=0.0, calibrated=False)
    return encode(Roofline(
        device=device, settings=RooflineSettings(tf32=False, dtype_rule=""), nodes=(),
        modules=tuple(ModuleTiming(path, s, 0.0) for path, s in module_s.items()),
        totals=RooflineTotals(time_s=module_s[""], compute_bound_s=0.0, memory_bound_s=0.0,
                              launch_bound_s=0.0, launch_s=0.0, by_phase={},
                              uncosted_nodes=0),
        throughput=Throughput(1, 0, 0.0), mfu=0.0, mfu_dtype="fp32",
        hotspots=Hotspots((), ())))


def finding_json(code: str, modules: list[str], message: str) -> dict[str, Any]:
    return encode(Finding(code=code, nodes=(), modules=tuple(modules), saved_bytes=0,
                          saved_s=None, message=message, fix=""))


def report(leaves: Sequence[Leaf], **kwargs: Any) -> Report:
    return report_from_dict(report_dict(leaves, **kwargs))


def by_path(diff: ReportDiff) -> dict[str, Any]:
    return {m.path: m for m in diff.modules}


# --- compare ----------------------------------------------------------------------------------

def test_identical_reports_have_no_deltas() -> None:
    diff = compare(report(BASE), report(BASE))
    assert diff.modules == () and diff.unchanged == 3 and diff.shapes == ()
    assert all(d.change == 0 for d in diff.totals.values())


def test_added_and_changed_modules_sorted_by_impact_with_totals() -> None:
    new = [("fc1", LINEAR, 1000, 100, (4, 8)), ("act", RELU, 64, 0, (4, 8)),
           ("fc2", LINEAR, 3000, 300, (4, 2)), ("extra", LINEAR, 500, 50, (4, 2))]
    diff = compare(report(BASE), report(new))
    assert [(m.path, m.status) for m in diff.modules] == [
        ("fc2", ModuleStatus.CHANGED), ("extra", ModuleStatus.ADDED),
        ("act", ModuleStatus.CHANGED)]
    assert by_path(diff)["fc2"].metrics["flops"] == Delta(2000, 3000)
    assert by_path(diff)["extra"].metrics["params"] == Delta(None, 50)
    assert diff.totals["flops"] == Delta(3032, 4564)
    assert diff.totals["params"].change == 150
    assert diff.unchanged == 1


def test_removed_module() -> None:
    diff = compare(report(BASE), report(BASE[:2]))
    (removed,) = diff.with_status(ModuleStatus.REMOVED)
    assert removed.path == "fc2" and removed.metrics["flops"].change == -2000


def test_renamed_module_same_type_and_figures() -> None:
    renamed = [BASE[0], BASE[1], ("head", LINEAR, 2000, 200, (4, 2))]
    diff = compare(report(BASE), report(renamed))
    (module,) = diff.modules
    assert module.status is ModuleStatus.RENAMED
    assert (module.old_path, module.path) == ("fc2", "head")
    assert all(d.change == 0 for d in module.metrics.values())
    assert diff.shapes == ()


def test_renamed_with_other_figures_is_removed_and_added() -> None:
    changed = [BASE[0], BASE[1], ("head", LINEAR, 2400, 240, (4, 2))]
    statuses = {m.path: m.status for m in compare(report(BASE), report(changed)).modules}
    assert statuses == {"head": ModuleStatus.ADDED, "fc2": ModuleStatus.REMOVED}


def test_costless_modules_are_never_paired_as_renames() -> None:
    old = [*BASE, ("drop", "torch.nn.Dropout", 0, 0, (4, 2))]
    new = [*BASE, ("dropout", "torch.nn.Dropout", 0, 0, (4, 2))]
    statuses = {m.path: m.status for m in compare(report(old), report(new)).modules}
    assert statuses == {"dropout": ModuleStatus.ADDED, "drop": ModuleStatus.REMOVED}


def test_matching_ignores_node_ids() -> None:
    """A baseline from another torch version numbers its nodes differently."""
    diff = compare(report(BASE, first_id=1), report(BASE, first_id=57))
    assert diff.modules == () and diff.shapes == ()


def test_changed_output_shapes_by_module_and_op() -> None:
    wider = [("fc1", LINEAR, 1000, 100, (4, 16)), BASE[1], BASE[2]]
    (change,) = compare(report(BASE), report(wider)).shapes
    assert (change.module, change.op, change.index) == ("fc1", "aten.linear.default", 0)
    assert (change.old, change.new) == (((4, 8),), ((4, 16),))


def test_notes_say_when_the_runs_differ() -> None:
    old = report_dict(BASE)
    old["meta"]["torch_version"] = "2.12.1"
    diff = compare(report_from_dict(old), report(BASE))
    assert diff.notes == ("torch version differs: 2.12.1 (old) vs 2.13.0 (new)",)


def test_memory_sections_give_activation_and_peak_deltas() -> None:
    def memory(fc1: int, peak: int) -> dict[str, Any]:
        return memory_json(peak, {"fc1": fc1, "act": 128}, {"fc1": fc1})

    diff = compare(report(BASE, memory=memory(128, 256)), report(BASE, memory=memory(512, 640)))
    assert diff.totals["peak_memory"] == Delta(256, 640)
    (fc1,) = diff.modules
    assert fc1.metrics["activation_bytes"] == Delta(128, 512)
    assert fc1.metrics["live_at_peak_bytes"] == Delta(128, 512)


def test_a_section_only_one_side_has_is_not_a_module_change() -> None:
    memory = memory_json(1, {"fc1": 128})
    diff = compare(report(BASE), report(BASE, memory=memory))
    assert diff.modules == ()
    assert diff.totals["peak_memory"] == Delta(None, 1)
    assert diff.totals["step_peak"] == Delta(None, None)


def test_roofline_time_when_present() -> None:
    def roofline(fc2_s: float) -> dict[str, Any]:
        return roofline_json({"": 1e-3 + fc2_s, "fc2": fc2_s})

    diff = compare(report(BASE, roofline=roofline(1e-3)), report(BASE, roofline=roofline(3e-3)))
    assert diff.totals["time"].change == pytest.approx(2e-3)
    assert by_path(diff)["fc2"].metrics["time"].change == pytest.approx(2e-3)


def test_new_and_resolved_findings_follow_renames() -> None:
    old = report(BASE, findings=[finding_json("FUS001", ["fc2"], "epilogue"),
                                 finding_json("FUS003", ["fc1"], "gone")])
    renamed = [BASE[0], BASE[1], ("head", LINEAR, 2000, 200, (4, 2))]
    new = report(renamed, findings=[finding_json("FUS001", ["head"], "x"),
                                    finding_json("QNT002", ["act"], "new")])
    diff = compare(old, new)
    assert [(f.code, f.modules) for f in diff.new_findings] == [("QNT002", ("act",))]
    assert [(f.code, f.modules) for f in diff.resolved_findings] == [("FUS003", ("fc1",))]
    assert compare(report(BASE), report(BASE)).new_findings == ()


# --- gates ------------------------------------------------------------------------------------

def test_parse_gates() -> None:
    assert parse_gates("flops:+2%, peak_memory:+5%,params:+0") == (
        Gate("flops", 2.0, True, "flops:+2%"), Gate("peak_memory", 5.0, True, "peak_memory:+5%"),
        Gate("params", 0.0, False, "params:+0"))
    assert parse_gate("param_bytes:+1MiB").threshold == 2**20
    assert parse_gate("flops:+1.5G").threshold == 1.5e9
    assert parse_gate("time:+2ms").threshold == pytest.approx(2e-3)


@pytest.mark.parametrize("spec, message", [
    ("flop:+2%", "unknown metric 'flop'"), ("flops=2%", "cannot read"),
    ("flops:+2parsecs", "unknown unit"), (" , ", "no gate given"),
])
def test_malformed_gates_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_gates(spec)


def _flops_diff(old: int, new: int) -> ReportDiff:
    return compare(report([("fc1", LINEAR, old, 100, (4, 8))]),
                   report([("fc1", LINEAR, new, 100, (4, 8))]))


@pytest.mark.parametrize("spec, old, new, tripped", [
    ("flops:+2%", 1000, 1020, False),     # exactly at the threshold passes
    ("flops:+2%", 1000, 1021, True),      # relative, just over
    ("flops:+2%", 1000, 500, False),      # a decrease never trips a + gate
    ("flops:+0", 1000, 1000, False),      # absolute, unchanged
    ("flops:+0", 1000, 1001, True),       # absolute, any growth
    ("flops:+100", 1000, 1100, False),
    ("flops:+100", 1000, 1101, True),
    ("flops:+1k", 1000, 2001, True),      # with an SI suffix
    ("flops:+5%", 0, 1, True),            # from zero, any growth is over any percentage
    ("flops:-10%", 1000, 950, True),      # a negative gate demands a decrease
    ("flops:-10%", 1000, 900, False),
])
def test_gates_trip(spec: str, old: int, new: int, tripped: bool) -> None:
    (result,) = check_gates(_flops_diff(old, new), parse_gates(spec))
    assert result.tripped is tripped
    assert result.delta == Delta(old, new)


def test_a_gate_on_a_missing_metric_is_an_error() -> None:
    with pytest.raises(ReportError, match="no step_peak figure.*--train"):
        check_gates(_flops_diff(1, 1), parse_gates("step_peak:+5%"))


# --- loading a baseline -----------------------------------------------------------------------

def test_an_older_schema_version_is_a_clear_error(tmp_path: Path) -> None:
    # What a schema-0 fxlens wrote: other field names, no schema_version 1.
    old = {"schema_version": 0, "model": {"name": "net"}, "total_flops": 3032,
           "layers": [{"name": "fc1", "flops": 1000}]}
    path = tmp_path / "main.report.json"
    path.write_text(json.dumps(old))
    with pytest.raises(ReportError, match=r"schema version 0; this fxlens reads version 1"):
        load_report(path)


def test_a_malformed_section_is_one_error_naming_the_field(tmp_path: Path) -> None:
    data = report_dict(BASE, memory=memory_json(1, {"fc1": 1}))
    data["memory"]["peak_activation_bytes"] = "lots"
    path = tmp_path / "pr.report.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match=r"memory\.peak_activation_bytes: expected an integer"):
        load_report(path)


@pytest.mark.parametrize("recurrence, message", [
    ({"steps": "many", "programs": 4}, r"nodes\[0\]\.recurrence\.steps: expected a number"),
    ({"steps": 64}, r"nodes\[0\]\.recurrence\.programs: missing"),
    ([64, 4], r"nodes\[0\]\.recurrence"),
])
def test_a_malformed_recurrence_is_one_error_naming_the_field(
        tmp_path: Path, recurrence: object, message: str) -> None:
    """A node's recurrence (a chunked scan's serial steps, `Cost.recurrence`) is read by type
    like every core field: a PR's report cannot slip a string into the roofline's sum."""
    data = report_dict(BASE)
    data["nodes"][0]["recurrence"] = recurrence
    path = tmp_path / "pr.report.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match=message):
        load_report(path)
    data["nodes"][0]["recurrence"] = {"steps": 64, "programs": 4}
    path.write_text(json.dumps(data))
    assert load_report(path).nodes[0].recurrence is not None


def test_sections_survive_the_json_round_trip() -> None:
    data = report_dict(BASE, memory=memory_json(5, {"fc1": 5}), roofline=roofline_json({"": 1.0}),
                       findings=[finding_json("FUS001", ["fc1"], "m")])
    loaded = report_from_dict(data)
    assert loaded.require(Memory).peak_activation_bytes == 5
    assert loaded.require(Roofline).totals.total_s == 1.0
    assert json.loads(loaded.to_json())["findings"] == data["findings"]
    assert report_from_dict(json.loads(loaded.to_json())) == loaded


# --- renderers --------------------------------------------------------------------------------

def _evil_diff() -> ReportDiff:
    new = [*BASE, (EVIL, LINEAR, 500, 50, (4, 2))]
    findings = [finding_json("FUS001", [EVIL], "<b>fuse</b> | me")]
    return compare(report(BASE), report(new, findings=findings))


def test_markdown_escapes_module_names() -> None:
    diff = _evil_diff()
    text = render_diff_markdown(diff, check_gates(diff, parse_gates("flops:+1%")))
    assert "<script>" not in text and "<b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\|x" in text
    row = next(line for line in text.splitlines() if "alert" in line and "added" in line)
    # module, status, FLOPs, params, bytes read, bytes written: six cells, seven unescaped |
    assert row.replace("\\|", "").count("|") == 7
    assert "<details>" in text and "❌ flops:+1%" in text


def test_html_escapes_module_names_and_is_self_contained() -> None:
    page = render_diff_html(_evil_diff())
    assert "<script" not in page and "<b>fuse" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;|x" in page
    assert "http://" not in page and "https://" not in page


def test_terminal_renders_names_literally() -> None:
    from rich.console import Console

    console = Console(width=200, file=io.StringIO())
    console.print(render_diff_terminal(_evil_diff()))
    assert EVIL in console.file.getvalue()  # type: ignore[attr-defined]


def test_json_diff_is_deterministic_and_complete() -> None:
    diff = _evil_diff()
    text = diff_to_json(diff, (r.to_dict() for r in check_gates(diff, parse_gates("params:+0"))))
    assert text == diff_to_json(_evil_diff(), (r.to_dict() for r in check_gates(
        _evil_diff(), parse_gates("params:+0"))))
    data = json.loads(text)
    assert data["modules"][0]["path"] == EVIL and data["modules"][0]["status"] == "added"
    assert data["gates"][0]["tripped"] is True
    assert data["totals"]["flops"] == {"old": 3032, "new": 3532, "change": 500,
                                       "relative": pytest.approx(500 / 3032)}


# --- structure, not repetition ----------------------------------------------------------------

def _with_calls(shapes: list[tuple[int, ...]]) -> Report:
    data = report_dict(BASE)
    for i, shape in enumerate(shapes):
        data["nodes"].append({**data["nodes"][1], "id": 100 + i, "target": "aten.t.default",
                              "outputs": [{"shape": list(shape), "dtype": "float32"}]})
    return report_from_dict(data)


def test_reordered_calls_are_not_shape_changes() -> None:
    assert compare(_with_calls([(4, 8), (8, 4)]), _with_calls([(8, 4), (4, 8)])).shapes == ()
    changed = compare(_with_calls([(4, 8), (8, 4)]), _with_calls([(8, 4), (2, 2)]))
    assert changed.shapes and changed.shapes[0].op == "aten.t.default"


def test_a_moved_finding_is_neither_new_nor_resolved() -> None:
    old = report(BASE, findings=[finding_json("FUS001", ["fc1"], "epilogue")])
    new = report(BASE, findings=[finding_json("FUS001", ["fc2"], "epilogue")])
    diff = compare(old, new)
    assert diff.new_findings == () and diff.resolved_findings == ()


def test_an_added_subtree_is_listed_once() -> None:
    grown = [*BASE, ("head", LINEAR, 300, 30, (4, 2)), ("head.proj", LINEAR, 300, 30, (4, 2))]
    diff = compare(report(BASE), report(grown))
    assert [m.path for m in diff.with_status(ModuleStatus.ADDED)] == ["head"]


def test_sides_of_one_model_are_named_by_where_they_came_from() -> None:
    old = report_dict(BASE)
    old["model"]["source"] = "git:HEAD:net.py"
    diff = compare(report_from_dict(old), report(BASE))
    assert (diff.old_name, diff.new_name) == ("git:HEAD:net.py", "net.py")
