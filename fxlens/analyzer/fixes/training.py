"""The changes that make a training step fit its device, each re-estimated on the recorded step.

A verdict "does not fit" is only useful with what to change, and a suggestion is only worth
printing if it fits. So the levers are searched, not guessed: every combination of

- an 8-bit optimizer (``--optimizer adam8bit``) in place of Adam or AdamW: states of 2 B per
  parameter instead of 8 (`fxlens.rules.training`);
- pure bf16 (``--precision bf16``) in place of amp-bf16: no fp32 master copy, bf16 optimizer
  states; the step runs the same bf16 weights and activations, so the recorded step stands;
- activation checkpointing of every repeated block (``--checkpoint``): the saved activations
  it drops, at the price of recomputing the blocks' forward;

is put through the same accounting as the step itself (`training_section`, on the same
recorded graph: the re-estimate is exact, not a rule of thumb), and the cheapest ones that fit
are kept: fewest changes first, then least recompute, then least memory. Where none fits, each
combination's largest batch is tried (``--batch N``; activations scaled linearly from the
recorded batch, as the fit's own largest batch is) when the model can be built at another
batch. A combination containing a smaller one that fits is not offered: its extra change buys
nothing the verdict needs. A lever that would change what the step records (another
activation dtype: fp32 or autocast to bf16) is not offered here: its estimate needs another
recording.

Nothing fits on one device when the persistent state alone is over it; then no fix is offered
and the verdict says what to shard (`fxlens.reports.views.headline`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import FixOption, Training
from fxlens.analyzer.memory.liveness import MemoryProfile
from fxlens.analyzer.memory.training_state import OptimizerPolicy, PrecisionPolicy
from fxlens.analyzer.memory.training_step import StepSettings, training_section

OFFERED = 2           # fixes shown: the cheapest that fit


@dataclass(frozen=True)
class Alternatives:
    """The policies a fix may switch to, by name, where the run's own has one (the caller
    reads them from the rules: `fxlens.checks.fix_alternatives`): an 8-bit optimizer in place
    of Adam or AdamW, pure bf16 in place of amp-bf16."""

    eight_bit_optimizer: tuple[str, OptimizerPolicy] | None = None
    pure_half_precision: tuple[str, PrecisionPolicy] | None = None


@dataclass(frozen=True)
class Lever:
    """One change of the run: its flags, what it changes, and the settings it gives."""

    flags: str
    change: str
    apply: Callable[[StepSettings], StepSettings]


def levers(settings: StepSettings, alternatives: Alternatives) -> list[Lever]:
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
    if not settings.checkpoint:
        found.append(Lever("--checkpoint", "activation checkpointing of the repeated blocks",
                           lambda s: dataclasses.replace(s, checkpoint=True)))
    return found


def training_fixes(step: TrainingGraph, report: Report, memory: MemoryProfile,
                   registry: CostRegistry, settings: StepSettings, alternatives: Alternatives,
                   resizable: bool) -> tuple[FixOption, ...]:
    """The cheapest changes (at most `OFFERED`) after which the step fits `settings`'s
    device, each with the step peak it gives; `resizable` when the model can be rebuilt at
    another batch (the batch lever)."""
    def estimate(chosen: Sequence[Lever]) -> Training:
        changed = settings
        for lever in chosen:
            changed = lever.apply(changed)
        return training_section(step, report, memory, registry, changed)

    found = [lever for lever in levers(settings, alternatives)
             if lever.flags != "--checkpoint" or _relieves(estimate((lever,)))]
    candidates = [combo for size in range(1, len(found) + 1)
                  for combo in itertools.combinations(found, size)]
    fitting: list[FixOption] = []
    fit_combos: list[tuple[Lever, ...]] = []
    for combo in candidates:
        if any(set(smaller) < set(combo) for smaller in fit_combos):
            continue      # a part of it fits already: the rest is not needed
        training = estimate(combo)
        if training.fit is not None and training.fit.fits:
            fitting.append(_option(combo, training))
            fit_combos.append(combo)
    if not fitting and resizable and settings.batch > 1:
        fitting = [option for combo in [(), *candidates]
                   if (option := _smaller_batch(combo, estimate(combo), settings)) is not None]
    fitting.sort(key=lambda o: (o.flags.count("--"), o.recompute_overhead, o.needed_bytes))
    return tuple(fitting[:OFFERED])


def _relieves(training: Training) -> bool:
    """Whether checkpointing takes anything off this step (a model without repeated blocks
    has nothing to checkpoint: the lever would only add a flag)."""
    return training.checkpointing is not None and training.checkpointing.memory_saved_bytes > 0


def _option(combo: Sequence[Lever], training: Training) -> FixOption:
    fit = training.fit
    assert fit is not None
    overhead = training.checkpointing.flops_overhead if training.checkpointing else 0.0
    return FixOption(flags=" ".join(lever.flags for lever in combo),
                     needed_bytes=fit.needed_bytes, recompute_overhead=overhead,
                     change=", ".join(lever.change for lever in combo))


def _smaller_batch(combo: Sequence[Lever], training: Training, settings: StepSettings
                   ) -> FixOption | None:
    """`combo` at the largest batch that fits under it (linear in the batch), if one does."""
    fit = training.fit
    if fit is None or not 1 <= fit.largest_batch < settings.batch:
        return None
    batch, peak = fit.largest_batch, training.peak_breakdown
    relieved = training.checkpointing.memory_saved_bytes if training.checkpointing else 0
    activations = max(peak.fwd_bwd_bytes(relieved) - peak.gradients_at_peak_bytes, 0)
    scaled = peak.persistent_bytes + max(
        peak.gradients_at_peak_bytes + activations * batch // settings.batch,
        peak.optimizer_phase_bytes)
    if scaled > fit.device_bytes:
        return None
    option = _option(combo, training)
    flags = f"{option.flags} --batch {batch}".strip()
    change = ", ".join(c for c in (option.change, f"batch {batch} (estimated linearly)") if c)
    return FixOption(flags=flags, needed_bytes=scaled,
                     recompute_overhead=option.recompute_overhead, change=change)
