"""The Report: the versioned artifact every renderer and `diff` reads.

Field names are a public contract (see README, "Report format"). `to_json` writes sorted keys
and no timestamps, so the same model gives the same bytes; `load_report` reads JSON only and
never executes anything. Sections added by the analysis passes (memory, roofline, findings…)
are typed (`fxlens.analyzer.core.sections`), found by type (`report.get(Memory)`) and written
under their key; a reader ignores keys it does not know, and a known section that does not
match its class fails the load with one `ReportError` naming the field. A report may come
from anyone (a pull request's artifact), so the core parts are decoded by type as well, the
file is read through `fxlens.analyzer.core.files.read_json` (regular file, size cap, strict
JSON, finite numbers, bounded depth), and `to_json` refuses a non-finite figure rather than
writing a bare ``NaN`` that would let every gate pass.

Bump `SCHEMA_VERSION` when a field changes meaning or disappears; adding a field does not.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import fxlens.analyzer.core.sections  # noqa: F401  (registers every section type)
from fxlens.analyzer.core.codec import CodecError, decode, is_optional, optional
from fxlens.analyzer.core.costs import Recurrence
from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.files import read_json, write_atomic
from fxlens.analyzer.core.section import SECTION_TYPES, Section

S = TypeVar("S", bound=Section)

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class InputSpec:
    """One example input as the graph took it (what torchinfo calls the input size)."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ModelInfo:
    name: str
    source: str
    capture_method: str
    capture_notes: tuple[str, ...]
    params: int
    param_bytes: int
    trainable_params: int
    buffers: int
    buffer_bytes: int
    inputs: tuple[InputSpec, ...] = ()
    # The sizes the command line can rebuild the model at (``batch``, ``seq_len``,
    # ``image_size``; `fxlens.analyzer.core.loaded.LoadedModel.resizable`): what a fix may change
    resizable: tuple[str, ...] = ()


@dataclass(frozen=True)
class Totals:
    flops: int
    macs: int
    bytes_read: int
    bytes_written: int


@dataclass(frozen=True)
class NodeReport:
    id: int
    target: str
    status: str                 # "costed", "free", "unsupported" or "failed"
    module: str
    module_type: str
    source: str
    inputs: tuple[int, ...]
    outputs: tuple[dict[str, Any], ...]
    flops: int
    bytes_read: int
    bytes_written: int
    phase: str = "forward"
    note: str = ""              # the convention its rule applied (e.g. causal attention)
    kernel: str = ""            # a kernel class with its own rate (gemm-misaligned)
    recurrence: Recurrence | None = optional()   # steps walked in order (`Cost`)


@dataclass(frozen=True)
class ModuleReport:
    path: str
    type: str
    depth: int
    flops: int
    macs: int
    bytes_read: int
    bytes_written: int
    params: int
    param_bytes: int
    nodes: int


@dataclass(frozen=True)
class Coverage:
    costed: int
    free: int
    unsupported: Mapping[str, int]
    failed: Mapping[str, str]

    @property
    def complete(self) -> bool:
        return not self.unsupported and not self.failed

    @property
    def ratio(self) -> float:
        """Share of call nodes that are costed or free."""
        missing = sum(self.unsupported.values()) + len(self.failed)
        total = self.costed + self.free + missing
        return 1.0 if total == 0 else (self.costed + self.free) / total


@dataclass(frozen=True)
class OpTotal:
    """Every call of one op overload, summed."""

    target: str
    calls: int
    flops: int
    bytes_moved: int


@dataclass(frozen=True)
class Report:
    model: ModelInfo
    totals: Totals
    nodes: tuple[NodeReport, ...]
    modules: tuple[ModuleReport, ...]
    coverage: Coverage
    meta: Mapping[str, str]
    sections: Mapping[str, Section] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def get(self, kind: type[S]) -> S | None:
        """The section of type `kind`, or None when the report has none."""
        found = self.sections.get(kind.key)
        return found if isinstance(found, kind) else None

    def require(self, kind: type[S]) -> S:
        """The section of type `kind`; `ReportError` when the report has none."""
        found = self.get(kind)
        if found is None:
            raise ReportError(f"the report has no {kind.key!r} section")
        return found

    def with_(self, *sections: Section) -> Report:
        """This report with `sections` added (replacing any of the same type)."""
        return replace(self, sections={**self.sections, **{s.key: s for s in sections}})

    def to_dict(self) -> dict[str, Any]:
        data = _as_dict(replace(self, sections={}))
        data["coverage"]["ratio"] = self.coverage.ratio
        data.pop("sections")
        data.update({key: s.to_json() for key, s in self.sections.items()})
        return data

    def to_json(self) -> str:
        """Deterministic JSON; a non-finite figure (a bug upstream) is refused, never
        written as a bare ``NaN`` that other readers reject and comparisons let pass."""
        data = self.to_dict()
        try:
            return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
        except ValueError:
            raise ValueError(f"the report holds a non-finite figure at {_non_finite(data)}"
                             ) from None

    def by_op(self) -> list[OpTotal]:
        """Totals per op overload, most FLOPs first (then most bytes, then name)."""
        sums: dict[str, list[int]] = {}
        for node in self.nodes:
            entry = sums.setdefault(node.target, [0, 0, 0])
            entry[0] += 1
            entry[1] += node.flops
            entry[2] += node.bytes_read + node.bytes_written
        totals = [OpTotal(target, *figures) for target, figures in sums.items()]
        return sorted(totals, key=lambda t: (-t.flops, -t.bytes_moved, t.target))

    def module(self, path: str) -> ModuleReport:
        for module in self.modules:
            if module.path == path:
                return module
        raise KeyError(path)


