"""`compare(old, new) -> ReportDiff`: what changed between two reports, module by module.

Pure: it reads two `Report`s and never loads a model, so a baseline written on another machine
or under another torch version compares (the schema version is checked when a report is
loaded, see `fxlens.analyzer.core.report.load_report`).

Matching, and the heuristics it rests on:

- **Modules by dotted path**, never by fx node ids or names: those change with the torch
  version and the capture method. Module figures are the report's roll-ups (a module and all
  below it); the root is left out of the per-module list because `totals` are its figures.
- **Renames.** A module only in `old` and one only in `new` are paired as *renamed* when they
  have the same type and identical figures (FLOPs, MACs, bytes read and written, params, param
  bytes, node count). Within a group of identical signatures they are paired in order of
  appearance. NB: modules with no cost and no parameters (Identity, Dropout in eval) are never
  paired, as any two of them look alike; a renamed module whose figures also changed shows as
  one removed and one added.
- **Shapes.** Node outputs are grouped by (module, op) in execution order; the i-th call of an
  op in a module is compared with the i-th call on the other side. Only groups present on both
  sides are compared, so a different decomposition under another torch version is not reported
  as a shape change.
- **Findings** (a ``findings`` section: a list of ``{code, modules, ...}``) are keyed by code
  and module paths (renames mapped), and compared as multisets.
- **Optional sections.** Activation memory (``memory.allocated_by_module``, own nodes, rolled
  up here like the other figures; ``live_at_peak_by_module``, not rolled up), the activation
  peak (``memory.peak_activation_bytes``), the training step peak
  (``training.step_peak_bytes``) and estimated time (the ``roofline`` section's total and
  module times)
  are used when a report has them; absent, the figure is None.

Per-module deltas are sorted by absolute impact: |ΔFLOPs|, then |Δbytes moved|, then
|Δparam bytes|, then |Δactivation bytes|, then path.
"""

from __future__ import annotations

import enum
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fxlens.analyzer.core.graph import ancestors
from fxlens.analyzer.core.report import ModuleReport, Report
from fxlens.analyzer.core.sections import Findings, Memory, Roofline, Training

#: Whole-model metrics, in display order; gates name these.
TOTAL_METRICS = ("flops", "macs", "params", "param_bytes", "bytes_read", "bytes_written",
                 "peak_memory", "step_peak", "time")
#: Per-module metrics, in display order.
MODULE_METRICS = ("flops", "macs", "params", "param_bytes", "bytes_read", "bytes_written",
                  "activation_bytes", "live_at_peak_bytes", "time")
_SIGNATURE = ("type", "flops", "macs", "bytes_read", "bytes_written", "params", "param_bytes",
              "nodes")


@dataclass(frozen=True)
class Delta:
    """One figure on both sides; None where a side does not have it."""

    old: float | None
    new: float | None

    @property
    def present(self) -> bool:
        return self.old is not None and self.new is not None

    @property
    def change(self) -> float:
        return (self.new or 0) - (self.old or 0)

    @property
    def relative(self) -> float | None:
        """change / old; None when old is missing or zero."""
        return self.change / self.old if self.old else None

    def to_dict(self) -> dict[str, Any]:
        return {"old": self.old, "new": self.new, "change": self.change,
                "relative": self.relative}


class ModuleStatus(enum.Enum):
    CHANGED = "changed"
    ADDED = "added"
    REMOVED = "removed"
    RENAMED = "renamed"


@dataclass(frozen=True)
class ModuleDelta:
    path: str                   # the new path; the old one for a removed module
    type: str
    status: ModuleStatus
    metrics: Mapping[str, Delta]
    old_path: str | None = None  # set for a renamed module

    def impact(self) -> tuple[float, ...]:
        moved = self._change("bytes_read") + self._change("bytes_written")
        return (abs(self._change("flops")), abs(moved), abs(self._change("param_bytes")),
                abs(self._change("activation_bytes")))

    def _change(self, metric: str) -> float:
        delta = self.metrics.get(metric)
        return delta.change if delta else 0

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "old_path": self.old_path, "type": self.type,
                "status": self.status.value,
                "metrics": {k: v.to_dict() for k, v in self.metrics.items()}}


