"""Every typed report section: one frozen dataclass each, found by type (`report.get(Memory)`).

These classes are the report's schema beside `fxlens.analyzer.core.report`: the passes build
them, the views and `diff` read them, and the one codec writes and reads their JSON, so a
field renamed here is renamed everywhere (mypy finds the readers). Field names are the JSON
keys of report schema version 1. Bytes and FLOPs are ints, times in seconds (``*_s``), shares
in 0…1; ``None`` means "not measured / not applicable".

Sections: ``memory`` (`Memory`), ``training`` (`Training`), ``kv_cache`` (`KVCache`),
``roofline`` (`Roofline`), ``findings`` (`Findings`), ``fusion`` (`Fusion`), ``quant``
(`Quant`), ``validation`` (`Validation`), ``plan`` (`Plan`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fxlens.analyzer.core.codec import decode, encode, optional
from fxlens.analyzer.core.section import Section, section

# --- memory ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveTensor:
    """One storage live at the peak, described by the output that allocated it."""

    node: int
    module: str
    target: str
    bytes: int
    shape: tuple[int, ...]
    dtype: str
    category: str = "activation"


@dataclass(frozen=True)
class EagerPeak:
    """The eager forward's activation peak, simulated on fake tensors (None: it failed)."""

    peak_bytes: int | None
    peak_op: str | None = optional()
    error: str | None = optional()


@section("memory")
@dataclass(frozen=True)
class Memory(Section):
    """Liveness of the captured graph: resident bytes, the activation peak and its make-up."""

    lifetimes: str
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    peak_activation_bytes: int
    peak_node: int | None
    peak_module: str
    timeline: tuple[int, ...]
    live_at_peak: tuple[LiveTensor, ...]
    live_at_peak_count: int
    peak_by_category: Mapping[str, int] = field(default_factory=dict)
    at_peak_by_category: Mapping[str, int] = field(default_factory=dict)
    peak_by_phase: Mapping[str, int] = field(default_factory=dict)
    allocated_by_module: Mapping[str, int] = field(default_factory=dict)
    live_at_peak_by_module: Mapping[str, int] = field(default_factory=dict)
    eager: EagerPeak | None = optional()

    @property
    def activation_peak_bytes(self) -> int:
        """The peak a user running PyTorch eagerly sees: the simulated eager peak when there
        is one, else the graph executor's (tensors freed at their last use)."""
        if self.eager is not None and self.eager.peak_bytes is not None:
            return self.eager.peak_bytes
        return self.peak_activation_bytes


# --- training ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateTotals:
    """Persistent training state by category, in bytes."""

    weights_bytes: int = 0
    master_bytes: int = 0
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    buffer_bytes: int = 0
    total: int = 0


@dataclass(frozen=True)
class States(StateTotals):
    trainable_numel: int = 0
    frozen_numel: int = 0
    by_module: Mapping[str, StateTotals] = field(default_factory=dict)


@dataclass(frozen=True)
class ModuleBytes:
    module: str
    bytes: int


@dataclass(frozen=True)
class PeakBreakdown:
    persistent_bytes: int
    fwd_bwd_peak_bytes: int
    gradients_at_peak_bytes: int
    optimizer_phase_bytes: int

    @property
    def on_top(self) -> tuple[str, int]:
        """What sits on the persistent state at the step's peak, and its bytes: the
        forward/backward's live tensors, or the optimizer step's gradients and temporaries."""
        if self.optimizer_phase_bytes > self.fwd_bwd_peak_bytes:
            return "optimizer step (gradients + temporaries)", self.optimizer_phase_bytes
        return "activations and gradients", self.fwd_bwd_peak_bytes

    def fwd_bwd_bytes(self, relieved: int = 0) -> int:
        """The forward/backward's peak with `relieved` bytes of saved activations dropped
        (checkpointing's)."""
        return max(self.fwd_bwd_peak_bytes - relieved, 0)

    def step_bytes(self, relieved: int = 0) -> int:
        """The steady step's peak: the persistent state plus the larger of the
        forward/backward (less `relieved`) and the optimizer step."""
        return self.persistent_bytes + max(self.fwd_bwd_bytes(relieved),
                                           self.optimizer_phase_bytes)


@dataclass(frozen=True)
class Checkpointing:
    """What-if: activation checkpointing of every repeated block."""

    blocks: tuple[str, ...]
    saved_bytes_before: int
    saved_bytes_after: int
    memory_saved_bytes: int
    recompute_flops: int
    flops_overhead: float