_SCALARS = (int, float, str, bool, type(None))
_FIELDS: dict[type, tuple[str, ...]] = {}
_OPTIONAL: dict[type, frozenset[str]] = {}


def _as_dict(obj: Any) -> Any:
    """`dataclasses.asdict`, the same result, without its per-value ``copy.deepcopy`` of
    scalars: a training step's report holds tens of thousands of nodes. Immutable scalars
    are returned as they are (``deepcopy`` returns them too); containers are copied. A field
    declared `optional` is left out while it is None, as the codec's `encode` does."""
    kind = type(obj)
    if kind in _SCALARS:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELDS.get(kind)
        if names is None:
            names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(obj))
            _OPTIONAL[kind] = frozenset(f.name for f in dataclasses.fields(obj) if is_optional(f))
        out = {name: v if type(v := getattr(obj, name)) in _SCALARS else _as_dict(v)
               for name in names}                           # scalars inline: most fields
        for name in _OPTIONAL[kind]:
            if out[name] is None:
                del out[name]
        return out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):      # a named tuple
        return kind(*[_as_dict(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return kind([v if type(v) in _SCALARS else _as_dict(v) for v in obj])
    if isinstance(obj, dict):
        return kind((_as_dict(k), _as_dict(v)) for k, v in obj.items())
    return copy.deepcopy(obj)


def write_report(report: Report, path: Path) -> None:
    """Write the report's JSON atomically (`fxlens.analyzer.core.files.write_atomic`)."""
    write_atomic(path, report.to_json())


def load_report(path: Path) -> Report:
    """Read a report written by `write_report`, checking its schema version. JSON only.

    The file may come from anyone (a pull request's report): it must be a regular file under
    the size cap, strict UTF-8 JSON with finite numbers, nested at most `MAX_DEPTH` deep
    (`fxlens.analyzer.core.files.read_json`), and every field must have its declared type
    (the codec decodes the core parts too, not only the sections). Any failure is one
    `ReportError` naming the file and the field."""
    data = read_json(path, "report")
    version = data.get("schema_version") if isinstance(data, dict) else None
    if type(version) is not int or version != SCHEMA_VERSION:
        shown = "none" if version is None else _short(version)
        raise ReportError(
            f"{path} has report schema version {shown}; this fxlens reads version "
            f"{SCHEMA_VERSION}. Regenerate the report with this fxlens version."
        )
    try:
        return report_from_dict(data)
    except CodecError as error:
        raise ReportError(f"{path} is not a valid fxlens report: {error}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ReportError(f"{path} is not a valid fxlens report: "
                          f"{type(error).__name__}: {_short(error)}") from None


def _short(value: object) -> str:
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _non_finite(data: Any, where: str = "$") -> str:
    """The JSON path of the first non-finite float in `data` (for the error message)."""
    stack: list[tuple[Any, str]] = [(data, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return at
        if isinstance(value, dict):
            stack.extend((v, f"{at}.{k}") for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(value))
    return where


_CORE_FIELDS = {"schema_version", "model", "totals", "nodes", "modules", "coverage", "meta"}


def report_from_dict(data: Mapping[str, Any]) -> Report:
    """A `Report` from its JSON, every part decoded by its declared type (`CodecError`)."""
    for key in ("model", "totals", "nodes", "modules", "coverage"):
        if key not in data:
            raise CodecError(f"{key}: missing")
    if not isinstance(data["coverage"], Mapping):
        raise CodecError("coverage: expected an object")
    coverage = {k: v for k, v in data["coverage"].items() if k != "ratio"}
    nodes = decode(tuple[NodeReport, ...], data["nodes"], "nodes")
    for node in nodes:
        _check_outputs(node)
    return Report(
        model=decode(ModelInfo, data["model"], "model"),
        totals=decode(Totals, data["totals"], "totals"),
        nodes=nodes,
        modules=decode(tuple[ModuleReport, ...], data["modules"], "modules"),
        coverage=decode(Coverage, coverage, "coverage"),
        meta=decode(dict[str, str], data.get("meta", {}), "meta"),
        sections=_sections(data),
        schema_version=data["schema_version"],
    )


def _check_outputs(node: NodeReport) -> None:
    """A node's outputs are free-form objects; the parts readers use must have their types:
    ``shape`` a list of integers, ``dtype`` a string."""
    for i, output in enumerate(node.outputs):
        where = f"nodes[id={node.id}].outputs[{i}]"
        if "shape" in output:
            decode(tuple[int, ...], output["shape"], f"{where}.shape")
        if "dtype" in output:
            decode(str, output["dtype"], f"{where}.dtype")


def _sections(data: Mapping[str, Any]) -> dict[str, Section]:
    """The known sections of a report's JSON, decoded; unknown keys are left out."""
    return {key: SECTION_TYPES[key].from_json(value) for key, value in data.items()
            if key not in _CORE_FIELDS and key in SECTION_TYPES}