@dataclass(frozen=True)
class ShapeChange:
    module: str
    op: str
    index: int                  # the index-th call of `op` in `module`
    old: tuple[tuple[int, ...], ...]
    new: tuple[tuple[int, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "op": self.op, "index": self.index,
                "old": [list(s) for s in self.old], "new": [list(s) for s in self.new]}


@dataclass(frozen=True)
class FindingChange:
    code: str
    modules: tuple[str, ...]
    message: str
    saved_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "modules": list(self.modules), "message": self.message,
                "saved_bytes": self.saved_bytes}


@dataclass(frozen=True)
class ReportDiff:
    old_name: str
    new_name: str
    totals: Mapping[str, Delta]
    modules: tuple[ModuleDelta, ...]      # changed, added, removed, renamed; by impact
    unchanged: int
    shapes: tuple[ShapeChange, ...]
    new_findings: tuple[FindingChange, ...]
    resolved_findings: tuple[FindingChange, ...]
    notes: tuple[str, ...]

    def with_status(self, status: ModuleStatus) -> tuple[ModuleDelta, ...]:
        return tuple(m for m in self.modules if m.status is status)

    def to_dict(self) -> dict[str, Any]:
        return {
            "old": self.old_name, "new": self.new_name,
            "totals": {k: v.to_dict() for k, v in self.totals.items()},
            "modules": [m.to_dict() for m in self.modules], "unchanged_modules": self.unchanged,
            "shape_changes": [s.to_dict() for s in self.shapes],
            "new_findings": [f.to_dict() for f in self.new_findings],
            "resolved_findings": [f.to_dict() for f in self.resolved_findings],
            "notes": list(self.notes),
        }


def compare(old: Report, new: Report) -> ReportDiff:
    """Everything that changed from `old` to `new`; see the module docstring for matching."""
    old_mods = {m.path: m for m in old.modules if m.path}
    new_mods = {m.path: m for m in new.modules if m.path}
    renames = find_renames([old_mods[p] for p in old_mods if p not in new_mods],
                           [new_mods[p] for p in new_mods if p not in old_mods])
    old_figures, new_figures = module_figures(old), module_figures(new)
    deltas: list[ModuleDelta] = []
    unchanged = 0
    for path, module in new_mods.items():
        old_path = renames.get(path, path)
        if old_path not in old_mods:
            status = ModuleStatus.ADDED
        elif old_path != path:
            status = ModuleStatus.RENAMED
        else:
            status = ModuleStatus.CHANGED
        metrics = _deltas(old_figures.get(old_path), new_figures[path])
        if status is not ModuleStatus.ADDED:
            # A figure one side lacks (a section not computed there) is not a change.
            metrics = {k: d if d.present else Delta(None, None) for k, d in metrics.items()}
        if status is ModuleStatus.CHANGED and not any(d.change for d in metrics.values()):
            unchanged += 1
            continue
        deltas.append(ModuleDelta(path, module.type, status, metrics,
                                  old_path if status is ModuleStatus.RENAMED else None))
    renamed_from = set(renames.values())
    for path, module in old_mods.items():
        if path not in new_mods and path not in renamed_from:
            deltas.append(ModuleDelta(path, module.type, ModuleStatus.REMOVED,
                                      _deltas(old_figures[path], None)))
    deltas = _outermost(deltas)
    deltas.sort(key=lambda d: (tuple(-x for x in d.impact()), d.path))
    new_found, resolved = _finding_changes(old, new, renames)
    return ReportDiff(
        old_name=_side(old, new), new_name=_side(new, old),
        totals=_deltas(total_figures(old), total_figures(new)), modules=tuple(deltas),
        unchanged=unchanged, shapes=tuple(shape_changes(old, new, renames)),
        new_findings=new_found, resolved_findings=resolved, notes=_notes(old, new),
    )