@dataclass(frozen=True)
class FixOption:
    """A change of the run's options that makes a step fit, re-estimated on the same step
    (`fxlens.analyzer.fixes`): the flags to add, the step peak they give, the recompute they
    cost (a share of the step's FLOPs) and what changes."""

    flags: str
    needed_bytes: int
    recompute_overhead: float
    change: str


@dataclass(frozen=True)
class Fit:
    """Whether one step fits the device: `needed_bytes` (the step peak, checkpointed when
    `with_checkpointing`) against `device_bytes`; `largest_batch` 0 when none fits. When it
    does not fit, `fixes`: the cheapest changes that do, each re-estimated."""

    device: str
    device_bytes: int
    fits: bool
    headroom_bytes: int
    utilisation: float
    largest_batch: int
    needed_bytes: int = 0
    with_checkpointing: bool = False
    fixes: tuple[FixOption, ...] = ()


@section("training")
@dataclass(frozen=True)
class Training(Section):
    """One training step: FLOPs by phase, persistent state, saved activations, the step peak."""

    precision: str
    optimizer: str
    forward_flops: int
    backward_flops: int
    optimizer_flops: int
    step_flops: int
    states: States
    saved_activation_bytes: int
    saved_by_module: tuple[ModuleBytes, ...]
    step_peak_bytes: int
    first_step_peak_bytes: int
    peak_breakdown: PeakBreakdown
    checkpointing: Checkpointing | None = optional()
    fit: Fit | None = optional()
    optimizer_step_bytes: int = 0       # what one optimizer step reads and writes

    @property
    def state_bytes(self) -> int:
        """Weights, gradients and optimizer state: what no change on one device sheds, only
        sharding over GPUs (the persistent bytes and the gradients)."""
        return self.peak_breakdown.persistent_bytes + self.states.grad_bytes

    @property
    def checkpointed_peak_bytes(self) -> int | None:
        """The steady step's peak with every repeated block checkpointed (the what-if's saved
        activations off the forward/backward peak), None without ``--checkpoint``."""
        if self.checkpointing is None:
            return None
        return self.peak_breakdown.step_bytes(self.checkpointing.memory_saved_bytes)


# --- selective activation checkpointing ---------------------------------------------------------


@dataclass(frozen=True)
class SavedOp:
    """An op a selective-checkpointing policy saves, by overload: which of its calls in a
    block's forward it saves (0-based, as the policy counts them), all of them when `every`."""

    target: str
    calls: tuple[int, ...]
    every: bool
    bytes: int                      # kept per block


@dataclass(frozen=True)
class BlockPolicy:
    """One policy for alike blocks (the same forward, op for op): what it saves, in words too."""

    blocks: tuple[str, ...]
    saved: tuple[SavedOp, ...]
    summary: str                    # "matmuls and attention kept; norms, … recomputed"
    ops: int                        # ops of a block's recompute a policy may save
    saved_ops: int
    saved_bytes: int                # per block
    recompute: float                # per block, in the section's cost unit
    modules: tuple[str, ...] = ()   # module granularity: the children wrapped (recomputed)


@dataclass(frozen=True)
class BudgetPoint:
    """The policy chosen for one budget: its step peak and the recompute it adds."""

    budget_bytes: int
    peak_bytes: int
    recompute: float
    recompute_share: float
    saved_ops: int                  # per block, summed over the policies
    fits: bool
    exact: bool


@section("selective_checkpointing")
@dataclass(frozen=True)
class SelectiveCheckpointing(Section):
    """``--checkpoint auto``: which tensors of the repeated blocks to save and which to
    recompute so that the step's peak fits a budget at the least recompute
    (`fxlens.analyzer.checkpoint`). Peaks are steady steps, simulated."""

    budget_bytes: int
    budget_from: str                # what set the budget ("--checkpoint-budget 70GiB")
    cost_unit: str                  # "s" (roofline time) or "FLOP"
    cost_basis: str                 # "roofline time on h100" or "FLOPs (no --device)"
    peak_before_bytes: int          # without checkpointing
    peak_after_bytes: int           # with the policy
    least_peak_bytes: int           # every op of every block recomputed
    first_step_peak_bytes: int      # with the policy, optimizer state made in the step
    fwd_bwd_peak_bytes: int         # the forward/backward's live bytes at its peak, with it
    fits: bool
    checkpointed: bool              # False: the step fits the budget as it is
    recompute: float                # added per step, in `cost_unit`
    recompute_flops: int
    recompute_share: float          # of the step's time on the device (else FLOPs)
    policies: tuple[BlockPolicy, ...]
    curve: tuple[BudgetPoint, ...]
    solver: str
    exact: bool
    gap: float                      # recompute over the bound's, minus 1 (0 when exact)
    code: str                       # the policy as Python
    granularity: str = "op"         # "op": ops saved per block; "module": children wrapped


