"""Training-state accounting: pure functions over `ParamInfo`s and policies, no tracing.

What it owns:
- `state_memory`: bytes of working weights, master weights, gradients, optimizer state and
  buffers for a precision and an optimizer policy, in total and rolled up the module
  hierarchy (a parameter ``a.b.weight`` counts in ``a.b``, ``a`` and the root ``""``).
  Frozen parameters (``requires_grad=False``) keep their working weights only: no gradient,
  no master copy, no optimizer state. Buffers keep their declared dtype.
- `fits` and `largest_batch`: a verdict against a device's memory, and the largest batch
  whose activations still fit next to the persistent state.
- `parse_bytes`: "80GiB", "80GB", "24 GiB", "1.5e9" → bytes.
- `checkpoint_what_if`: activation checkpointing per repeated block (`core.graph.repeated_blocks`).

The policies (what a precision or optimizer keeps per parameter) are knowledge and live in
`fxlens.rules.training`; this module only states the interface it calls (`PrecisionPolicy`,
`OptimizerPolicy`), so the dependency stays ``analyzer ← rules``.

Known limitations: the activation side (saved tensors, liveness, peak) comes from the
engine; `largest_batch` assumes activations grow monotonically with the batch, and the
`LinearActivation` model assumes they grow linearly (``fixed + per_sample · batch``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from decimal import Decimal, InvalidOperation
from typing import Protocol

from fxlens.analyzer.core.graph import ParamInfo, TensorSpec, ancestors
from fxlens.analyzer.core.sections import States, StateTotals

# --- policies (implemented in fxlens.rules.training) ----------------------------------------


class PrecisionPolicy(Protocol):
    """Bytes a precision keeps per parameter."""

    @property
    def state_dtype(self) -> str: ...
    def weight_bytes(self, spec: TensorSpec) -> int: ...
    def master_bytes(self, spec: TensorSpec) -> int: ...
    def grad_bytes(self, spec: TensorSpec) -> int: ...


class OptimizerPolicy(Protocol):
    """State bytes and step FLOPs an optimizer needs per trainable parameter."""

    def state_bytes(self, spec: TensorSpec, state_dtype: str) -> int: ...
    def step_flops(self, spec: TensorSpec) -> int: ...
    @property
    def step_accesses(self) -> int | None: ...
    @property
    def foreach_temporaries(self) -> int: ...
    @property
    def moments_dtype(self) -> str | None: ...


# --- state memory ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StateBytes:
    """Persistent training state by category, in bytes."""

    weights_bytes: int = 0      # working weights (the copies forward and backward read)
    master_bytes: int = 0       # high-precision master copies kept by the optimizer
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    buffer_bytes: int = 0

    @property
    def total(self) -> int:
        return (self.weights_bytes + self.master_bytes + self.grad_bytes
                + self.optimizer_bytes + self.buffer_bytes)

    def plus(self, other: StateBytes) -> StateBytes:
        return StateBytes(self.weights_bytes + other.weights_bytes,
                          self.master_bytes + other.master_bytes,
                          self.grad_bytes + other.grad_bytes,
                          self.optimizer_bytes + other.optimizer_bytes,
                          self.buffer_bytes + other.buffer_bytes)

    def to_section(self) -> StateTotals:
        return StateTotals(**{name: getattr(self, name) for name in STATE_FIELDS},
                           total=self.total)


STATE_FIELDS = tuple(f.name for f in fields(StateBytes))   # its categories, in order


@dataclass(frozen=True)
class StateMemory(StateBytes):
    """Totals (the inherited fields) plus the same categories per module path, rolled up."""

    by_module: Mapping[str, StateBytes] = field(default_factory=dict)
    trainable_numel: int = 0
    frozen_numel: int = 0

    def to_section(self) -> States:
        """The report's ``training.states``: totals, numels, and per module (sorted by path)."""
        return States(**vars(super().to_section()), trainable_numel=self.trainable_numel,
                      frozen_numel=self.frozen_numel,
                      by_module={p: self.by_module[p].to_section() for p in sorted(self.by_module)})