def _side(report: Report, other: Report) -> str:
    """What names one side in titles: the model's name, or where it came from when both sides
    share a name but not a source (``git:HEAD:net.py → net.py``)."""
    model = report.model
    if model.name == other.model.name and model.source != other.model.source and model.source:
        return model.source
    return model.name


def _outermost(deltas: list[ModuleDelta]) -> list[ModuleDelta]:
    """An added (removed) module whose parent was added (removed) too is in the parent's
    roll-up: only the outermost one is listed."""
    by_status = {s: {d.path for d in deltas if d.status is s}
                 for s in (ModuleStatus.ADDED, ModuleStatus.REMOVED)}
    return [d for d in deltas if d.status not in by_status
            or not any(a in by_status[d.status] for a in ancestors(d.path)[:-1] if a)]


def find_renames(removed: Iterable[ModuleReport], added: Iterable[ModuleReport]
                 ) -> dict[str, str]:
    """new path → old path for modules that look renamed (same type, identical figures)."""
    candidates: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for module in removed:
        if module.flops or module.params or module.bytes_read or module.bytes_written:
            candidates[_signature(module)].append(module.path)
    renames: dict[str, str] = {}
    for module in added:
        queue = candidates.get(_signature(module))
        if queue:
            renames[module.path] = queue.pop(0)
    return renames


def _signature(module: ModuleReport) -> tuple[Any, ...]:
    return tuple(getattr(module, name) for name in _SIGNATURE)


def total_figures(report: Report) -> dict[str, float | None]:
    """The whole-model metrics of `TOTAL_METRICS`; None where the report lacks a section."""
    memory, training = report.get(Memory), report.get(Training)
    roofline = report.get(Roofline)
    return {
        "flops": report.totals.flops, "macs": report.totals.macs,
        "params": report.model.params, "param_bytes": report.model.param_bytes,
        "bytes_read": report.totals.bytes_read, "bytes_written": report.totals.bytes_written,
        "peak_memory": memory.peak_activation_bytes if memory else None,
        "step_peak": training.step_peak_bytes if training else None,
        "time": roofline.totals.total_s if roofline else None,
    }


def module_figures(report: Report) -> dict[str, dict[str, float | None]]:
    """path → the metrics of `MODULE_METRICS`; None where the report lacks a section."""
    memory, roofline = report.get(Memory), report.get(Roofline)
    allocated = _rolled_up(memory.allocated_by_module) if memory else None
    live = memory.live_at_peak_by_module if memory else None
    times = roofline.module_times() if roofline else None
    return {
        m.path: {
            "flops": m.flops, "macs": m.macs, "params": m.params, "param_bytes": m.param_bytes,
            "bytes_read": m.bytes_read, "bytes_written": m.bytes_written,
            "activation_bytes": None if allocated is None else allocated.get(m.path, 0),
            "live_at_peak_bytes": None if live is None else live.get(m.path, 0),
            "time": None if times is None else times.get(m.path, 0.0),
        }
        for m in report.modules
    }


