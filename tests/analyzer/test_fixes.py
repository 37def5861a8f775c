"""Every fix a "does not fit" verdict suggests, applied as printed, fits (issue 36).

Cases: models of several kinds (a GPT with repeated blocks, an MLP, a dict-input model, a
convnet, an LSTM, transformers architectures, a preset) under precision and optimizer policies,
against devices sized below their step's peak (fractions of it, so each lands in another
regime: one lever enough, two needed, only a smaller batch, nothing on one device). Each
suggested fix's flags are applied to a new analysis, which must fit, with the step peak the
suggestion printed (exactly, but for a smaller batch: estimated linearly, so only "fits").
Selective checkpointing (``--checkpoint auto``, the planner of issue 32) is one of the levers:
applied, the pass plans the same policy for the device and its peak is the one printed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from fxlens.analyzer.core.sections import Fit, Training
from fxlens.api import analyze_target
from fxlens.pipeline import AnalysisOptions

GPT, MLP, DICT = "tests/models/tiny_gpt.py", "tests/models/mlp.py", "tests/models/dict_io.py"
CONV, LSTM = "tests/models/convnet.py", "tests/models/lstm.py"
LLAMA, QWEN3_NEXT = "tests.models.hf_zoo:build_llama", "tests.models.hf_zoo_hybrid:build_qwen3_next"
GPT2 = "hf:gpt2"

# (target, options, device memory as a fraction of the step's own peak)
CASES: list[tuple[str, dict[str, Any], float]] = [
    (GPT, {"precision": "amp-bf16"}, 0.9),
    (GPT, {"precision": "amp-bf16"}, 0.6),
    (GPT, {"precision": "amp-bf16"}, 0.45),
    (GPT, {"precision": "fp32"}, 0.9),
    (GPT, {"precision": "fp32"}, 0.7),
    (GPT, {"precision": "amp-bf16", "sizes": {"batch": 8, "seq_len": 64}}, 0.8),
    (GPT, {"precision": "amp-bf16", "sizes": {"batch": 8, "seq_len": 64}}, 0.5),
    (GPT, {"precision": "amp-bf16", "sizes": {"batch": 8, "seq_len": 64}}, 0.3),
    (GPT, {"precision": "fp32", "optimizer": "adam", "sizes": {"batch": 16}}, 0.6),
    (MLP, {"precision": "amp-bf16"}, 0.8),
    (MLP, {"precision": "fp32", "optimizer": "adam"}, 0.7),
    (DICT, {"precision": "amp-bf16"}, 0.85),
    (DICT, {"precision": "fp32", "sizes": {"batch": 32}}, 0.6),
    (CONV, {"precision": "amp-bf16"}, 0.85),
    (CONV, {"precision": "fp32"}, 0.75),
    (LSTM, {"precision": "amp-bf16"}, 0.8),
    (LLAMA, {"precision": "amp-bf16"}, 0.9),
    (LLAMA, {"precision": "amp-bf16"}, 0.55),
    (LLAMA, {"precision": "fp32"}, 0.8),
    (QWEN3_NEXT, {"precision": "amp-bf16"}, 0.85),
    (QWEN3_NEXT, {"precision": "amp-bf16"}, 0.55),
    (GPT2, {"precision": "amp-bf16", "overrides": {"n_layer": "2"},
            "sizes": {"batch": 4, "seq_len": 128}}, 0.9),
    (GPT2, {"precision": "amp-bf16", "overrides": {"n_layer": "2"},
            "sizes": {"batch": 4, "seq_len": 128}}, 0.7),
    (GPT2, {"precision": "amp-bf16", "overrides": {"n_layer": "2"},
            "sizes": {"batch": 8, "seq_len": 256}}, 0.5),
    # activations over the device: the selective planner's regime
    (GPT, {"precision": "fp32", "sizes": {"batch": 16, "seq_len": 128}}, 0.9),
    (GPT, {"precision": "fp32", "sizes": {"batch": 16, "seq_len": 128}}, 0.7),
    (GPT, {"precision": "amp-bf16", "sizes": {"batch": 8, "seq_len": 64},
           "checkpoint_auto": True, "checkpoint_budget": "1TB"}, 0.7),
]


def _training(target: str, options: AnalysisOptions) -> Training:
    training = analyze_target(target, options).get(Training)
    assert training is not None
    return training


def _verdict(training: Training) -> str:
    from fxlens.reports.views.headline import training_fit

    return training_fit(training).detail


def _applied(options: AnalysisOptions, flags: str) -> AnalysisOptions:
    """`options` with a fix's flags as the command line would set them."""
    words, changed = flags.split(), dataclasses.replace(options)
    for flag, value in zip(words, [*words[1:], ""], strict=True):
        if flag == "--optimizer":
            changed = dataclasses.replace(changed, optimizer=value)
        elif flag == "--precision":
            changed = dataclasses.replace(changed, precision=value)
        elif flag == "--checkpoint" and value == "auto":
            changed = dataclasses.replace(changed, checkpoint_auto=True)
        elif flag == "--checkpoint":
            changed = dataclasses.replace(changed, checkpoint=True)
        elif flag == "--checkpoint-budget":
            changed = dataclasses.replace(changed, checkpoint_budget=value)
        elif flag == "--batch":
            changed = dataclasses.replace(changed, sizes={**changed.sizes, "batch": int(value)})
    return changed