def param_state(p: ParamInfo, precision: PrecisionPolicy, optimizer: OptimizerPolicy
                ) -> StateBytes:
    """The persistent state one parameter or buffer costs under the policies."""
    if p.is_buffer:
        return StateBytes(buffer_bytes=p.spec.nbytes)
    weights = precision.weight_bytes(p.spec)
    if not p.requires_grad:
        return StateBytes(weights_bytes=weights)
    return StateBytes(
        weights_bytes=weights,
        master_bytes=precision.master_bytes(p.spec),
        grad_bytes=precision.grad_bytes(p.spec),
        optimizer_bytes=optimizer.state_bytes(p.spec, precision.state_dtype),
    )


def state_memory(params: Iterable[ParamInfo], precision: PrecisionPolicy,
                 optimizer: OptimizerPolicy) -> StateMemory:
    """Persistent training state of `params` (parameters and buffers) under the policies."""
    total = StateBytes()
    by_module: dict[str, StateBytes] = {}
    trainable = frozen = 0
    for p in params:
        state = param_state(p, precision, optimizer)
        total = total.plus(state)
        for path in ancestors(p.owner):
            by_module[path] = by_module.get(path, StateBytes()).plus(state)
        if not p.is_buffer:
            if p.requires_grad:
                trainable += p.spec.numel
            else:
                frozen += p.spec.numel
    return StateMemory(
        total.weights_bytes, total.master_bytes, total.grad_bytes, total.optimizer_bytes,
        total.buffer_bytes,
        by_module={p: by_module[p] for p in sorted(by_module)},
        trainable_numel=trainable, frozen_numel=frozen,
    )


def optimizer_step_bytes(params: Iterable[ParamInfo], precision: PrecisionPolicy,
                         optimizer: OptimizerPolicy) -> int:
    """Bytes one optimizer step moves: per trainable parameter, `step_accesses` elements of
    the copy it updates (the master copy, if kept) and that copy written to the working
    weights; an optimizer without them reads every state once, writes all but the gradient."""
    moved = 0
    for p in params:
        if p.is_buffer or not p.requires_grad:
            continue
        s = param_state(p, precision, optimizer)
        updated = s.master_bytes or s.weights_bytes
        if optimizer.step_accesses is None:
            moved += 2 * (s.weights_bytes + s.master_bytes + s.optimizer_bytes) + s.grad_bytes
        else:
            moved += optimizer.step_accesses * updated
            moved += s.master_bytes + s.weights_bytes if s.master_bytes else 0
    return moved


def optimizer_step_flops(params: Iterable[ParamInfo], optimizer: OptimizerPolicy) -> int:
    """FLOPs of one optimizer step: trainable parameters only."""
    return sum(optimizer.step_flops(p.spec) for p in params
               if not p.is_buffer and p.requires_grad)


# --- fitting on a device ---------------------------------------------------------------------


@dataclass(frozen=True)
class FitVerdict:
    fits: bool
    headroom_bytes: int         # device − need; negative when it does not fit
    utilisation: float          # need ÷ device


def fits(total_bytes: int, device_bytes: int) -> FitVerdict:
    """Whether `total_bytes` fit in `device_bytes` (exactly full fits)."""
    if device_bytes <= 0:
        raise ValueError(f"device memory must be positive, got {device_bytes} bytes")
    return FitVerdict(total_bytes <= device_bytes, device_bytes - total_bytes,
                      total_bytes / device_bytes)