def _rolled_up(own: Mapping[str, int]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for path, size in own.items():
        for above in ancestors(path):
            totals[above] += size
    return dict(totals)


def _deltas(old: Mapping[str, float | None] | None,
            new: Mapping[str, float | None] | None) -> dict[str, Delta]:
    names = list((new or old or {}).keys())
    return {name: Delta(None if old is None else old.get(name),
                        None if new is None else new.get(name)) for name in names}


# --- shapes -----------------------------------------------------------------------------------

Shapes = tuple[tuple[int, ...], ...]


def shape_changes(old: Report, new: Report, renames: Mapping[str, str]) -> list[ShapeChange]:
    """Changed output shapes of the i-th call of each op in each module present on both sides;
    a group whose calls have the same shapes in another order (a reordered transpose) is not a
    change."""
    old_calls, new_calls = _calls(old), _calls(new)
    changes = []
    for (module, op), new_shapes in new_calls.items():
        old_shapes = old_calls.get((renames.get(module, module), op))
        if old_shapes is None:
            continue
        if Counter(old_shapes) == Counter(new_shapes):
            continue   # the same calls, perhaps in another order: no shape changed
        for index, (before, after) in enumerate(zip(old_shapes, new_shapes, strict=False)):
            if before != after:
                changes.append(ShapeChange(module, op, index, before, after))
    return changes


def _calls(report: Report) -> dict[tuple[str, str], list[Shapes]]:
    calls: dict[tuple[str, str], list[Shapes]] = defaultdict(list)
    for node in report.nodes:
        shapes = tuple(tuple(o["shape"]) for o in node.outputs if o and "shape" in o)
        calls[(node.module, node.target)].append(shapes)
    return calls


# --- findings ---------------------------------------------------------------------------------

def _finding_changes(old: Report, new: Report, renames: Mapping[str, str]
                     ) -> tuple[tuple[FindingChange, ...], tuple[FindingChange, ...]]:
    old_to_new = {o: n for n, o in renames.items()}
    before = _findings(old, old_to_new)
    after = _findings(new, {})
    added = _minus(after, Counter(map(_by_place, before)), _by_place)
    resolved = _minus(before, Counter(map(_by_place, after)), _by_place)
    # A finding that only moved (same code and message, other modules) is neither.
    moved = Counter(map(_by_message, added)) & Counter(map(_by_message, resolved))
    return _minus(added, moved, _by_message), _minus(resolved, moved, _by_message)


def _findings(report: Report, rename: Mapping[str, str]) -> list[FindingChange]:
    section = report.get(Findings)
    if section is None:
        return []
    return [FindingChange(code=f.code, modules=tuple(rename.get(m, m) for m in f.modules),
                          message=f.message, saved_bytes=f.saved_bytes)
            for f in section.items]


def _by_place(f: FindingChange) -> tuple[str, tuple[str, ...]]:
    return f.code, f.modules


def _by_message(f: FindingChange) -> tuple[str, str]:
    return f.code, f.message


def _minus(these: Sequence[FindingChange], taken: Counter[Any],
           key: Callable[[FindingChange], Any]) -> tuple[FindingChange, ...]:
    """`these` less the keys counted in `taken`, as multisets, in order."""
    left = Counter(taken)
    kept = []
    for finding in these:
        if left[key(finding)]:
            left[key(finding)] -= 1
        else:
            kept.append(finding)
    return tuple(kept)


# --- notes ------------------------------------------------------------------------------------

def _notes(old: Report, new: Report) -> tuple[str, ...]:
    """What differs between the two runs themselves, so a reader can weigh the deltas."""
    notes = []
    for key, label in (("torch_version", "torch"), ("fxlens_version", "fxlens")):
        before, after = old.meta.get(key), new.meta.get(key)
        if before != after:
            notes.append(f"{label} version differs: {before} (old) vs {after} (new)")
    if old.model.capture_method != new.model.capture_method:
        notes.append(f"capture method differs: {old.model.capture_method} (old) vs "
                     f"{new.model.capture_method} (new)")
    old_step, new_step = old.get(Training), new.get(Training)
    if old_step is not None and new_step is not None and old_step.recipe != new_step.recipe:
        notes.append(f"training recipe differs: {old_step.recipe} (old) vs {new_step.recipe} "
                     "(new)")
    return tuple(notes)


def diff_to_json(diff: ReportDiff, gates: Iterable[Mapping[str, Any]] = ()) -> str:
    """The diff (and gate results, as dicts) as deterministic JSON."""
    data = {**diff.to_dict(), "gates": list(gates)}
    return json.dumps(data, sort_keys=True, indent=1, allow_nan=False) + "\n"