@pytest.mark.slow
def test_every_suggested_fix_fits_when_applied() -> None:
    with_fixes = 0
    for target, given, fraction in CASES:
        base = AnalysisOptions(train=True, **given)
        peak = _training(target, base).step_peak_bytes
        options = dataclasses.replace(base, device_memory=f"{int(peak * fraction)}B")
        training = _training(target, options)
        fit = training.fit
        assert fit is not None and not fit.fits, (target, given, fraction)
        if not fit.fixes:
            _check_no_fix_is_said_so(training, fit)
            continue
        with_fixes += 1
        assert all(fix.flags in _verdict(training) for fix in fit.fixes)
        for fix in fit.fixes:
            after = _training(target, _applied(options, fix.flags)).fit
            assert after is not None and after.fits, (target, given, fraction, fix)
            if "--batch" not in fix.flags:
                assert after.needed_bytes == fix.needed_bytes, fix
    assert with_fixes >= 20


def _check_no_fix_is_said_so(training: Training, fit: Fit) -> None:
    """No lever fits alone or together: the persistent state is over the device (shard it),
    or the activations are and no smaller batch can be offered."""
    state = training.state_bytes
    verdict = _verdict(training)
    if state >= fit.device_bytes:
        assert "shard them over" in verdict and "--plan --gpus" in verdict
    else:
        assert "smaller batch or sequence" in verdict and "fits with" not in verdict


@pytest.mark.slow
def test_a_step_whose_state_outgrows_the_device_is_offered_a_planned_layout(
        tmp_path: Path) -> None:
    """Weights, gradients and optimizer state over one GPU: no lever on one device helps, so
    the planner's smallest GPU count with a fitting layout is offered, and `--plan --gpus N`
    applied as printed lays it out with the same peak per GPU."""
    import json

    from fxlens.analyzer.core.sections import Plan

    base = AnalysisOptions(train=True, precision="amp-bf16", sizes={"batch": 2, "seq_len": 64})
    training = _training(GPT, base)
    state = training.state_bytes
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps({"devices": {"tiny-gpu": {
        "memory_bytes": int(state * 0.4), "bandwidth_bytes_per_s": 1e12,
        "peak_flops": {"fp32": 1e14, "bf16": 4e14}, "source": "test", "gpus_per_node": 8,
        "intra_node_bytes_per_s": 4.5e11, "inter_node_bytes_per_s": 5e10}}}))
    options = dataclasses.replace(base, device_memory="tiny-gpu", devices_file=str(devices))
    fit = _training(GPT, options).fit
    assert fit is not None and not fit.fits and len(fit.fixes) == 1
    (fix,) = fit.fixes
    assert fix.flags.startswith("--plan --gpus ") and "--device tiny-gpu" in fix.flags
    gpus = int(fix.flags.split()[2])
    assert gpus >= 4                                  # the state alone needs 2.5 devices
    planned = analyze_target(GPT, dataclasses.replace(
        options, plan=True, gpus=gpus, device="tiny-gpu")).require(Plan)
    fitting = [layout for layout in planned.layouts if layout.fits]
    assert fitting and fitting[0].memory.peak_bytes == fix.needed_bytes
    assert fitting[0].strategy in fix.change


