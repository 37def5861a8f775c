"""The Report: the versioned artifact every renderer and `diff` reads.

Field names are a public contract (see README, "Report format"). `to_json` writes sorted keys
and no timestamps, so the same model gives the same bytes; `load_report` reads JSON only and
never executes anything. Sections added by the analysis passes (memory, roofline, findings…)
are typed (`fxlens.analyzer.core.sections`), found by type (`report.get(Memory)`) and written
under their key; a reader ignores keys it does not know, and a known section that does not
match its class fails the load with one `ReportError` naming the field.

Bump `SCHEMA_VERSION` when a field changes meaning or disappears; adding a field does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import fxlens.analyzer.core.sections  # noqa: F401  (registers every section type)
from fxlens.analyzer.core.codec import CodecError, decode
from fxlens.analyzer.core.errors import ReportError
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
        data = asdict(replace(self, sections={}))
        data["coverage"]["ratio"] = self.coverage.ratio
        data.pop("sections")
        data.update({key: s.to_json() for key, s in self.sections.items()})
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n"

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


def write_report(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.to_json())


def load_report(path: Path) -> Report:
    """Read a report written by `write_report`, checking its schema version. JSON only."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ReportError(f"cannot read report {path}: {error}") from error
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise ReportError(
            f"{path} has report schema version {version!r}; this fxlens reads version "
            f"{SCHEMA_VERSION}. Regenerate the report with this fxlens version."
        )
    try:
        return report_from_dict(data)
    except CodecError as error:
        raise ReportError(f"{path} is not a valid fxlens report: {error}") from error
    except (KeyError, TypeError, ValueError) as error:
        raise ReportError(f"{path} is not a valid fxlens report: {error!r}") from error


_CORE_FIELDS = {"schema_version", "model", "totals", "nodes", "modules", "coverage", "meta"}


def report_from_dict(data: Mapping[str, Any]) -> Report:
    coverage = {k: v for k, v in data["coverage"].items() if k != "ratio"}
    return Report(
        model=decode(ModelInfo, data["model"], "model"),
        totals=Totals(**data["totals"]),
        nodes=tuple(NodeReport(**dict(n, inputs=tuple(n["inputs"]), outputs=tuple(n["outputs"])))
                    for n in data["nodes"]),
        modules=tuple(ModuleReport(**m) for m in data["modules"]),
        coverage=Coverage(**coverage),
        meta=data["meta"],
        sections=_sections(data),
        schema_version=data["schema_version"],
    )


def _sections(data: Mapping[str, Any]) -> dict[str, Section]:
    """The known sections of a report's JSON, decoded; unknown keys are left out."""
    return {key: SECTION_TYPES[key].from_json(value) for key, value in data.items()
            if key not in _CORE_FIELDS and key in SECTION_TYPES}
