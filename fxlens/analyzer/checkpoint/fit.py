"""The training section's fit re-stated for a selectively checkpointed step: `with_fit`.

The ``--checkpoint auto`` pass (`fxlens.ckpt_pass`) and the fix finder that offers it
(`fxlens.analyzer.fixes.training`) both say what the run with the policy would report, so one
function does it: the step peak the policy gives, its verdict against the device, and the
largest batch by the training section's linear estimate (activations scale with the batch,
states and gradients do not), under the same policy.
"""

from __future__ import annotations

import dataclasses

from fxlens.analyzer.core.sections import SelectiveCheckpointing, Training
from fxlens.analyzer.memory.training_state import LinearActivation, fits, largest_batch


def with_fit(training: Training, section: SelectiveCheckpointing, samples: int) -> Training:
    """`training` with its fit for the step checkpointed as `section` says; `samples`: the
    recorded batch. Its fixes are kept only while it still does not fit."""
    fit = training.fit
    if fit is None:
        return training
    peak = training.peak_breakdown
    verdict = fits(section.peak_after_bytes, fit.device_bytes)
    activations = max(section.fwd_bwd_peak_bytes - peak.gradients_at_peak_bytes, 0)
    per_sample = LinearActivation.proportional(samples, activations)
    room = peak.persistent_bytes + peak.optimizer_phase_bytes <= fit.device_bytes
    batch = largest_batch(peak.persistent_bytes + peak.gradients_at_peak_bytes, per_sample,
                          fit.device_bytes) if room else 0
    return dataclasses.replace(training, fit=dataclasses.replace(
        fit, fits=verdict.fits, headroom_bytes=verdict.headroom_bytes,
        utilisation=verdict.utilisation, needed_bytes=section.peak_after_bytes,
        with_checkpointing=section.checkpointed, largest_batch=batch,
        fixes=() if verdict.fits else fit.fixes))