def _fixes_at(target: str, options: AnalysisOptions, fraction: float) -> tuple[
        AnalysisOptions, Training]:
    """`options` with a device of `fraction` of the plain step's peak, and its training."""
    plain = dataclasses.replace(options, checkpoint_auto=False, checkpoint_budget=None)
    peak = _training(target, plain).step_peak_bytes
    at = dataclasses.replace(options, device_memory=f"{int(peak * fraction)}B")
    return at, _training(target, at)


def _check_applied(target: str, options: AnalysisOptions, training: Training) -> None:
    from fxlens.analyzer.core.sections import SelectiveCheckpointing

    assert training.fit is not None
    for fix in training.fit.fixes:
        report = analyze_target(target, _applied(options, fix.flags))
        after = report.get(Training)
        assert after is not None and after.fit is not None and after.fit.fits, fix
        assert after.fit.needed_bytes == fix.needed_bytes, fix
        section = report.get(SelectiveCheckpointing)
        if section is not None and section.checkpointed:
            assert fix.recompute_overhead == pytest.approx(
                section.recompute_flops / after.step_flops), fix


def test_the_selective_planner_is_offered_before_every_block_and_fits_as_printed() -> None:
    """Activations over the device (a GPT at batch 16 × 128 tokens, fp32): ``--checkpoint
    auto`` fits with less recompute than ``--checkpoint``, so it is offered and the blanket
    one is not; applied as printed, the pass plans the policy with the printed peak and
    recompute."""
    base = AnalysisOptions(train=True, precision="fp32", sizes={"batch": 16, "seq_len": 128})
    options, training = _fixes_at(GPT, base, 0.8)
    assert training.fit is not None and not training.fit.fits
    fixes = training.fit.fixes
    assert fixes and fixes[0].flags == "--checkpoint auto"
    assert "--checkpoint auto" in _verdict(training)
    assert "FLOPs recomputed" in _verdict(training)     # labelled by what it counts
    blanket = _training(GPT, dataclasses.replace(options, checkpoint=True))
    assert blanket.fit is not None and blanket.fit.fits and blanket.checkpointing is not None
    assert 0 < fixes[0].recompute_overhead < blanket.checkpointing.flops_overhead
    assert all(fix.flags.split() != ["--checkpoint"] for fix in fixes)
    _check_applied(GPT, options, training)


def test_a_run_checkpointing_selectively_gets_fixes_under_its_policy() -> None:
    """With ``--checkpoint auto`` at a budget above the device, every fix keeps the selective
    policy (never ``--checkpoint``, which would conflict with it); the budget re-planned for
    the device is one of them, and each applied as printed fits with the printed peak."""
    base = AnalysisOptions(train=True, precision="amp-bf16", sizes={"batch": 8, "seq_len": 64},
                           checkpoint_auto=True, checkpoint_budget="1TB")
    options, training = _fixes_at(GPT, base, 0.7)
    assert training.fit is not None and not training.fit.fits and training.fit.fixes
    flags = [fix.flags.split() for fix in training.fit.fixes]
    assert all("--checkpoint" not in words for words in flags), flags
    assert any("--checkpoint-budget" in words for words in flags), flags
    _check_applied(GPT, options, training)


def test_with_a_plan_one_gpus_fixes_are_not_searched() -> None:
    """Under --plan the plan's layouts answer "does it fit"; the single-GPU fix finder (whose
    selective solves take minutes on a big MoE step) is not run."""
    base = AnalysisOptions(train=True, precision="fp32", sizes={"batch": 16, "seq_len": 128})
    options, training = _fixes_at(GPT, base, 0.8)
    assert training.fit is not None and training.fit.fixes
    planned = _training(GPT, dataclasses.replace(options, plan=True, gpus=2, strategy="ddp"))
    assert planned.fit is not None and not planned.fit.fits and planned.fit.fixes == ()
