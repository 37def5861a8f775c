"""The changes that make a training step fit its device, each re-estimated on the recorded step.

A verdict "does not fit" is only useful with what to change, and a suggestion is only worth
printing if it fits. So the levers are searched, not guessed: every combination of

- an 8-bit optimizer (``--optimizer adam8bit``) in place of Adam or AdamW: states of 2 B per
  parameter instead of 8 (`fxlens.rules.training`);
- pure bf16 (``--precision bf16``) in place of amp-bf16: no fp32 master copy, bf16 optimizer
  states; the step runs the same bf16 weights and activations, so the recorded step stands;
- activation checkpointing of every repeated block (``--checkpoint``): the saved activations
  it drops, at the price of recomputing the blocks' forward;
- selective checkpointing under the device's memory (``--checkpoint auto``): the policy the
  ``--checkpoint auto`` pass would choose for that budget (`SelectivePlanner`: the same solver
  on the same step, its costly part built once and shared with the pass), its step peak and
  the recompute it adds; it and ``--checkpoint`` are never combined, and ``--checkpoint`` is
  not offered where the selective lever, in its place, fits with no more recompute;

is put through the same accounting as the step itself (`training_section`, on the same
recorded graph: the re-estimate is exact, not a rule of thumb), and the cheapest ones that fit
are kept: fewest changes first, then least recompute, then least memory. Where none fits, each
combination's largest batch is tried (``--batch N``; activations scaled linearly from the
recorded batch, as the fit's own largest batch is) when the model can be built at another
batch. A combination containing a smaller one that fits is not offered: its extra change buys
nothing the verdict needs. A lever that would change what the step records (another
activation dtype: fp32 or autocast to bf16) is not offered here: its estimate needs another
recording.

Where the run checkpoints selectively already (``--checkpoint auto``), every combination is
estimated under its policy, at the run's budget; a budget above the device's memory gets the
lever ``--checkpoint-budget`` naming the device (the policy re-planned for it).

Nothing fits on one device when the persistent state alone is over it; then no fix is offered
and the verdict says what to shard (`fxlens.reports.views.headline`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.checkpoint.fit import with_fit
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import FixOption, SelectiveCheckpointing, Training
from fxlens.analyzer.memory.liveness import MemoryProfile
from fxlens.analyzer.memory.training_state import OptimizerPolicy, PrecisionPolicy
from fxlens.analyzer.memory.training_step import StepSettings, training_section

OFFERED = 2           # fixes shown: the cheapest that fit
AUTO = "--checkpoint auto"
BLANKET = "--checkpoint"


@dataclass(frozen=True)
class Alternatives:
    """The policies a fix may switch to, by name, where the run's own has one (the caller
    reads them from the rules: `fxlens.checks.fix_alternatives`): an 8-bit optimizer in place
    of Adam or AdamW, pure bf16 in place of amp-bf16."""

    eight_bit_optimizer: tuple[str, OptimizerPolicy] | None = None
    pure_half_precision: tuple[str, PrecisionPolicy] | None = None


@dataclass(frozen=True)
class SelectivePlanner:
    """The ``--checkpoint auto`` planner on the recorded step (the pipeline builds it,
    `fxlens.ckpt_pass.selective_planner`): `plan(training, budget_bytes)` is the section the
    pass would give for that training state and budget. `budget_bytes`: the run's own budget
    where it checkpoints selectively already (None: it does not); `device_budget_flag` states
    the device's memory as that budget (``--checkpoint-budget h100``)."""

    plan: Callable[[Training, int], SelectiveCheckpointing]
    budget_bytes: int | None = None
    device_budget_flag: str = ""


def _same(settings: StepSettings) -> StepSettings:
    return settings


@dataclass(frozen=True)
class Lever:
    """One change of the run: its flags, what it changes, and the settings it gives;
    `selective`: the step is then planned by the selective checkpointer for the device."""

    flags: str
    change: str
    apply: Callable[[StepSettings], StepSettings] = _same
    selective: bool = False


@dataclass(frozen=True)
class _Estimate:
    training: Training             # its fit as the run with the levers would report it
    fwd_bwd_bytes: int             # the forward/backward's peak under its checkpointing
    recompute_overhead: float      # recompute FLOPs over the step's


def levers(settings: StepSettings, alternatives: Alternatives,
           planner: SelectivePlanner | None = None) -> list[Lever]:
    """The levers that apply to `settings` and keep the recorded step valid."""
    found = []
    if alternatives.eight_bit_optimizer is not None:
        name, optimizer = alternatives.eight_bit_optimizer
        found.append(Lever(f"--optimizer {name}", "8-bit optimizer states",
                           lambda s: dataclasses.replace(s, optimizer_name=name,
                                                         optimizer=optimizer)))
    if alternatives.pure_half_precision is not None:
        name_p, precision = alternatives.pure_half_precision
        found.append(Lever(f"--precision {name_p}", "pure bf16: no fp32 master copy",
                           lambda s: dataclasses.replace(s, precision_name=name_p,
                                                         precision=precision)))
    if settings.checkpoint:
        return found
    if planner is None or planner.budget_bytes is None:
        found.append(Lever(BLANKET, "activation checkpointing of the repeated blocks",
                           lambda s: dataclasses.replace(s, checkpoint=True)))
    if planner is not None and planner.budget_bytes is None:
        found.append(Lever(AUTO, "selective checkpointing under the device's memory",
                           selective=True))
    elif planner is not None and planner.budget_bytes != settings.device_bytes \
            and planner.device_budget_flag:
        found.append(Lever(planner.device_budget_flag,
                           "the selective policy planned for the device's memory",
                           selective=True))
    return found


