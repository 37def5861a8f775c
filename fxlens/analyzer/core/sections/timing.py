"""Time on a device: the roofline estimate (``roofline``) and a real run against it
(``validation``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fxlens.analyzer.core.codec import optional
from fxlens.analyzer.core.section import Section, section

# --- roofline ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceFigures:
    """The device figures an estimate used (a registry entry or a calibrated profile)."""

    name: str
    memory_bytes: int
    source: str
    peak_flops: Mapping[str, float]
    bandwidth_bytes_per_s: float
    kind: str
    compute_efficiency: float
    bandwidth_efficiency: float
    launch_s: float
    calibrated: bool
    kernel_efficiency: Mapping[str, float] = field(default_factory=dict)   # class → share
    host_free_s: float = 0.0        # the host per free op (a view), on a GPU
    host_module_s: float = 0.0      # the host per module call, on a GPU
    usable_bytes: int = 0           # what one process can allocate; 0: a report before it
    dtype_efficiency: Mapping[str, float] = field(default_factory=dict)    # key → share

    @property
    def capacity_bytes(self) -> int:
        """The memory fits verdicts compare with: usable where recorded, else the total."""
        return self.usable_bytes or self.memory_bytes


@dataclass(frozen=True)
class RooflineSettings:
    tf32: bool
    dtype_rule: str


@dataclass(frozen=True)
class NodeTiming:
    id: int
    time_s: float
    bound: str           # "compute", "memory", "latency", "launch", "free" or "uncosted"
    intensity: float     # FLOPs per byte moved
    dtype: str           # the peak figure it is computed at (fp32, tf32, bf16…)


@dataclass(frozen=True)
class ModuleTiming:
    path: str
    time_s: float
    share: float


@dataclass(frozen=True)
class RooflineTotals:
    time_s: float
    compute_bound_s: float
    memory_bound_s: float
    launch_bound_s: float
    launch_s: float
    by_phase: Mapping[str, float]
    uncosted_nodes: int
    optimizer_s: float | None = optional()
    step_time_s: float | None = optional()
    latency_bound_s: float | None = optional()   # recurrences' serial steps outweigh the work

    @property
    def total_s(self) -> float:
        """The whole estimate: the training step's when there is one, else the graph's."""
        return self.step_time_s if self.step_time_s is not None else self.time_s


@dataclass(frozen=True)
class Throughput:
    batch: int
    tokens: int
    samples_per_s: float
    tokens_per_s: float | None = optional()
    tokens_per_s_bound: float | None = optional()


@dataclass(frozen=True)
class OpTiming:
    target: str
    calls: int
    time_s: float
    flops: int
    time_share: float
    flops_share: float


@dataclass(frozen=True)
class Hotspots:
    by_time: tuple[OpTiming, ...]
    by_flops: tuple[OpTiming, ...]


@section("roofline")
@dataclass(frozen=True)
class Roofline(Section):
    device: DeviceFigures
    settings: RooflineSettings
    nodes: tuple[NodeTiming, ...]
    modules: tuple[ModuleTiming, ...]
    totals: RooflineTotals
    throughput: Throughput
    mfu: float
    mfu_dtype: str
    hotspots: Hotspots

    def node_times(self) -> dict[int, float]:
        return {n.id: n.time_s for n in self.nodes}

    def module_times(self) -> dict[str, float]:
        return {m.path: m.time_s for m in self.modules}

# --- validation --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettingsInfo:
    device: str
    warmup: int
    repeat: int


@dataclass(frozen=True)
class ProfileInfo:
    name: str
    source: str
    calibrated: bool


@dataclass(frozen=True)
class NodeValidation:
    id: int
    target: str
    module: str
    status: str
    predicted_s: float
    measured_s: float


@dataclass(frozen=True)
class OpClassValidation:
    op: str
    calls: int
    predicted_s: float
    measured_s: float
    error: float | None


@dataclass(frozen=True)
class ModuleValidation:
    path: str
    calls: int
    predicted_s: float
    measured_s: float
    error: float | None


@dataclass(frozen=True)
class TotalValidation:
    predicted_s: float
    measured_s: float
    error: float | None
    pass_s: float
    eager_s: float


@dataclass(frozen=True)
class MemoryValidation:
    predicted_peak_bytes: int
    measured_peak_bytes: int
    error: float | None


@section("validation")
@dataclass(frozen=True)
class Validation(Section):
    """Predicted beside measured on a real device: per node, op class, module and in total."""

    settings: RunSettingsInfo
    profile: ProfileInfo
    timed_nodes: int
    made_up_inputs: tuple[str, ...]
    nodes: tuple[NodeValidation, ...]
    op_classes: tuple[OpClassValidation, ...]
    modules: tuple[ModuleValidation, ...]
    total: TotalValidation
    memory: MemoryValidation
