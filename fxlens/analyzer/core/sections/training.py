"""The training step's sections: its states, peak and fit (``training``) and selective
activation checkpointing under a budget (``selective_checkpointing``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fxlens.analyzer.core.codec import optional
from fxlens.analyzer.core.section import Section, section

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
class LiveSplit:
    """What a training step holds at one node of its forward/backward, by why: the tensors
    autograd saved for the backward, the working ones beside them (the forward's temporaries,
    the backward's activation gradients) and the weight gradients."""

    saved_bytes: int
    working_bytes: int
    gradient_bytes: int
    node: int = -1          # the node (id) it was taken at


@dataclass(frozen=True)
class PeakBreakdown:
    persistent_bytes: int
    fwd_bwd_peak_bytes: int
    gradients_at_peak_bytes: int
    optimizer_phase_bytes: int
    # the live set at the forward/backward's peak and where its working tensors peak (a
    # parallel plan, which holds other shares of each, takes the larger of the two)
    moments: tuple[LiveSplit, ...] = ()

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
    loss_dtype: str = "fp32"            # "logits": a transformers LM's loss without the cast
    mtp: int = 0                        # multi-token prediction depths trained (``--mtp``)
    mtp_shared: bool = False            # one depth's weights run `mtp` times
    lora: int = 0                       # LoRA adapters' rank (``--lora``; 0: none)
    lora_layers: int = 0                # the linear layers they adapt
    lora_base: str | None = None        # the frozen linear weights' format: "nf4", "fp8"
    packed: int = 0                     # sequences packed from samples of this many tokens

    @property
    def recipe(self) -> str:
        """What the step was recorded as: ``amp-bf16 · adamw``, and the loss when it is not
        the model's own, the multi-token prediction depths it trained, its LoRA adapters and
        its packed samples."""
        loss = " · loss in the logits' dtype" if self.loss_dtype == "logits" else ""
        mtp = ""
        if self.mtp:
            mtp = f" · +{self.mtp} MTP depth{'s' if self.mtp > 1 else ''}"
            mtp += " (one depth's weights)" if self.mtp_shared and self.mtp > 1 else ""
        lora = ""
        if self.lora:
            layers = "layer" if self.lora_layers == 1 else "layers"
            frozen = {"nf4": "NF4 weights frozen (QLoRA)", "fp8": "FP8 weights frozen"}.get(
                self.lora_base or "", "weights frozen")
            lora = f" · LoRA r{self.lora} on {self.lora_layers:,} {layers}, {frozen}"
        packed = f" · packed samples of {self.packed:,} tokens" if self.packed else ""
        return f"{self.precision} · {self.optimizer}{loss}{mtp}{lora}{packed}"

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