# --- KV cache ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVLayerBytes:
    name: str
    kv_heads: int
    k_head_dim: int
    v_head_dim: int
    tokens: int
    bytes: int
    kind: str = "attention"      # "state": a fixed state per sequence; "none": shares K, V
    state_bytes: int = 0         # of `bytes`, the fixed state of every sequence in the batch


@dataclass(frozen=True)
class DecodeStep:
    """Memory of one decode step: weights + the whole cache + one token's activations."""

    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    total_bytes: int


@section("kv_cache")
@dataclass(frozen=True)
class KVCache(Section):
    batch: int
    context: int
    dtype_bytes: float
    source: str
    total_bytes: int
    layers: tuple[KVLayerBytes, ...]
    decode_step: DecodeStep


@section("inference_fit")
@dataclass(frozen=True)
class InferenceFit(Section):
    """Whether the inference forward fits the roofline device: weights + the activation peak
    (+ the KV cache of the whole batch) against `device_bytes`; when it does not, `fixes`
    that do (`fxlens.analyzer.fixes.inference`), and with a KV cache the decode step's total
    (`decode_bytes`), which serving the batch holds once its prompts are in."""

    device: str
    device_bytes: int
    needed_bytes: int
    weights_bytes: int
    batch: int | None = optional()
    fixes: tuple[FixOption, ...] = ()
    decode_bytes: int | None = optional()

    @property
    def judged(self) -> bool:
        """Whether there is a verdict: the device has a memory figure."""
        return self.device_bytes > 0

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.device_bytes


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


@dataclass(frozen=True)
class RooflineSettings:
    tf32: bool
    dtype_rule: str


@dataclass(frozen=True)
class NodeTiming:
    id: int
    time_s: float
    bound: str           # "compute", "memory", "launch", "free" or "uncosted"
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


