"""The one pipeline: every pass the options ask for runs, for inference and training alike,
and nothing else is added; the model is captured once per shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.passes import AnalysisError, run_passes
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Findings,
    Fusion,
    KVCache,
    Memory,
    Quant,
    Roofline,
    Training,
)
from fxlens.analyzer.time.validate import RunSettings
from fxlens.api import AnalysisOptions, analyze_loaded
from fxlens.devices import validate
from fxlens.kv_pass import one_token_inputs
from fxlens.pipeline import Context, run_context
from fxlens.rules.hardware import host_cpu
from tests.models import mlp, tiny_gpt

CORE = {"memory", "findings", "fusion"}


def keys(report: Report) -> set[str]:
    return set(report.sections)


def loaded(build: object = tiny_gpt.build, name: str = "tiny_gpt") -> LoadedModel:
    module, inputs = build()  # type: ignore[operator]
    return LoadedModel(module, inputs, name, f"tests/models/{name}.py")


@pytest.mark.parametrize("options, expected", [
    (AnalysisOptions(), CORE),
    (AnalysisOptions(train=True), CORE | {"training"}),
    (AnalysisOptions(train=True, quant=True), CORE | {"training", "quant"}),
    (AnalysisOptions(train=True, kv_cache=True), CORE | {"training", "kv_cache"}),
    (AnalysisOptions(kv_cache=True, device="h100", fused=True),
     CORE | {"kv_cache", "roofline", "inference_fit"}),
    (AnalysisOptions(quant=True, fusion=False), {"memory", "quant"}),
    (AnalysisOptions(prune_target="20%", fusion=False), {"memory", "prune"}),
    (AnalysisOptions(train=True, prune=True, fusion=False), {"memory", "training", "prune"}),
    (AnalysisOptions(train=True, plan=True, strategy="fsdp", gpus=2, fusion=False),
     {"memory", "training", "plan"}),
])
def test_exactly_the_sections_asked_for(options: AnalysisOptions, expected: set[str]) -> None:
    assert keys(analyze_loaded(loaded(), options)) == expected


def test_training_quant_scores_the_inference_forward_once() -> None:
    captured: list[str] = []
    ctx = Context(loaded(), AnalysisOptions(train=True, quant=True, kv_cache=True),
                  on_step=captured.append)
    report = run_context(ctx)
    assert report.require(Training).step_flops > report.totals.flops // 2
    assert report.require(Quant).layers and report.require(KVCache).total_bytes > 0
    assert set(ctx.graphs) == {"forward"}       # KV and quant share one forward capture
    assert report.require(Memory).peak_by_phase.keys() >= {"forward", "backward"}


def test_fused_roofline_reads_the_fusion_plan() -> None:
    report = analyze_loaded(loaded(mlp.build, "mlp"),
                            AnalysisOptions(device="h100", fused=True))
    assert len(report.require(Roofline).nodes) == report.require(Fusion).kernels_fused
    assert report.require(Findings).items[0].saved_s is not None   # device bandwidth used


def test_fused_without_fusion_is_an_error_not_a_silent_skip() -> None:
    with pytest.raises(Exception, match="--fused needs the fusion analysis"):
        analyze_loaded(loaded(mlp.build, "mlp"),
                       AnalysisOptions(device="h100", fused=True, fusion=False))


def test_a_pass_whose_needs_are_missing_names_both() -> None:
    class Needy:
        name, provides, needs = "needy", (Quant,), (Roofline,)

        def wanted(self, options: object) -> bool:
            return True

        def run(self, context: object, report: Report) -> tuple[Quant, ...]:
            raise AssertionError("must not run")

    report = analyze_loaded(loaded(mlp.build, "mlp"), AnalysisOptions(fusion=False))
    with pytest.raises(AnalysisError, match="needy needs the roofline section"):
        run_passes([Needy()], None, None, report)


def test_validate_runs_the_same_pipeline() -> None:
    report = validate(loaded(mlp.build, "mlp"), host_cpu(), RunSettings("cpu", 0, 1))
    assert keys(report) == {"memory", "roofline", "inference_fit", "validation"}


def test_validate_predicts_with_a_profile_that_is_not_in_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A calibrated profile is named after its device ("cuda"); given as a spec, it must not be
    looked up again by that name (there is no cached profile of it here)."""
    import dataclasses

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    profile = dataclasses.replace(host_cpu(), name="cuda", calibrated=True)
    report = validate(loaded(mlp.build, "mlp"), profile, RunSettings("cpu", 0, 1))
    assert report.require(Roofline).device.name == "cuda"


def test_one_token_inputs_cut_only_the_sequence() -> None:
    import torch

    ids, image = torch.zeros(2, 7, dtype=torch.long), torch.zeros(2, 3, 7, 7)
    cut = one_token_inputs({"input_ids": ids, "pixels": image}, seq_len=7)
    assert isinstance(cut, dict)
    assert cut["input_ids"].shape == (2, 1) and cut["pixels"].shape == (2, 3, 7, 7)


def test_each_attention_node_says_which_convention_counted_it() -> None:
    report = analyze_loaded(loaded(), AnalysisOptions(fusion=False))
    attention = [n for n in report.nodes if "scaled_dot_product_attention" in n.target]
    assert attention and all(n.note.startswith("causal") for n in attention)
    assert all(n.note == "" for n in report.nodes if n not in attention and n.flops == 0)
