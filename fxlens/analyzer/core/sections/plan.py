"""Training layouts over many GPUs (``plan``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fxlens.analyzer.core.codec import optional
from fxlens.analyzer.core.section import Section, section


@dataclass(frozen=True)
class PlanMemory:
    """Bytes on one GPU of the fullest pipeline stage (`stage`) at its peak."""

    stage: int
    weights_bytes: int
    gradients_bytes: int
    master_bytes: int
    optimizer_bytes: int
    buffers_bytes: int
    activations_bytes: int          # saved for the backward, every micro-batch in flight
    temporaries_bytes: int          # the working set beyond them at the peak
    gathered_bytes: int             # ZeRO-3: unsharded weights and gradients in flight
    communication_bytes: int        # gradient buckets and compression buffers
    peak_bytes: int
    host_bytes: int = 0             # offloaded optimizer state and master weights


@dataclass(frozen=True)
class Collective:
    """One kind of transfer per step on one GPU: what moves it, over how many GPUs."""

    kind: str                       # all-reduce, reduce-scatter, all-gather, all-to-all, p2p
    cause: str
    group: int
    across_nodes: bool
    bytes: int                      # payload per call
    calls: int                      # per step
    time_s: float                   # all calls, ring formulas at the link bandwidth
    overlapped: bool                # hidden behind compute (up to the compute's length)


@dataclass(frozen=True)
class PlanTime:
    compute_s: float                # every micro-batch's forward and backward (and recompute)
    tensor_parallel_s: float
    expert_parallel_s: float
    pipeline_s: float               # stage-to-stage transfers
    bubble_s: float                 # pipeline fill and drain
    data_parallel_s: float          # all gradient and ZeRO traffic
    data_parallel_exposed_s: float  # the part compute does not hide
    optimizer_s: float
    step_s: float
    samples_per_step: int
    tokens_per_step: int
    tokens_per_s: float
    mfu: float
    context_parallel_s: float = 0.0  # context-parallel transfers the attention does not hide
    expert_parallel_exposed_s: float = 0.0  # the all-to-alls compute does not hide
    overlap_slowdown_s: float = 0.0  # compute slowed by the SMs hidden transfers hold
    recompute_s: float = 0.0        # of compute_s: the forwards run again (ckpt, ckpt=…)
    forward_s: float = 0.0          # of compute_s: the forwards (the rest is backward, recompute)
    host_s: float = 0.0             # the host launching every micro-batch's kernels
    host_wait_s: float = 0.0        # of step_s: GPUs waiting for those launches
    tensor_parallel_exposed_s: float | None = optional()  # tp-overlap: what GEMMs don't hide
    # with compression: the data-parallel transfers and their exposed part without it
    uncompressed_data_parallel_s: float | None = optional()
    uncompressed_exposed_s: float | None = optional()


@dataclass(frozen=True)
class PlanRun:
    """A whole run of `tokens` at this layout."""

    steps: int
    wall_s: float
    gpu_hours: float
    cost: float | None = optional()


@dataclass(frozen=True)
class PlanLayout:
    strategy: str
    gpus: int
    nodes: int
    dp: int
    tp: int
    pp: int
    ep: int
    zero: int
    micro_batches: int
    memory: PlanMemory
    collectives: tuple[Collective, ...]
    time: PlanTime
    fits: bool
    headroom_bytes: int
    run: PlanRun | None = optional()
    cp: int = 1
    etp: int = 1                    # expert tensor-parallel degree
    v: int = 1                      # virtual pipeline stages per GPU
    recompute_auto: bool = False    # its recompute chosen by ckpt=auto (none where it fit)


@dataclass(frozen=True)
class DroppedLayout:
    strategy: str
    reason: str
    needed_bytes: int | None = optional()     # per GPU, when it does not fit


@section("plan")
@dataclass(frozen=True)
class Plan(Section):
    """Training layouts over many GPUs: the requested one, or the best of a search first."""

    device: str
    device_bytes: int
    gpus_per_node: int
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    link_efficiency: float
    link_source: str
    micro_batch_samples: int
    micro_batch_tokens: int
    blocks: int
    experts: int
    tensor_parallel_pairs: int      # row-parallel GEMMs per block found in the graph
    ranked_by: str                  # "requested", "step time", "cost"
    layouts: tuple[PlanLayout, ...]
    considered: int
    dropped: tuple[DroppedLayout, ...]   # the closest to fitting first, at most `DROPPED_SHOWN`
    dropped_by_reason: Mapping[str, int]
    assumptions: tuple[str, ...]
    tokens: int | None = optional()
    price_per_gpu_hour: float | None = optional()
