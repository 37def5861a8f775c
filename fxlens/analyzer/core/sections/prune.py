"""Structured pruning: coupled groups, importance, the plan (``prune``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fxlens.analyzer.core.codec import optional
from fxlens.analyzer.core.section import Section, section


@dataclass(frozen=True)
class PruneMember:
    """Where one group's units sit in one parameter or buffer: along `dim`, unit
    ``first_unit + i`` is entries ``start + i·width … start + (i+1)·width - 1``."""

    param: str
    dim: int
    start: int
    width: int
    first_unit: int
    units: int


@dataclass(frozen=True)
class PruneGroup:
    """Units that must be removed together (`fxlens.analyzer.prune.groups`)."""

    id: int
    kind: str                      # "channels", "neurons", "heads", "kv groups", "block"
    name: str                      # the modules it spans (their common path)
    block: str                     # the repeated block it lies in ("" outside any)
    units: int
    unit: str                      # what one unit is: "1 channel", "1 head = 16 rows"…
    members: tuple[PruneMember, ...]
    params_per_unit: int           # exact savings of removing one unit (params)
    flops_per_unit: int            # … and forward FLOPs
    importance_basis: str          # "L2 of the weights", "|γ| of the batch norm", "none",
                                   # "calibrated damage"
    importance_min: float
    importance_median: float
    removed: int = 0               # units the plan removes
    # one unit's removal, exact, beside params and forward FLOPs (`fxlens.analyzer.prune.
    # savings`): the training step's FLOPs (forward + backward) and saved activations (with
    # --train), KV-cache bytes per token (causal attention only), and the forward's roofline
    # time on --device (negative: the cut moves a GEMM off its aligned kernels)
    train_flops_per_unit: int | None = optional()
    saved_bytes_per_unit: int | None = optional()
    kv_bytes_per_token_per_unit: int | None = optional()
    time_s_per_unit: float | None = optional()
    aligned_units: int = 1         # units whose removal keeps aligned dims aligned
    time_s_per_aligned: float | None = optional()   # … and the time that removal saves


@dataclass(frozen=True)
class PruneBlock:
    """A repeated residual block that can go whole (also a group of kind "block")."""

    path: str
    params: int
    flops: int


@dataclass(frozen=True)
class PruneAlignment:
    """A member dimension the plan moves off a multiple the kernels like. `penalised`: it
    leaves the 16-byte row the device model rates as ``gemm-misaligned`` (16- and 8-bit
    dims); the other multiples (64, 128) are noted, not priced (no measurement)."""

    group: int
    param: str
    dim: int
    before: int
    after: int
    multiple: int
    penalised: bool = False


@dataclass(frozen=True)
class PruneCut:
    """The cut a plan did not take: the exact one, or the nearest aligned one."""

    how: str                       # "exact", "aligned, rounded up", "aligned, rounded down"
    units_removed: int
    params_after: int
    flops_after: int
    met: bool
    misaligned: int                # forward GEMMs off their aligned kernels
    forward_s_after: float | None = optional()


@dataclass(frozen=True)
class PrunePlan:
    """The least important units across groups that reach `target`."""

    target: str                    # as asked: "30%", "30%flops"
    basis: str                     # "params" or "flops"
    share: float                   # of the basis to remove, 0…1
    met: bool
    units_removed: int
    params_before: int
    params_after: int
    flops_before: int
    flops_after: int
    alignment: tuple[PruneAlignment, ...]
    ranking: str                   # how units were ranked across groups
    # the plan's removal measured on the calibration batches (`PruneCalibration.metric`)
    damage: float | None = optional()
    cut: str = "exact"             # how the removal was made (`PruneCut.how`)
    train_flops_before: int | None = optional()     # the training step (with --train)
    train_flops_after: int | None = optional()
    saved_bytes_before: int | None = optional()
    saved_bytes_after: int | None = optional()
    kv_bytes_per_token_before: int | None = optional()
    kv_bytes_per_token_after: int | None = optional()
    device: str | None = optional()                 # roofline times on it (--device)
    forward_s_before: float | None = optional()
    forward_s_after: float | None = optional()
    train_s_before: float | None = optional()       # forward + backward, no optimizer
    train_s_after: float | None = optional()
    misaligned_before: int = 0     # forward GEMMs rated as misaligned
    misaligned_after: int = 0
    alternative: PruneCut | None = optional()


@dataclass(frozen=True)
class PruneCalibration:
    """How calibrated importance was measured (`fxlens.analyzer.prune.calibrated`)."""

    source: str                    # "calibration()" or "example inputs"
    batches: int
    metric: str                    # "kl" or "sqnr", as --quant-calibrate's auto rule picks
    metric_unit: str               # "KL of the outputs, nats", "relative output error power"
    units_measured: int            # each removed alone and forwarded; the rest interpolated
    units_total: int


@section("prune")
@dataclass(frozen=True)
class Prune(Section):
    """Structured pruning what-if (see `fxlens.analyzer.prune.section`)."""

    groups: tuple[PruneGroup, ...]
    blocked: Mapping[str, int]     # why coupled parameter axes cannot be pruned → how many
    blocks: tuple[PruneBlock, ...]
    importance: str                # "data-free" or "calibrated": the score that ranks
    notes: tuple[str, ...]
    plan: PrunePlan | None = optional()
    saved_to: str | None = optional()
    calibration: PruneCalibration | None = optional()
