"""``--lora R``: LoRA adapters fine-tuned on a frozen model (`fxlens.analyzer.capture.lora`),
against closed forms: the adapters' parameters, the step's FLOPs without the weights'
gradients, state for the adapters only, and Megatron's tensor-parallel split of each adapter
(`fxlens.analyzer.plan.tensor_split.low_rank_bypasses`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.capture.lora import lora_attached, targets_of
from fxlens.analyzer.capture.nf4 import dequantize, nf4_bytes
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.sections import Training
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.checks import MAX_LORA_RANK, check_options
from fxlens.pipeline import AnalysisOptions, Context, run_context
from fxlens.plan_pass import plan_facts
from tests.analyzer.test_plan import H100

H, FFN, KV, VOCAB, LAYERS, TOKENS, RANK = 256, 512, 128, 1024, 2, 64, 8
TINY = {"num_hidden_layers": str(LAYERS), "hidden_size": str(H), "intermediate_size": str(FFN),
        "num_attention_heads": "4", "num_key_value_heads": "2", "vocab_size": str(VOCAB)}
# (in, out) of each of a Llama layer's linear layers
SHAPES = {"q_proj": (H, H), "k_proj": (H, KV), "v_proj": (H, KV), "o_proj": (H, H),
          "gate_proj": (H, FFN), "up_proj": (H, FFN), "down_proj": (FFN, H)}


def llama() -> Any:
    return load_preset("llama-3.1-8b", TINY, 1, TOKENS, dtype="bfloat16")


def run(lora: int = 0, targets: tuple[str, ...] = (), **settings: Any) -> tuple[Context, Any]:
    ctx = Context(llama(), AnalysisOptions(train=True, lora=lora, lora_targets=targets,
                                           fusion=False, **settings), lambda _: None)
    return ctx, run_context(ctx)


def adapter_params(names: tuple[str, ...] = tuple(SHAPES)) -> int:
    return LAYERS * sum(RANK * (SHAPES[n][0] + SHAPES[n][1]) for n in names)


def test_adapters_are_rank_r_pairs_and_the_model_is_left_as_it_was() -> None:
    module = llama().module
    names = [n for n, _ in module.named_modules()]
    trainable = {n: p.requires_grad for n, p in module.named_parameters()}
    with lora_attached(module, RANK) as model:
        added = sum(p.numel() for n, p in model.named_parameters() if ".lora." in n)
        assert added == adapter_params()                      # all linear layers but the head
        assert {n for n, p in model.named_parameters() if p.requires_grad} == {
            n for n, _ in model.named_parameters() if ".lora." in n}
    assert [n for n, _ in module.named_modules()] == names
    assert {n: p.requires_grad for n, p in module.named_parameters()} == trainable
    assert not any(m._forward_hooks for m in module.modules())


def test_the_step_trains_the_adapters_only() -> None:
    _, full = run()
    _, lora = run(RANK)
    full_t, lora_t = full.require(Training), lora.require(Training)
    assert lora_t.states.trainable_numel == adapter_params()
    assert lora_t.states.grad_bytes == 2 * adapter_params()                 # bf16 gradients
    assert lora_t.recipe.endswith(f"LoRA r{RANK} on {LAYERS * len(SHAPES)} layers, "
                                  "weights frozen")
    # forward: the model's own plus 2·T·R·(in + out) per adapter, and its scale and sum
    gemms = 2 * TOKENS * adapter_params()
    assert gemms <= lora_t.forward_flops - full_t.forward_flops <= 1.5 * gemms
    # backward: no weight gradient of the frozen weights, which every linear layer's
    # 2·T·in·out of the full step had
    frozen_wgrad = 2 * TOKENS * LAYERS * sum(i * o for i, o in SHAPES.values())
    assert lora_t.backward_flops < full_t.backward_flops - 0.9 * frozen_wgrad


def test_targets_are_matched_by_their_last_name() -> None:
    _, report = run(RANK, ("q_proj", "v_proj"))
    training = report.require(Training)
    assert training.states.trainable_numel == adapter_params(("q_proj", "v_proj"))
    assert f"on {2 * LAYERS} layers" in training.recipe


def test_an_unknown_target_names_the_models_layers() -> None:
    module = llama().module
    with pytest.raises(LoadError, match="no linear layer named 'qkv_proj'.*q_proj"):
        targets_of(module, ["qkv_proj"])


def test_a_rank_as_wide_as_a_layer_is_refused() -> None:
    module = nn.Sequential(nn.Linear(16, 8))
    with pytest.raises(LoadError, match="not low rank for any"), lora_attached(module, 8):
        pass
    assert not any(p.requires_grad is False for p in module.parameters())


@pytest.mark.parametrize(("settings", "says"), [
    ({"train": True, "lora": -1}, "1 to"),
    ({"train": True, "lora": MAX_LORA_RANK + 1}, "1 to"),
    ({"train": True, "lora": True}, "1 to"),
    ({"lora": 8}, "add --train"),
    ({"train": True, "lora_targets": ("q_proj",)}, "add --lora R"),
    ({"train": True, "lora": 8, "lora_targets": ("q_proj", "v-proj")}, "not a layer name"),
    ({"train": True, "lora": 8, "lora_targets": ("mlp..down_proj",)}, "not a layer name"),
])
def test_lora_options_that_cannot_work_are_refused(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(LoadError, match=says):
        check_options(AnalysisOptions(**settings))


def test_the_cli_reads_targets_and_refuses_a_bad_rank_at_once() -> None:
    from fxlens.cli.analyze import build_parser

    args = build_parser().parse_args(["hf:gpt2", "--train", "--lora", "16",
                                      "--lora-targets", "q_proj, v_proj,q_proj"])
    assert (args.lora, args.lora_targets) == (16, ("q_proj", "v_proj"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["hf:gpt2", "--lora", "0"])


def facts(lora: int) -> ModelFacts:
    ctx, report = run(lora, plan=True, strategy="tp=2", gpus=2)
    return plan_facts(ctx, report, H100)


def test_a_row_layers_adapter_reduces_its_rank_not_the_hidden_size() -> None:
    # Megatron's split: beside a column layer (q, k, v, gate, up) the adapter's B splits by
    # columns and its A is whole; beside a row layer (o, down) A splits by rows and all-reduces
    # T·R values, B is whole. Without that, B would read as a row of its own: T·H more.
    plain, adapted = facts(0), facts(RANK)
    blocks = [(p, a) for p, a in zip(plain.units, adapted.units, strict=True)
              if p.name not in ("pre", "post")]
    assert len(blocks) == LAYERS
    for p, a in blocks:
        assert (p.row_gemms, a.row_gemms) == (2, 4)
        assert a.tp_reduces == p.tp_reduces + 2
        assert a.tp_reduce_bytes - p.tp_reduce_bytes == 2 * TOKENS * RANK * 2     # bf16


def test_a_sweep_passes_lora_on_and_checks_it_before_any_point() -> None:
    from fxlens.cli.sweep import build_parser, points_and_spec
    from fxlens.sweep import Point, SweepSpec

    options = SweepSpec(train=True, lora=16, lora_targets=("q_proj",)).options(Point("hf:gpt2"))
    assert (options.lora, options.lora_targets) == (16, ("q_proj",))
    args = build_parser().parse_args(["hf:gpt2", "--lora", "16"])
    with pytest.raises(LoadError, match="add --train"):
        points_and_spec(args)


def test_a_diff_across_recipes_says_the_recipe_differs() -> None:
    from fxlens.analyzer.review.diff import compare

    _, full = run()
    _, lora = run(RANK)
    notes = compare(full, lora).notes
    assert any(n.startswith("training recipe differs: amp-bf16 · adamw (old) vs ")
               and f"LoRA r{RANK}" in n for n in notes)
    assert not any("recipe" in n for n in compare(full, full).notes)


# --- QLoRA: the frozen linear weights in NF4 (fxlens.analyzer.capture.nf4) ---------------------


def test_nf4_takes_the_qlora_papers_4_127_bits_per_weight() -> None:
    n = 4096 * 4096       # codes n/2, one 8-bit absmax per 64, one fp32 scale per 256 of them
    assert nf4_bytes(n) == n // 2 + n // 64 + 4 * (n // 64 // 256)
    assert round(8 * nf4_bytes(n) / n, 3) == 4.127


def test_a_qlora_step_holds_nf4_weights_and_dequantizes_them_at_each_use() -> None:
    module = llama().module
    names = [n for n, _ in module.named_parameters()]
    ctx, qlora = run(RANK, lora_base="nf4")
    _, lora = run(RANK)
    linears = LAYERS * len(SHAPES)
    numels = [i * o for i, o in SHAPES.values()] * LAYERS
    states = qlora.require(Training).states
    assert states.buffer_bytes - lora.require(Training).states.buffer_bytes == sum(
        nf4_bytes(n) for n in numels)
    assert states.frozen_numel == lora.require(Training).states.frozen_numel - sum(numels)
    assert states.trainable_numel == adapter_params()
    dequants = [n for n in qlora.nodes if n.target.startswith("fxlens_nf4.dequantize")]
    forward = [n for n in dequants if n.phase == "forward"]
    assert len(forward) == linears
    # the backward dequantizes again for each input gradient it computes: every layer's but
    # the first layer's q, k and v projections, whose input (the normed embedding) needs none
    assert len(dequants) - linears == linears - 3
    assert sorted(n.bytes_read + n.bytes_written for n in forward) == sorted(
        nf4_bytes(n) + 2 * n for n in numels)
    assert qlora.require(Training).recipe.endswith("NF4 weights frozen (QLoRA)")
    assert any("held in NF4" in note for note in ctx.step.graph.notes)   # type: ignore[union-attr]
    # the user's module is left as it was
    restored = ctx.loaded.module
    assert [n for n, _ in restored.named_parameters()] == names
    assert not any(n.endswith("weight_nf4") for n, _ in restored.named_buffers())
    assert not any("forward" in vars(m) for m in restored.modules())


def test_the_dequantize_op_runs_on_real_tensors() -> None:
    codes = torch.randint(0, 256, (4 * 64 // 2,), dtype=torch.uint8)
    absmax = torch.randint(0, 128, (4,), dtype=torch.uint8)
    scale = torch.ones(1).view(torch.int32)           # a float32 scale held as its bits
    weight = dequantize(codes, absmax, scale, 4, 64)
    assert weight.shape == (4, 64) and weight.dtype == torch.bfloat16
    assert float(weight.abs().max()) <= 1.0


def test_lora_base_without_lora_or_unknown_is_refused() -> None:
    with pytest.raises(LoadError, match="add --lora R"):
        check_options(AnalysisOptions(train=True, lora_base="nf4"))
    with pytest.raises(LoadError, match="one of nf4"):
        check_options(AnalysisOptions(train=True, lora=8, lora_base="int3"))


def test_all_linear_leaves_a_layer_narrower_than_the_rank_and_a_named_one_is_refused() -> None:
    # Mixtral-like: a router with 8 outputs beside 64-wide projections
    model = nn.ModuleDict({"proj": nn.Linear(64, 64), "gate": nn.Linear(64, 8)})
    with lora_attached(model, 16) as adapted:
        assert hasattr(adapted["proj"], "lora") and not hasattr(adapted["gate"], "lora")
    with pytest.raises(LoadError, match="not low rank for gate"), \
            lora_attached(model, 16, ["gate"]):
        pass


def test_gpt2s_conv1d_layers_are_linear_layers_to_adapt_and_to_quantize() -> None:
    # transformers' Conv1D stores its weight (in, out): c_attn 768 → 2304, c_proj 768 → 768,
    # c_fc 768 → 3072, the MLP's c_proj 3072 → 768 (PEFT adapts them as linear layers)
    loaded = load_preset("gpt2", {"n_layer": "2"}, 1, 64, dtype="bfloat16")
    layer = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
    for base in (None, "nf4"):
        ctx = Context(loaded, AnalysisOptions(train=True, lora=8, lora_base=base,
                                              fusion=False), lambda _: None)
        training = run_context(ctx).require(Training)
        assert training.lora_layers == 2 * len(layer)
        assert training.states.trainable_numel == 2 * sum(8 * (i + o) for i, o in layer)
    assert training.states.buffer_bytes >= 2 * sum(nf4_bytes(i * o) for i, o in layer)


def test_fp8_base_weights_take_one_byte_and_the_backward_saves_them_not_their_cast() -> None:
    # MLPerf's Llama 2 70B LoRA holds the frozen weights in FP8 alone (fp8_model_init)
    module = llama().module
    names = [(n, p.dtype) for n, p in module.named_parameters()]
    ctx, fp8 = run(RANK, lora_base="fp8", precision="fp8")
    _, plain = run(RANK, precision="fp8")
    numel = LAYERS * sum(i * o for i, o in SHAPES.values())
    before, after = plain.require(Training), fp8.require(Training)
    assert before.states.weights_bytes - after.states.weights_bytes == 2 * numel   # 3 B → 1 B
    # the backward keeps each weight's FP8 bytes, where autograd would keep its bf16 cast
    assert after.saved_activation_bytes == before.saved_activation_bytes
    assert after.recipe.endswith("FP8 weights frozen")
    assert [(n, p.dtype) for n, p in ctx.loaded.module.named_parameters()] == names


def test_a_dotted_target_names_the_tail_of_a_path_as_peft_matches_it() -> None:
    module = llama().module
    down = [path for path, _ in targets_of(module, ["mlp.down_proj"])]
    assert down == [f"model.layers.{i}.mlp.down_proj" for i in range(LAYERS)]
    assert [p for p, _ in targets_of(module, ["layers.1.self_attn.q_proj"])] == [
        "model.layers.1.self_attn.q_proj"]
    with pytest.raises(LoadError, match="no linear layer named 'attn.down_proj'"):
        targets_of(module, ["attn.down_proj"])


@pytest.mark.parametrize("base", ["nf4", "fp8"])
def test_a_float32_layer_with_a_bias_runs_on_its_stored_base(base: str) -> None:
    # bitsandbytes casts the input and the bias to its compute dtype (bf16) and the output
    # back; the FP8 weight is cast to the input's dtype
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    with lora_attached(model, 4, base=base) as adapted:
        out = adapted(torch.randn(2, 64))
        out.sum().backward()
        assert out.dtype == torch.float32
    assert [type(p) for p in model.parameters()] == [nn.Parameter] * 4
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_model_code_that_reads_a_quantized_layers_weight_dtype_still_records() -> None:
    # T5's feed-forward reads `wo.weight.dtype` and casts its hidden states to it: an NF4
    # layer answers bf16 (bitsandbytes' parameter does), and the float32 adapter takes its
    # input cast to its own dtype, as PEFT casts it
    loaded = load_preset("t5-small", {"num_layers": "1", "num_decoder_layers": "1"}, 1, 32)
    ctx = Context(loaded, AnalysisOptions(train=True, lora=8, lora_base="nf4", fusion=False),
                  lambda _: None)
    training = run_context(ctx).require(Training)
    assert training.lora_layers > 0 and training.recipe.endswith("NF4 weights frozen (QLoRA)")
    wo = loaded.module.get_submodule("encoder.block.0.layer.1.DenseReluDense.wo")
    assert isinstance(wo.weight, nn.Parameter) and wo.weight.dtype == torch.float32


def test_qlora_layers_split_under_tensor_parallelism_as_their_bf16_selves() -> None:
    # the GEMM after an NF4 dequantization is a weight GEMM (its weight the stored codes):
    # the same row/column pairs, adapters beside them, as the bf16 layers
    def units(base: str | None) -> list[tuple[int, int, int]]:
        ctx, report = run(RANK, lora_base=base, plan=True, strategy="tp=2", gpus=2)
        facts = plan_facts(ctx, report, H100)
        return [(u.row_gemms, u.tp_reduces, u.tp_reduce_bytes) for u in facts.units
                if u.name not in ("pre", "post")]

    bf16 = units(None)
    assert units("nf4") == bf16 and [rows for rows, _, _ in bf16] == [4] * LAYERS
