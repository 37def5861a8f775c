"""``--checkpoint auto --checkpoint-granularity module`` (issue 32): which child modules of the
repeated blocks to wrap in ``torch.utils.checkpoint``, and real CPU steps under the code the
report emits.

- the children a block offers (containers such as ``ModuleList`` run no forward: their items);
- a tighter budget never gets a higher peak or less recompute (the curve, 3 models);
- real runs: the emitted wrapping executed on a copy of the model, one steady AdamW step on CPU
  followed storage by storage (`tests.analyzer.sac_runs`): its peak within `TOLERANCE` of the
  predicted step peak, never over the budget by more;
- the option is refused without ``--checkpoint auto``.
"""

from __future__ import annotations

import functools
import itertools

import pytest

from fxlens.analyzer.checkpoint.blocks import children
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.sections import SelectiveCheckpointing, Training
from fxlens.api import AnalysisOptions
from fxlens.pipeline import Context, run_context
from tests.analyzer.sac_runs import measured_step
from tests.analyzer.test_checkpoint import sac_of, zoo

TOLERANCE = 0.05


def by_module(name: str, budget: str) -> tuple[SelectiveCheckpointing, Training]:
    module, inputs = zoo(name)
    options = AnalysisOptions(train=True, precision="fp32", device="cpu", fusion=False,
                              checkpoint_auto=True, checkpoint_budget=budget, strict=True,
                              checkpoint_granularity="module")
    report = run_context(Context(LoadedModel(module, inputs, name, name), options,
                                 lambda _: None))
    training = report.get(Training)
    assert training is not None
    return sac_of(report), training


def test_a_blocks_children_are_its_outermost_modules_that_run_a_forward() -> None:
    container = "torch.nn.modules.container.ModuleList"
    types = {"m.h.0": "Block", "m.h.0.attn": "Attn", "m.h.0.attn.q": "Linear",
             "m.h.0.layer": container, "m.h.0.layer.0": "FF", "m.h.0.layer.0.fc": "Linear",
             "m.h.0.layer.1": "FF", "m.h.0-x": "Other", "m.h.1": "Block"}
    assert children(types, "m.h.0") == ["m.h.0.attn", "m.h.0.layer.0", "m.h.0.layer.1"]


@pytest.mark.parametrize("name", ["tiny_gpt", "llama", pytest.param("t5", marks=pytest.mark.slow)])
def test_the_peak_falls_as_the_budget_tightens_by_module(name: str) -> None:
    """T5 has four groups of alike blocks (the first of encoder and decoder carry the
    position bias): decided per child name, the same children in every block."""
    section, _ = by_module(name, "1TB")
    assert section.granularity == "module" and not section.checkpointed
    curve = section.curve
    assert len(curve) == 10 and curve[0].budget_bytes == section.least_peak_bytes
    for tighter, looser in itertools.pairwise(curve):
        assert tighter.peak_bytes <= looser.peak_bytes
        assert tighter.recompute >= looser.recompute
    assert all(p.fits for p in curve) and len({p.peak_bytes for p in curve}) >= 3


@functools.cache
def _wrapped(name: str, point: int) -> tuple[SelectiveCheckpointing, Training]:
    first, _ = by_module(name, "1TB")
    return by_module(name, str(first.curve[point].budget_bytes))


def _check_real_step(name: str, point: int) -> None:
    section, training = _wrapped(name, point)
    assert section.checkpointed and section.fits and "checkpointed(model.get_submodule(" \
        in section.code
    assert section.fwd_bwd_peak_bytes > training.peak_breakdown.optimizer_phase_bytes
    wrapped = sum(len(p.modules) for p in section.policies)
    assert wrapped > 0 and all(p.saved_ops + len(p.modules) == p.ops for p in section.policies)
    module, inputs = zoo(name)
    measured = measured_step(module, inputs, section.code).step_peak_bytes
    assert section.peak_after_bytes == pytest.approx(measured, rel=TOLERANCE), (
        f"{name}: predicted {section.peak_after_bytes}, measured {measured}")
    assert measured <= section.budget_bytes * (1 + TOLERANCE)
    unwrapped = measured_step(module, inputs, "").step_peak_bytes
    assert measured < unwrapped          # the wrapping ran: the step peaks lower


def test_a_real_step_under_the_emitted_wrapping_peaks_as_predicted() -> None:
    _check_real_step("tiny_gpt", 2)


# Models whose real step misses the prediction by more than TOLERANCE, and why: none.
VERIFIED = ["example", "llama", "gpt2", "qwen2", "phi3", "bert", "distilbert", "vit", "t5",
            "bloom", "opt", "falcon", "gpt_neox"]


@pytest.mark.slow
@pytest.mark.parametrize("name", VERIFIED)
@pytest.mark.parametrize("point", [2, 5])
def test_real_steps_under_the_emitted_wrapping_peak_as_predicted(name: str, point: int) -> None:
    _check_real_step(name, point)


def test_the_granularity_needs_checkpoint_auto() -> None:
    from fxlens.analyzer.core.errors import LoadError
    from fxlens.checks import check_options
    from fxlens.cli.analyze import build_parser

    args = build_parser().parse_args(["m.py", "--train", "--checkpoint", "auto",
                                      "--checkpoint-granularity", "module"])
    assert args.checkpoint_granularity == "module"
    for wrong in (AnalysisOptions(train=True, checkpoint_granularity="module"),
                  AnalysisOptions(train=True, checkpoint_auto=True, device="h100",
                                  checkpoint_granularity="block")):
        with pytest.raises(LoadError, match="--checkpoint-granularity"):
            check_options(wrong)
