"""``--packed L``: sequences packed from samples of L tokens, attention within each sample
(`fxlens.analyzer.capture.packed`), against closed forms: the samples' offsets, the causal
scores of the samples in place of the rows', and nothing else changed."""

from __future__ import annotations

from typing import Any

import pytest

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.capture.packed import sample_starts
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Plan, Training
from fxlens.checks import check_options
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.rules.attention import Attn, backward_flops, causal_scores, forward_flops

# a small Llama with grouped-query attention (4 query heads of 64, 2 key/value heads)
HEADS, HEAD_DIM, LAYERS = 4, 64, 2
TINY = {"num_hidden_layers": "2", "hidden_size": "256", "intermediate_size": "512",
        "num_attention_heads": "4", "num_key_value_heads": "2", "vocab_size": "1024"}
ATTENTION = ("aten._flash_attention", "aten._scaled_dot_product_flash_attention",
             "aten._efficient_attention", "aten._scaled_dot_product_efficient_attention")


def step(tokens: int, packed: int = 0, batch: int = 1) -> tuple[Report, tuple[str, ...]]:
    loaded = load_preset("llama-3.1-8b", TINY, batch, tokens, dtype="bfloat16")
    ctx = Context(loaded, AnalysisOptions(train=True, packed=packed, fusion=False,
                                          device="h100"), lambda _: None)
    report = run_context(ctx)
    assert ctx.step is not None
    return report, ctx.step.graph.notes


def flops(report: Report, phase: str, attention: bool) -> int:
    return sum(n.flops for n in report.nodes if n.phase == phase
               and n.target.startswith(ATTENTION) == attention)


def test_samples_start_every_l_tokens_of_each_row_the_last_one_shorter() -> None:
    assert sample_starts(2, 10, 4) == [0, 4, 8, 10, 14, 18, 20]
    assert sample_starts(1, 8, 4) == [0, 4, 8]


@pytest.mark.parametrize(("tokens", "sample", "batch"), [(64, 16, 1), (128, 32, 2)])
def test_attention_runs_within_samples_and_nothing_else_changes(tokens: int, sample: int,
                                                                batch: int) -> None:
    whole, _ = step(tokens, batch=batch)
    packed, notes = step(tokens, sample, batch)
    # per layer, one call over the B·T/L samples of L tokens, each query head's causal scores
    samples = Attn(batch * HEADS * tokens // sample, sample, HEAD_DIM, HEAD_DIM,
                   causal_scores(sample, sample))
    rows = Attn(batch * HEADS, tokens, HEAD_DIM, HEAD_DIM, causal_scores(tokens, tokens))
    assert flops(whole, "forward", True) == LAYERS * forward_flops(rows)
    assert flops(packed, "forward", True) == LAYERS * forward_flops(samples)
    assert flops(packed, "backward", True) == LAYERS * backward_flops(samples)
    # T/L samples of L(L+1)/2 scores against one row of T(T+1)/2: (L+1)/(T+1) of the work
    assert flops(packed, "forward", True) / flops(whole, "forward", True) == pytest.approx(
        (sample + 1) / (tokens + 1))
    for phase in ("forward", "backward"):
        assert flops(packed, phase, False) == flops(whole, phase, False)
    assert any(n.target.startswith("aten._flash_attention_forward") for n in packed.nodes)
    assert "attention within samples of" in " ".join(notes)
    assert packed.require(Training).recipe.endswith(f"packed samples of {sample} tokens")


def test_mla_values_of_their_own_head_dimension_run_the_memory_efficient_varlen_kernel() -> None:
    # DeepSeek-V3's queries and keys of 192, values of 128 (the zoo's small sizes alike): the
    # flash kernel takes one head dimension, the memory-efficient one takes both
    from fxlens.analyzer.core.loaded import LoadedModel
    from tests.models.hf_build import tokens as token_ids
    from tests.models.hf_zoo import ZOO

    def run(packed: int) -> Report:
        module, _ = ZOO["deepseek_v3"]()
        inputs = {"input_ids": token_ids(length=64), "labels": token_ids(length=64)}
        ctx = Context(LoadedModel(module, inputs, "ds", "ds"),
                      AnalysisOptions(train=True, packed=packed, fusion=False, device="h100"),
                      lambda _: None)
        return run_context(ctx)

    whole, packed = run(0), run(16)
    assert any(n.target.startswith("aten._efficient_attention_forward") for n in packed.nodes)
    assert flops(packed, "forward", True) / flops(whole, "forward", True) == pytest.approx(
        17 / 65)


def test_samples_as_long_as_the_sequence_leave_attention_as_captured_and_say_so() -> None:
    whole, _ = step(64)
    same, notes = step(64, 64)
    assert flops(same, "forward", True) == flops(whole, "forward", True)
    assert any("none ran within samples" in note for note in notes)


@pytest.mark.parametrize(("settings", "says"), [
    ({"train": True, "packed": -1}, "at least 1"),
    ({"train": True, "packed": True}, "at least 1"),
    ({"packed": 512}, "add --train"),
])
def test_packed_options_that_cannot_work_are_refused(settings: dict[str, Any],
                                                     says: str) -> None:
    with pytest.raises(LoadError, match=says):
        check_options(AnalysisOptions(**settings))


def test_the_cli_and_a_sweep_take_packed() -> None:
    from fxlens.cli.analyze import build_parser
    from fxlens.sweep import Point, SweepSpec

    assert build_parser().parse_args(["hf:gpt2", "--train", "--packed", "512"]).packed == 512
    with pytest.raises(SystemExit):
        build_parser().parse_args(["hf:gpt2", "--packed", "0"])
    assert SweepSpec(train=True, packed=256).options(Point("hf:gpt2")).packed == 256


def test_context_parallelism_passes_the_samples_keys_and_values_round_the_ring() -> None:
    # the varlen kernel is attention to the plan: under cp its K/V go round the ring as the
    # rows' would (TE's context parallelism splits each packed sample over the ranks)
    def ring(packed: int) -> Any:
        loaded = load_preset("llama-3.1-8b", TINY, 1, 64, dtype="bfloat16")
        options = AnalysisOptions(train=True, plan=True, strategy="dp=1,cp=2", gpus=2,
                                  packed=packed, fusion=False, device="h100")
        plan = run_context(Context(loaded, options, lambda _: None)).require(Plan)
        return next(c for c in plan.layouts[0].collectives if c.cause.startswith("ring"))

    whole, packed = ring(0), ring(16)
    assert (packed.bytes, packed.calls) == (whole.bytes, whole.calls)
