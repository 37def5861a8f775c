"""`bench/plan_real_runs.py`: every published layout in bench/plan_runs/runs.json is written
as a strategy fxlens reads, on the run's GPU count, and the table shows both planning modes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fxlens.analyzer.plan.strategy import parse

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import plan_real_runs  # noqa: E402

RUNS = json.loads((BENCH / "plan_runs" / "runs.json").read_text())["runs"]


@pytest.mark.parametrize("run", RUNS, ids=[r["name"] for r in RUNS])
def test_each_layout_is_a_strategy_on_its_gpus(run: dict) -> None:
    strategy, why = plan_real_runs.strategy_of(run)
    if strategy is None:
        assert why
        return
    parsed = parse(strategy, run["gpus"])
    assert parsed.gpus == run["gpus"] and parse(parsed.label, run["gpus"]) == parsed
    if "a2a_overlap" in run["layout"] and run["layout"]["a2a_overlap"]:
        assert parsed.a2a_overlap
    assert parsed.routing == run["layout"].get("routing")


def test_the_table_shows_both_modes_and_their_medians() -> None:
    row = {"name": "r", "gpus": 8, "device": "h100", "measured_step_s": 10.0,
           "strategy": "dp=8", "source": "u"}
    row["eager"] = {"predicted_step_s": 11.0, "error": 0.1, "fits": False, "peak_gib": 90.0}
    row["fused"] = {"predicted_step_s": 9.0, "error": -0.1, "fits": True, "peak_gib": 60.0}
    blackwell = {**row, "name": "b", "device": "gb200",
                 "fused": {**row["fused"], "error": -0.3}}
    table = plan_real_runs.table([row, blackwell, {**row, "name": "s", "skipped": "why"}])
    assert "| [r](u) | 8 H100 | `dp=8` | 10.00 s | 11.00 s (+10%) | no (90.0 GiB) | 9.00 s " \
           "(-10%) | yes (60.0 GiB) |" in table
    assert "eager, all: median absolute error 10% over 2 runs; 0 of 2 fit" in table
    assert "fused, all: median absolute error 20% over 2 runs; 2 of 2 fit" in table
    assert "fused, Hopper: median absolute error 10% over 1 runs" in table
    assert "fused, Blackwell: median absolute error 30% over 1 runs" in table
    assert "not run: why" in table


def _precision_of(run: dict) -> str:
    argv = plan_real_runs.command(run, "dp=1", Path("out.json"), "fused")   # any layout
    return argv[argv.index("--precision") + 1]


def test_a_row_runs_at_the_precision_its_recipe_keeps() -> None:
    """Megatron's bf16 keeps fp32 master weights and moments (`amp-bf16`); a row whose recipe
    keeps none (NeMo Automodel's bf16 weights and bf16 Adam moments) says so and runs as
    `--precision bf16`."""
    from fxlens.cli.analyze_options import PRECISIONS

    automodel = [r for r in RUNS if r["name"].startswith("automodel-")]
    assert automodel and all(_precision_of(r) == "bf16" for r in automodel)
    megatron_bf16 = [r for r in RUNS if r["name"].startswith("mcore-") and r["precision"] == "bf16"]
    assert megatron_bf16 and all(_precision_of(r) == "amp-bf16" for r in megatron_bf16)
    runnable = [r for r in RUNS if r["micro_batch_size"]]
    assert {_precision_of(r) for r in runnable} <= set(PRECISIONS)


def test_a_row_with_a_pipeline_layout_places_its_models_layers_and_mtp() -> None:
    """A row whose recipe states Megatron's pipeline layout plans it (`layout=`), placing
    every decoder layer of its preset; a row whose recipe trains MTP passes `--mtp` (with
    `--mtp-shared` for a repeated layer), and its layout, if any, holds the MTP symbol."""
    from fxlens.analyzer.capture.hf import read_preset
    from fxlens.analyzer.plan.pipeline_layout import resolved

    laid = [r for r in RUNS if r["layout"].get("pipeline_layout")]
    assert laid
    for run in laid:
        parsed = parse(plan_real_runs.strategy_of(run)[0] or "", run["gpus"])
        layers = (run["model"].get("overrides") or {}).get("num_hidden_layers") or \
            read_preset(run["model"]["preset"]).config["num_hidden_layers"]
        stages = resolved(parsed.layout, layers, parsed.pp, parsed.v)
        assert stages is not None and parsed.v == (run["layout"].get("vp") or 1)
        assert sum(stage.count("t") for stage in stages) == layers
        if parsed.layout != "slots":   # slots: MTP rides with the loss, unwritten
            assert ("m" in "".join(stages)) == bool(run["model"].get("mtp"))
    for run in (r for r in RUNS if r["model"].get("mtp")):
        argv = plan_real_runs.command(run, "dp=1", Path("out.json"), "fused")
        assert argv[argv.index("--mtp") + 1] == str(run["model"]["mtp"])
        assert ("--mtp-shared" in argv) == bool(run["model"].get("mtp_shared"))


def test_a_lora_row_fine_tunes_its_recipes_adapters_on_layers_its_preset_has() -> None:
    """A LoRA row passes its recipe's rank and target layers (`--lora R --lora-targets`), each
    target a linear layer of its preset's decoder (Megatron's fused QKV written as the three
    projections), and only LoRA rows do."""
    from fxlens.cli.args import layer_names

    llama_linears = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"}
    lora = [r for r in RUNS if r["model"].get("lora")]
    assert lora and all("-lora-" in r["name"] for r in lora)
    assert not [r for r in RUNS if "-lora-" in r["name"] and not r["model"].get("lora")]
    for run in lora:
        argv = plan_real_runs.command(run, "dp=1", Path("out.json"), "fused")
        assert int(argv[argv.index("--lora") + 1]) == run["model"]["lora"]["rank"] >= 1
        targets = layer_names(argv[argv.index("--lora-targets") + 1])
        assert set(targets) <= llama_linears and {"q_proj", "k_proj", "v_proj"} <= set(targets)