def training_fixes(step: TrainingGraph, report: Report, memory: MemoryProfile,
                   registry: CostRegistry, settings: StepSettings, alternatives: Alternatives,
                   resizable: bool, planner: SelectivePlanner | None = None
                   ) -> tuple[FixOption, ...]:
    """The cheapest changes (at most `OFFERED`) after which the step fits `settings`'s
    device, each with the step peak it gives; `resizable` when the model can be rebuilt at
    another batch (the batch lever); `planner`: the selective checkpointer, where the model
    has blocks it can checkpoint."""
    def estimate(chosen: Sequence[Lever]) -> _Estimate:
        changed = settings
        for lever in chosen:
            changed = lever.apply(changed)
        training = training_section(step, report, memory, registry, changed)
        return _estimated(training, chosen, settings, planner)

    found = [lever for lever in levers(settings, alternatives, planner)
             if lever.flags != BLANKET or _relieves(estimate((lever,)).training)]
    candidates = [combo for size in range(1, len(found) + 1)
                  for combo in itertools.combinations(found, size)
                  if not {BLANKET, AUTO} <= {lever.flags for lever in combo}]
    fitting: list[tuple[tuple[Lever, ...], FixOption]] = []
    for combo in candidates:
        if any(set(smaller) < set(combo) for smaller, _ in fitting):
            continue      # a part of it fits already: the rest is not needed
        estimated = estimate(combo)
        fit = estimated.training.fit
        if fit is not None and fit.fits:
            fitting.append((combo, _option(combo, estimated)))
    options = _undominated(fitting)
    if not options and resizable and settings.batch > 1:
        options = [option for combo in [(), *candidates]
                   if (option := _smaller_batch(combo, estimate(combo), settings)) is not None]
    options.sort(key=lambda o: (o.flags.count("--"), o.recompute_overhead, o.needed_bytes))
    return tuple(options[:OFFERED])


def _estimated(training: Training, chosen: Sequence[Lever], settings: StepSettings,
               planner: SelectivePlanner | None) -> _Estimate:
    """`training` as the run with `chosen` reports it: under the selective policy where the
    run or a lever asks for one (for the device's memory where a lever does)."""
    peak = training.peak_breakdown
    lever_asks = any(lever.selective for lever in chosen)
    if planner is None or settings.device_bytes is None or not (
            lever_asks or planner.budget_bytes is not None):
        relieved = training.checkpointing.memory_saved_bytes if training.checkpointing else 0
        overhead = training.checkpointing.flops_overhead if training.checkpointing else 0.0
        return _Estimate(training, peak.fwd_bwd_bytes(relieved), overhead)
    budget = settings.device_bytes if lever_asks or planner.budget_bytes is None \
        else planner.budget_bytes
    section = planner.plan(training, budget)
    overhead = section.recompute_flops / training.step_flops if training.step_flops else 0.0
    return _Estimate(with_fit(training, section, settings.batch), section.fwd_bwd_peak_bytes,
                     overhead)


def _relieves(training: Training) -> bool:
    """Whether checkpointing takes anything off this step (a model without repeated blocks
    has nothing to checkpoint: the lever would only add a flag)."""
    return training.checkpointing is not None and training.checkpointing.memory_saved_bytes > 0


def _undominated(fitting: Sequence[tuple[tuple[Lever, ...], FixOption]]) -> list[FixOption]:
    """The fixes less any ``--checkpoint`` one whose twin with ``--checkpoint auto`` in its
    place fits with no more recompute: the same changes otherwise, for less time."""
    by_flags = {tuple(lever.flags for lever in combo): option for combo, option in fitting}
    kept = []
    for combo, option in fitting:
        flags = [lever.flags for lever in combo]
        if BLANKET in flags:
            twin = by_flags.get(tuple(AUTO if f == BLANKET else f for f in flags))
            if twin is not None and twin.recompute_overhead <= option.recompute_overhead:
                continue
        kept.append(option)
    return kept


def _option(combo: Sequence[Lever], estimated: _Estimate) -> FixOption:
    fit = estimated.training.fit
    assert fit is not None
    return FixOption(flags=" ".join(lever.flags for lever in combo),
                     needed_bytes=fit.needed_bytes,
                     recompute_overhead=estimated.recompute_overhead,
                     change=", ".join(lever.change for lever in combo))


def _smaller_batch(combo: Sequence[Lever], estimated: _Estimate, settings: StepSettings
                   ) -> FixOption | None:
    """`combo` at the largest batch that fits under it (linear in the batch), if one does."""
    training = estimated.training
    fit = training.fit
    if fit is None or not 1 <= fit.largest_batch < settings.batch:
        return None
    batch, peak = fit.largest_batch, training.peak_breakdown
    activations = max(estimated.fwd_bwd_bytes - peak.gradients_at_peak_bytes, 0)
    scaled = peak.persistent_bytes + max(
        peak.gradients_at_peak_bytes + activations * batch // settings.batch,
        peak.optimizer_phase_bytes)
    if scaled > fit.device_bytes:
        return None
    option = _option(combo, estimated)
    flags = f"{option.flags} --batch {batch}".strip()
    change = ", ".join(c for c in (option.change, f"batch {batch} (estimated linearly)") if c)
    return FixOption(flags=flags, needed_bytes=scaled,
                     recompute_overhead=option.recompute_overhead, change=change)