@dataclass(frozen=True)
class LinearActivation:
    """Activation bytes linear in the batch: ``fixed_bytes + per_sample_bytes · batch``."""

    per_sample_bytes: int
    fixed_bytes: int = 0

    def __call__(self, batch: int) -> int:
        return self.fixed_bytes + self.per_sample_bytes * batch

    @classmethod
    def proportional(cls, batch: int, activation_bytes: int) -> LinearActivation:
        """From one measurement, all of it per sample (rounded up).

        NB: anything that does not grow with the batch (masks, position tables) is then
        scaled with it, which errs on the safe side.
        """
        return cls(-(-activation_bytes // batch))

    @classmethod
    def through(cls, batch_a: int, bytes_a: int, batch_b: int, bytes_b: int
                ) -> LinearActivation:
        """The line through two measurements (slope rounded up)."""
        if batch_a == batch_b:
            raise ValueError("two different batch sizes are needed to fit a line")
        if batch_a > batch_b:
            batch_a, bytes_a, batch_b, bytes_b = batch_b, bytes_b, batch_a, bytes_a
        per_sample = -(-(bytes_b - bytes_a) // (batch_b - batch_a))
        return cls(per_sample, bytes_a - per_sample * batch_a)


MAX_BATCH = 1 << 20


def largest_batch(
    persistent_bytes: int,
    activation_bytes_at_batch: Callable[[int], int] | tuple[int, int],
    device_bytes: int,
    max_batch: int = MAX_BATCH,
) -> int:
    """The largest batch ``b`` with ``persistent + activations(b) <= device``; 0 if none.

    `activation_bytes_at_batch` is a function of the batch (assumed non-decreasing: it is
    searched, doubling then bisecting) or ``(per_sample_bytes, fixed_bytes)``, the linear
    model solved in closed form. The answer is capped at `max_batch`.
    """
    model = (LinearActivation(*activation_bytes_at_batch)
             if isinstance(activation_bytes_at_batch, tuple) else activation_bytes_at_batch)
    free = device_bytes - persistent_bytes
    if isinstance(model, LinearActivation):
        room = free - model.fixed_bytes
        if room < model.per_sample_bytes:
            return 0
        return max_batch if model.per_sample_bytes <= 0 else min(
            room // model.per_sample_bytes, max_batch)
    if model(1) > free:
        return 0
    lo, hi = 1, 0                             # lo fits; hi, once found, does not
    while not hi and lo < max_batch:
        probe = min(2 * lo, max_batch)
        lo, hi = (probe, 0) if model(probe) <= free else (lo, probe)
    if not hi:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if model(mid) <= free else (lo, mid)
    return lo


# --- parsing sizes ---------------------------------------------------------------------------

BYTE_UNITS: Mapping[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_bytes(text: str) -> int:
    """A memory size as users write it → bytes (rounded to the nearest byte).

    Decimal units are powers of ten (``GB`` = 10⁹), binary ones powers of two
    (``GiB`` = 2³⁰), as IEC 80000-13; units are case-insensitive; a bare number is bytes.
    An ambiguous bare prefix (``80G``) is refused rather than guessed.
    """
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in BYTE_UNITS:
        units = ", ".join(u.upper().replace("I", "i") for u in BYTE_UNITS if u)
        raise ValueError(f"cannot read {text!r} as a memory size; write a number with one "
                         f"of {units} (GB = 10^9 bytes, GiB = 2^30 bytes)")
    try:
        value = Decimal(match.group(1)) * BYTE_UNITS[unit]
    except InvalidOperation as e:
        raise ValueError(f"cannot read {text!r} as a memory size") from e
    return int(value.to_integral_value())


# --- activation checkpointing ----------------------------------------------------------------


@dataclass(frozen=True)
class BlockActivations:
    """What the engine measured for one repeated block of the training step."""

    path: str
    saved_bytes: int        # activations autograd saves inside the block for the backward
    input_bytes: int        # the block's inputs: what checkpointing keeps instead
    forward_flops: int


@dataclass(frozen=True)
class CheckpointWhatIf:
    """Checkpointing every block: keep block inputs, recompute one forward per block."""

    blocks: tuple[str, ...]
    saved_bytes_before: int     # Σ saved
    saved_bytes_after: int      # Σ inputs + the largest block's saved (one recomputed at once)
    recompute_flops: int        # Σ forward FLOPs of the blocks

    @property
    def memory_saved_bytes(self) -> int:
        """Negative when the blocks save less than their inputs plus one recomputation."""
        return self.saved_bytes_before - self.saved_bytes_after

    def flops_overhead(self, step_flops: int) -> float:
        """Recompute FLOPs as a fraction of the step's FLOPs without checkpointing."""
        return self.recompute_flops / step_flops if step_flops else 0.0


def checkpoint_what_if(blocks: Sequence[BlockActivations]) -> CheckpointWhatIf:
    """Saved-activation bytes and extra FLOPs when every block in `blocks` is checkpointed.

    During the backward of a checkpointed block its forward runs again and its activations
    are saved again until its backward is done, so one block's ``saved_bytes`` (the largest)
    is live on top of the kept inputs.
    NB: a block input its first op also saves is counted in both terms; activations outside
    the blocks are unchanged and left out of both totals.
    """
    saved = [b.saved_bytes for b in blocks]
    return CheckpointWhatIf(
        blocks=tuple(b.path for b in blocks),
        saved_bytes_before=sum(saved),
        saved_bytes_after=sum(b.input_bytes for b in blocks) + max(saved, default=0),
        recompute_flops=sum(b.forward_flops for b in blocks),
    )
