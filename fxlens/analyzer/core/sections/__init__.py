"""Every typed report section: one frozen dataclass each, found by type (`report.get(Memory)`).

These classes are the report's schema beside `fxlens.analyzer.core.report`: the passes build
them, the views and `diff` read them, and the one codec writes and reads their JSON, so a
field renamed here is renamed everywhere (mypy finds the readers). Field names are the JSON
keys of report schema version 1. Bytes and FLOPs are ints, times in seconds (``*_s``), shares
in 0…1; ``None`` means "not measured / not applicable".

One module per room, every class re-exported here (import from
``fxlens.analyzer.core.sections``): `memory` (``memory``, ``kv_cache``, ``inference_fit``),
`training` (``training``, ``selective_checkpointing``), `timing` (``roofline``,
``validation``), `fusion` (``findings``, ``fusion``), `quant`, `serve`, `plan`, `prune`.
"""

from __future__ import annotations

from fxlens.analyzer.core.sections.fusion import (
    Finding,
    Findings,
    Fusion,
    KernelCounts,
)
from fxlens.analyzer.core.sections.memory import (
    DecodeStep,
    EagerPeak,
    InferenceFit,
    KVCache,
    KVLayerBytes,
    LiveTensor,
    Memory,
)
from fxlens.analyzer.core.sections.plan import (
    Collective,
    DroppedLayout,
    Plan,
    PlanLayout,
    PlanMemory,
    PlanRun,
    PlanTime,
)
from fxlens.analyzer.core.sections.prune import (
    Prune,
    PruneAlignment,
    PruneBlock,
    PruneCalibration,
    PruneCut,
    PruneGroup,
    PruneMember,
    PrunePlan,
)
from fxlens.analyzer.core.sections.quant import (
    Quant,
    QuantCalibration,
    QuantLayer,
    QuantPlan,
    QuantRisk,
    QuantTask,
    TaskRun,
    metric_lost,
)
from fxlens.analyzer.core.sections.serve import (
    Serve,
    ServeMaxLoad,
    ServePoint,
)
from fxlens.analyzer.core.sections.timing import (
    DeviceFigures,
    Hotspots,
    MemoryValidation,
    ModuleTiming,
    ModuleValidation,
    NodeTiming,
    NodeValidation,
    OpClassValidation,
    OpTiming,
    ProfileInfo,
    Roofline,
    RooflineSettings,
    RooflineTotals,
    RunSettingsInfo,
    Throughput,
    TotalValidation,
    Validation,
)
from fxlens.analyzer.core.sections.training import (
    BlockPolicy,
    BudgetPoint,
    Checkpointing,
    Fit,
    FixOption,
    LiveSplit,
    ModuleBytes,
    PeakBreakdown,
    SavedOp,
    SelectiveCheckpointing,
    States,
    StateTotals,
    Training,
)

__all__ = [
    "LiveTensor",
    "EagerPeak",
    "Memory",
    "KVLayerBytes",
    "DecodeStep",
    "KVCache",
    "InferenceFit",
    "StateTotals",
    "States",
    "ModuleBytes",
    "LiveSplit",
    "PeakBreakdown",
    "Checkpointing",
    "FixOption",
    "Fit",
    "Training",
    "SavedOp",
    "BlockPolicy",
    "BudgetPoint",
    "SelectiveCheckpointing",
    "DeviceFigures",
    "RooflineSettings",
    "NodeTiming",
    "ModuleTiming",
    "RooflineTotals",
    "Throughput",
    "OpTiming",
    "Hotspots",
    "Roofline",
    "RunSettingsInfo",
    "ProfileInfo",
    "NodeValidation",
    "OpClassValidation",
    "ModuleValidation",
    "TotalValidation",
    "MemoryValidation",
    "Validation",
    "Finding",
    "Findings",
    "KernelCounts",
    "Fusion",
    "QuantCalibration",
    "QuantLayer",
    "QuantRisk",
    "QuantPlan",
    "TaskRun",
    "metric_lost",
    "QuantTask",
    "Quant",
    "ServePoint",
    "ServeMaxLoad",
    "Serve",
    "PlanMemory",
    "Collective",
    "PlanTime",
    "PlanRun",
    "PlanLayout",
    "DroppedLayout",
    "Plan",
    "PruneMember",
    "PruneGroup",
    "PruneBlock",
    "PruneAlignment",
    "PrunePlan",
    "PruneCalibration",
    "PruneCut",
    "Prune",
]