# --- fusion ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One fusion opportunity: what a rule matched, what fusing it saves, how to fix it
    (`saved_flops`: work the fix skips as well, as FUS009's ``is_causal=True`` does)."""

    code: str
    nodes: tuple[int, ...]
    modules: tuple[str, ...]
    saved_bytes: int
    saved_s: float | None
    message: str
    fix: str
    saved_flops: int = 0


@section("findings")
@dataclass(frozen=True)
class Findings(Section):
    """Fusion findings, most time saved first (most bytes without a device); written as a
    JSON list."""

    items: tuple[Finding, ...] = ()

    def to_json(self) -> Any:
        return [encode(f) for f in self.items]

    @classmethod
    def from_json(cls, data: Any) -> Findings:
        return cls(decode(tuple[Finding, ...], data, cls.key))


@dataclass(frozen=True)
class KernelCounts:
    kernels_unfused: int = 0
    kernels_fused: int = 0
    bytes_unfused: int = 0
    bytes_fused: int = 0


@section("fusion")
@dataclass(frozen=True)
class Fusion(Section):
    """Kernels and bytes moved, op by op and as a fusing compiler would group them."""

    kernels_unfused: int
    kernels_fused: int
    bytes_unfused: int
    bytes_fused: int
    policy: str
    kernels_fused_with_epilogues: int | None
    by_module: Mapping[str, KernelCounts]


# --- quantization ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantCalibration:
    batches: int
    source: str
    activations: bool
    metric: str
    logit_leaves: int
    # issue 35 (`quant.combine`): the calibration examples the bootstrap resampled; which
    # score ranks ("calibrated", "data-free", "leans on calibrated", "leans on data-free")
    # and the median weight on the calibrated one at the score format; the median ± (95 %) of
    # the calibrated scores there and the data-free score's own ± around the measurements
    # (None: too few pairs to size it); the expected Spearman ρ of the calibrated order
    # against an unlimited calibration's, the share of resamples keeping its worst layer,
    # and the examples for ρ ≥ 0.95 (None with a stability: more than 128× as many)
    examples: int | None = optional()
    ranking: str | None = optional()
    calibrated_weight: float | None = optional()
    calibrated_error_db: float | None = optional()
    prior_spread_db: float | None = optional()
    rank_stability: float | None = optional()
    worst_kept: float | None = optional()
    examples_for_stable: int | None = optional()


@dataclass(frozen=True)
class QuantLayer:
    """One quantizable layer; dB figures are higher-is-safer, None for an exact format."""

    layer: str
    type: str
    params: int
    status: str
    reason: str | None
    stats: Mapping[str, Any]
    weight_sqnr_db: Mapping[str, float | None]
    data_free_sqnr_db: Mapping[str, float | None]
    risks: tuple[str, ...]
    risk_details: Mapping[str, str]
    output_sqnr_db: Mapping[str, float | None] | None = optional()
    # nats per logit row, its top 1 % of rows capped (`quant.calibrated.tail_capped_mean`)
    output_kl: Mapping[str, float] | None = optional()
    top1_agreement: Mapping[str, float] | None = optional()
    calibrated_score_db: Mapping[str, float | None] | None = optional()
    activation: Mapping[str, Any] | None = optional()
    precision: str | None = optional()
    # per format: "ok", "risky", "keep higher" or "unscored" (see `quant.section.verdicts`)
    verdicts: Mapping[str, str] = field(default_factory=dict)
    # issue 16: ½·Σ F_ii·Δw_i² per format on the calibration data (`quant.fisher`), and on
    # synthetic inputs (data-free); per format "measured" or "fisher" behind the calibrated
    # score; the batch norm folded into the weight before scoring
    fisher_damage: Mapping[str, float] | None = optional()
    data_free_fisher: Mapping[str, float] | None = optional()
    calibrated_evidence: Mapping[str, str] | None = optional()
    folded_into: str | None = optional()
    # the structural rules (risk codes) that keep this layer at 8 bits or more, whatever its
    # score: its "keep higher" under 8 bits is theirs (`quant.section.verdicts`)
    kept_by: tuple[str, ...] = ()
    # issue 35 (`quant.combine`): ± (95 %) of the calibrated score over the calibration
    # examples; the combined score that ranks, gives the verdicts and sizes the plan, its ±
    # and the weight it gives the calibrated score; per format the rank, 1 = most sensitive
    # (layers whose intervals overlap share it: tied)
    calibrated_error_db: Mapping[str, float | None] | None = optional()
    combined_score_db: Mapping[str, float | None] | None = optional()
    combined_error_db: Mapping[str, float | None] | None = optional()
    calibrated_weight: Mapping[str, float] | None = optional()
    rank: Mapping[str, int] | None = optional()


@dataclass(frozen=True)
class QuantRisk:
    code: str
    layers: tuple[str, ...]
    message: str
    fix: str


@dataclass(frozen=True)
class QuantPlan:
    name: str
    activations: str
    weight_bytes: int
    original_bytes: int
    compression_ratio: float
    budget_bytes: int | None
    fits: bool | None
    predicted_output_sqnr_db: float | None
    basis: str
    precision: Mapping[str, str]


@dataclass(frozen=True)
class TaskRun:
    """The model file's ``evaluate(model)`` on the model with `weights` quantized: a format on
    every layer, or a plan ("plan w4a16"); `keeps`: every metric within the tolerance."""

    weights: str
    layers: str                     # "every layer" or "the plan's formats"
    activations: str | None         # "int8", "fp8"; None: left unquantized
    values: Mapping[str, float]
    keeps: bool


def metric_lost(before: float, after: float | None, lower_is_better: bool,
                tolerance: float) -> bool:
    """Whether a metric of ``evaluate()`` moved from `before` to `after` (None: not returned)
    by more than `tolerance` of |before| in its worse direction: the one rule that decides
    a `TaskRun`'s `keeps` and names what it lost."""
    if after is None:
        return True
    worse = after - before if lower_is_better else before - after
    return worse > tolerance * abs(before)


@dataclass(frozen=True)
class QuantTask:
    """Quantization in the task's terms (`fxlens.analyzer.quant.task`): the metrics
    ``evaluate(model)`` returns, on the model as it is and quantized."""

    original: Mapping[str, float]
    lower_is_better: tuple[str, ...]     # metric names read as lower-is-better (loss, ppl)
    tolerance: float                     # relative: 0.01 keeps within 1 % of the original
    runs: tuple[TaskRun, ...]


@section("quant")
@dataclass(frozen=True)
class Quant(Section):
    """Per-layer quantization sensitivity (see `fxlens.analyzer.quant.section`)."""

    status: str
    notes: tuple[str, ...]
    formats: tuple[str, ...]
    score_format: str
    calibration: QuantCalibration | None
    layers: tuple[QuantLayer, ...]
    risks: tuple[QuantRisk, ...]
    plan: QuantPlan | None
    # what the data-free and calibrated scores stand on, in words; the unit of the scores
    # that rank, give verdicts and size the plan: "sqnr" (output SQNR) or "kl" (−10·log10 KL)
    data_free_evidence: str | None = optional()
    calibrated_evidence: str | None = optional()
    score_metric: str | None = optional()
    task: QuantTask | None = optional()     # the model file's evaluate(), where it has one


# --- serving -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServePoint:
    """A batch of `batch` requests served together (`fxlens.analyzer.serve.estimate`)."""

    batch: int
    ttft_s: float                  # the batch's prefill: time to the first token
    tpot_s: float                  # mean decode step: time per output token after the first
    latency_s: float               # a request, first token to last
    output_tokens_per_s: float     # the batch's output tokens over its latency (all GPUs)
    fits: bool                     # its KV cache fits the memory left (≤ max_batch)
    # the same number of requests kept in flight by an in-flight batcher (steady state)
    inflight_tokens_per_s: float = 0.0
    inflight_tpot_s: float = 0.0


@dataclass(frozen=True)
class ServeMaxLoad:
    """In-flight batching at maximum load (`fxlens.analyzer.serve.inflight`): as many requests
    in flight as the KV cache and the engine's caps allow, prefills sharing steps with
    decodes."""

    requests: float                # in flight
    decodes_per_step: float
    prompt_tokens_per_step: float
    step_s: float                  # mean step: the time per output token
    output_tokens_per_s: float     # all GPUs
    bound: str                     # "requests" (the KV cache), "max_num_seqs", "max_num_tokens"
    max_num_tokens: int | None = optional()    # the engine's caps (None: no cap)
    max_num_seqs: int | None = optional()


@section("serve")
@dataclass(frozen=True)
class Serve(Section):
    """``--serve``: prefill, decode steps, capacity and the throughput-latency curve of a
    decoder LM on a device (`fxlens.analyzer.serve`). The top-level figures are those of the
    headline point (`batch`): the best under ``--tpot-slo``, else the largest asked batch that
    fits, else `max_batch`."""

    device: str
    input_len: int
    output_len: int
    batch: int
    ttft_s: float
    tpot_s: float
    latency_s: float
    output_tokens_per_s: float
    max_batch: int
    device_bytes: int
    usable_bytes: int              # the share of the device an engine plans with
    weights_bytes: int
    workspace_bytes: int           # one prompt's prefill activations
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int     # input + output tokens, rounded up to whole blocks
    block_tokens: int
    block_waste_bytes: int         # per sequence: the last block's unused tokens
    curve: tuple[ServePoint, ...]
    tpot_slo_s: float | None
    layers: int
    decode_bytes_per_step: int     # at batch 1, mid-request context: weights + cache read
    prefill_flops_per_request: float
    notes: tuple[str, ...]
    tp: int = 1                     # GPUs of the tensor-parallel group (memory figures per GPU)
    max_load: ServeMaxLoad | None = optional()
    weights_format: str = ""        # how the linear layers' weights are stored ("": as loaded)


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


# --- plan (many GPUs) ---------------------------------------------------------------------------


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
    context_parallel_s: float = 0.0  # ring-attention sends the attention does not hide
    expert_parallel_exposed_s: float = 0.0  # the all-to-alls compute does not hide
    recompute_s: float = 0.0        # of compute_s: the forwards run again (ckpt, ckpt=…)
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


# --- structured pruning ------------------------------------------------------------------------


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
    kind: str                      # "channels", "neurons", "heads", "kv groups"
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


@dataclass(frozen=True)
class PruneBlock:
    """A repeated block whose removal leaves the residual stream intact."""

    path: str
    params: int
    flops: int


@dataclass(frozen=True)
class PruneAlignment:
    """A member dimension the plan moves off a multiple the kernels like."""

    group: int
    param: str
    dim: int
    before: int
    after: int
    multiple: int


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
