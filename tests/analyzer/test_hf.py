"""`transformers` presets: built on meta from shipped configs, exportable, errors that help."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
import torch

from fxlens.analyzer.capture import hf
from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.hf import (
    InputKind,
    load_preset,
    parse_overrides,
    preset_names,
    read_preset,
)
from fxlens.analyzer.core.errors import FxlensError, LoadError
from fxlens.analyzer.cost.engine import analyze
from fxlens.rules import load_rules

pytest.importorskip("transformers")

REQUIRED = {
    "gpt2", "gpt2-xl", "bert-base", "t5-small", "llama-2-7b", "llama-3-8b", "llama-3-70b",
    "mistral-7b", "mixtral-8x7b", "qwen2-7b", "whisper-tiny", "vit-base",
    "deepseek-v3", "qwen3-30b-a3b", "gemma-3-1b", "phi-3-mini", "llama-3.1-405b",
}

# Parameter counts of the published checkpoints (tied embeddings counted once): a wrong
# architecture field almost always changes them.
PUBLISHED_PARAMS = {
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "bert-base": 109_514_298,          # BertForMaskedLM: BertModel without pooler + MLM head
    "t5-small": 60_506_624,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3-8b": 8_030_261_248,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    # derived by hand from its config.json (56 layers of 8 experts, hidden 6,144, vocab
    # 32,000; the model card's 141 B)
    "mixtral-8x22b": 140_620_634_112,
    "qwen2-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
    "whisper-tiny": 37_760_640,
    "vit-base": 86_567_656,
    "llama-3.1-405b": 405_853_388_800,
    "deepseek-v3": 671_026_404_352,    # the main model; the released 685 B add the MTP layer
    "qwen3-30b-a3b": 30_532_122_624,
    # Qwen/Qwen3-235B-A22B's model.safetensors.index.json: total_size 470,187,269,120 bytes
    # of bf16 weights
    "qwen3-235b-a22b": 235_093_634_560,
    "phi-3-mini": 3_821_079_552,
    "gemma-3-1b": 999_885_952,         # tied embeddings
    # the main models, derived by hand from their config.json (the published 81.3 B of
    # Qwen3-Next adds its MTP layer); GPT-OSS's model card gives 116.83 B
    "qwen3-next-80b-a3b": 79_674_391_296,
    "gpt-oss-120b": 116_829_156_672,
    # derived by hand from their config.json: Kimi K2 (DeepSeek-V3's layout, 384 experts, 64
    # heads, one dense layer; the model card's "1T total"), Nemotron-3 Nano (23 Mamba-2, 23
    # MoE and 6 attention layers; the model card's 31.6 B)
    "kimi-k2": 1_026_408_209_408,
    "nemotron-3-nano-30b-a3b": 31_577_937_344,
    # Megatron-Bridge's verification card (examples/model_verification_cards/gpt-oss-20b):
    # "all 20,914,757,184 parameters" of unsloth/gpt-oss-20b-BF16 (the model card's 21 B)
    "gpt-oss-20b": 20_914_757_184,
    # the main models, without their MTP layer (transformers builds none) and without the
    # FP32 router correction biases (buffers in transformers). Nemotron-3 Super: Megatron-
    # Bridge's verification card (nemotron-3-super-120b-a12b) counts 123,611,033,088 elements
    # in the BF16 checkpoint; less 41 biases × 512 and the MTP layer's 2,942,324,736 (its
    # attention + LatentMoE block, eh_proj and norms) leaves these 120.67 B (the name's 120 B).
    # Nemotron-3 Ultra: derived by hand from its config.json (48 Mamba-2, 48 LatentMoE and 12
    # attention layers, hidden 8,192); Megatron-Bridge's docs/models/nemotron/nemotron3-ultra.md
    # give "550B total" (with the MTP layer's 11.2 B it would be 560.5 B).
    "nemotron-3-super-120b-a12b": 120_668_687_360,
    "nemotron-3-ultra-550b-a55b": 549_308_968_960,
    # derived by hand from NeMo's configs (the NeMo-Framework-Launcher yaml each preset names;
    # GPT-3 with the GPT-2 vocabulary of 50,257, tied): GPT-3 175B (the GPT-3 paper's 175.0 B),
    # Nemotron-4 15B (its report's 3.2 B embedding + 12.5 B other parameters), Nemotron-4 340B
    # (its report's 340 B; heads of 192), NeMo's Nemotron-8B (Nemotron-3 8B) and -22B
    "gpt3-175b": 174_604_259_328,
    "gpt3-20b": 20_256_221_184,
    "gpt3-5b": 5_047_365_632,
    "nemotron-4-340b": 341_029_195_776,
    "nemotron-4-15b": 15_628_775_424,
    "nemotron-8b": 8_540_135_424,
    "nemotron-22b": 21_266_116_608,
    "bloom-176b": 176_247_271_424,     # bigscience/bloom's model card: 176,247,271,424
}

# SDPA calls per forward: one per attention module (encoder-decoders add cross-attention).
# Qwen3-Next: one softmax-attention layer in four (the others gated DeltaNet); GPT-OSS's
# attention with sinks is captured as FlashAttention's kernel (`capture/hf_sinks.py`): none.
# Nemotron-3 Nano: 6 attention layers of 52 (23 Mamba-2, 23 MoE); Super 8 of 88 (40 and 40);
# Ultra 12 of 108 (48 and 48). BLOOM's ALiBi attention runs transformers' eager matmuls: none.
SDPA_CALLS = {"t5-small": 3 * 6, "whisper-tiny": 3 * 4, "qwen3-next-80b-a3b": 1,
              "gpt-oss-120b": 0, "gpt-oss-20b": 0, "nemotron-3-nano-30b-a3b": 6,
              "nemotron-3-super-120b-a12b": 8, "nemotron-3-ultra-550b-a55b": 12,
              "bloom-176b": 0}


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_every_required_preset_ships() -> None:
    assert set(preset_names()) >= REQUIRED
    assert set(PUBLISHED_PARAMS) == set(preset_names()), "add the published count of new presets"


# Family names users ask for (issue 19), each an alias of one shipped preset.
REQUIRED_ALIASES = {"qwen3-moe": "qwen3-30b-a3b", "gemma-3": "gemma-3-1b",
                    "phi-3": "phi-3-mini", "llama-3.3-70b": "llama-3.1-70b",
                    "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b", "bloom": "bloom-176b",
                    "nemotron-4": "nemotron-4-340b"}


def test_family_aliases_name_shipped_presets_and_shadow_none() -> None:
    assert dict(hf.ALIASES) == REQUIRED_ALIASES
    assert set(hf.ALIASES.values()) <= set(preset_names())
    assert not set(hf.ALIASES) & set(preset_names())


@pytest.mark.parametrize("alias", sorted(REQUIRED_ALIASES))
def test_an_alias_builds_its_preset_and_says_so(alias: str) -> None:
    target = REQUIRED_ALIASES[alias]
    assert read_preset(alias) == read_preset(target)
    loaded = load_preset(alias, {"num_hidden_layers": "1"}, seq_len=8)
    assert loaded.name == target
    assert loaded.source.startswith(f"preset {alias} → {target}: config of ")
    direct = load_preset(target, {"num_hidden_layers": "1"}, seq_len=8).module
    assert loaded.module.config.to_dict() == direct.config.to_dict()
    assert n_params(loaded.module) == n_params(direct)


@pytest.mark.parametrize("name", preset_names())
def test_preset_file_is_well_formed(name: str) -> None:
    raw = json.loads((hf.PRESET_DIR / f"{name}.json").read_text())
    preset = read_preset(name)
    assert "/" in preset.source, "source: the hub id or repository path of the published config"
    family = preset.config_class.removesuffix("Config").removesuffix("Text")
    assert preset.model_class.startswith(family)
    assert set(raw) <= {"source", "config_class", "model_class", "input_kind", "dtype",
                        "attention", "inputs", "config"}
    if preset.input_kind is not InputKind.IMAGE:
        assert raw["config"]["use_cache"] is False


@pytest.mark.parametrize("name", ["gpt2", "llama-2-7b", "llama-3-70b"])
def test_builds_on_meta_without_allocating(name: str) -> None:
    loaded = load_preset(name)
    assert not loaded.module.training
    for tensor_name, tensor in [*loaded.module.named_parameters(), *loaded.module.named_buffers()]:
        assert tensor.device.type == "meta", f"{tensor_name} holds real memory"
    assert all(t.device.type == "meta" for t in loaded.inputs.values())
    assert loaded.name == name and read_preset(name).source in loaded.source


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_count_matches_published_checkpoint(name: str) -> None:
    assert n_params(load_preset(name).module) == PUBLISHED_PARAMS[name]


def test_attention_is_sdpa_and_cache_off() -> None:
    config = load_preset("llama-3-8b").module.config
    assert config._attn_implementation == "sdpa"
    assert config.use_cache is False


def test_dtype_defaults_to_published_and_can_be_overridden() -> None:
    llama = load_preset("llama-3-8b").module
    assert {p.dtype for p in llama.parameters()} == {torch.bfloat16}
    # RoPE frequencies stay float32, as from_pretrained leaves them
    assert llama.model.rotary_emb.inv_freq.dtype == torch.float32
    gpt2 = load_preset("gpt2", dtype="float16").module
    assert {p.dtype for p in gpt2.parameters()} == {torch.float16}
    with pytest.raises(LoadError, match="floating"):
        load_preset("gpt2", dtype="int8")


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("gpt2", {"batch": 3, "seq_len": 7}, {"input_ids": ((3, 7), torch.int64)}),
        ("t5-small", {"seq_len": 9},
         {"input_ids": ((1, 9), torch.int64), "decoder_input_ids": ((1, 9), torch.int64)}),
        ("vit-base", {"batch": 2, "image_size": 384},
         {"pixel_values": ((2, 3, 384, 384), torch.float32)}),
        ("whisper-tiny", {"seq_len": 5},
         {"input_features": ((1, 80, 3000), torch.float32),
          "decoder_input_ids": ((1, 5), torch.int64)}),
        ("mistral-7b", {}, {"input_ids": ((1, 4096), torch.int64)}),
    ],
)
def test_example_inputs_by_kind(name: str, kwargs: dict[str, Any], expected: dict) -> None:
    inputs = load_preset(name, **kwargs).inputs
    assert {k: (tuple(v.shape), v.dtype) for k, v in inputs.items()} == expected


def test_overrides_parse_as_json_else_string() -> None:
    parsed = parse_overrides({"a": "2", "b": "1e6", "c": "true", "d": "null", "e": "gelu",
                              "f": "False", "g": "[1, 2]", "h": 3})
    assert parsed == {"a": 2, "b": 1e6, "c": True, "d": None, "e": "gelu", "f": False,
                      "g": [1, 2], "h": 3}


def test_overrides_change_the_architecture() -> None:
    loaded = load_preset("llama-3-8b", {"num_hidden_layers": "2", "rope_theta": "1e6"})
    assert len(loaded.module.model.layers) == 2
    assert loaded.module.config.rope_parameters["rope_theta"] == 1e6
    gpt2 = load_preset("gpt2", {"hidden_size": "256", "n_head": "4"}).module  # an alias
    assert gpt2.config.n_embd == 256


def test_unknown_override_key_names_it_and_suggests() -> None:
    with pytest.raises(LoadError, match=r"num_layers.*did you mean num_hidden_layers"):
        load_preset("llama-3-8b", {"num_layers": "2"})


def test_invalid_override_value_is_a_load_error() -> None:
    with pytest.raises(LoadError, match="hidden_size"):
        load_preset("llama-3-8b", {"hidden_size": "big"})
    with pytest.raises(LoadError, match="multiple of the number of attention heads"):
        load_preset("llama-3-8b", {"num_attention_heads": "7"})


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(LoadError, match="unknown preset 'llama-9'") as info:
        load_preset("llama-9")
    assert all(name in str(info.value) for name in REQUIRED)
    assert all(f"{alias} ({preset})" in str(info.value)
               for alias, preset in REQUIRED_ALIASES.items())


def test_seq_len_beyond_learned_positions_is_an_error() -> None:
    with pytest.raises(LoadError, match="max_position_embeddings"):
        load_preset("gpt2", seq_len=1025)
    with pytest.raises(LoadError, match="max_target_positions"):
        load_preset("whisper-tiny", seq_len=449)


def test_missing_transformers_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "transformers" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(LoadError, match=r"pip install fxlens\[hf\]"):
        load_preset("gpt2")


def test_errors_share_one_base() -> None:
    from fxlens.analyzer.core.errors import CaptureError, ReportError

    assert all(issubclass(e, FxlensError) for e in (LoadError, CaptureError, ReportError))


# Presets whose full depth takes long to capture (over ~30 identical layers): a few layers
# show the same structure.
SHALLOW = {"llama-3.1-405b": {"num_hidden_layers": "4"},
           "gpt2-xl": {"n_layer": "4"},
           "llama-2-13b": {"num_hidden_layers": "4"},
           "llama-2-70b": {"num_hidden_layers": "4"},
           "llama-3-70b": {"num_hidden_layers": "4"},
           "llama-3.1-70b": {"num_hidden_layers": "4"},
           "qwen2.5-72b": {"num_hidden_layers": "4"},
           "qwen3-235b-a22b": {"num_hidden_layers": "4"},
           "deepseek-v3": {"num_hidden_layers": "5"},
           "kimi-k2": {"num_hidden_layers": "5"},
           "qwen3-30b-a3b": {"num_hidden_layers": "4"},
           "gemma-3-1b": {"num_hidden_layers": "6"},   # five sliding layers, one global
           "qwen3-next-80b-a3b": {"num_hidden_layers": "4"},   # three DeltaNet, one attention
           "gpt-oss-120b": {"num_hidden_layers": "2"},   # one sliding layer, one full
           "gpt-oss-20b": {"num_hidden_layers": "2"}}


@pytest.mark.slow
@pytest.mark.parametrize("name", preset_names())
def test_preset_exports_fully_costed_with_one_sdpa_per_attention(name: str) -> None:
    loaded = load_preset(name, SHALLOW.get(name), seq_len=16)
    registry = load_rules()
    graph = capture(loaded.module, loaded.inputs, registry, methods=("export",))
    report = analyze(graph, registry, strict=True)
    assert report.coverage.unsupported == {} and report.coverage.failed == {}
    targets = [n.target for n in graph.calls()]
    sdpa = targets.count("aten.scaled_dot_product_attention.default")
    assert sdpa == SDPA_CALLS.get(name, loaded.module.config.num_hidden_layers)


# ---- forward FLOPs against closed forms ------------------------------------------------------
#
# GEMMs: 2 FLOPs per weight per token (embedding lookups are not GEMMs; the LM head is);
# MoE layers count their router and only the top-k routed experts (+ shared ones).
# Attention per layer: B·H·scores·(2·d_qk + 2·d_v + 8 softmax), scores = T(T+1)/2 causal —
# what the eager kernel computes for these decoders (transformers calls SDPA with is_causal),
# and the captured graph with it (`fxlens.analyzer.capture.hf_masks`).

def causal_attention(config: Any, b: int, t: int, d_qk: int, d_v: int) -> int:
    scores = t * (t + 1) // 2
    return config.num_hidden_layers * b * config.num_attention_heads * scores * (
        2 * d_qk + 2 * d_v + 8)


def dense_decoder(config: Any, b: int, t: int) -> tuple[int, int]:
    """Llama, Phi-3, Gemma-3: GQA projections, a gated MLP, the LM head."""
    h, d = config.hidden_size, getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads)
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    layer = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size
    gemm = 2 * b * t * (config.num_hidden_layers * layer + h * config.vocab_size)
    return gemm, causal_attention(config, b, t, d, d)


def qwen3_moe(config: Any, b: int, t: int) -> tuple[int, int]:
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    experts = config.num_experts_per_tok * 3 * h * config.moe_intermediate_size
    layer = h * q + 2 * h * kv + q * h + h * config.num_experts + experts
    gemm = 2 * b * t * (config.num_hidden_layers * layer + h * config.vocab_size)
    return gemm, causal_attention(config, b, t, d, d)


def deepseek_v3(config: Any, b: int, t: int) -> tuple[int, int]:
    """Multi-head latent attention (low-rank Q and KV), dense MLPs in the first layers, then
    a router, top-k routed experts and the shared experts."""
    h, heads = config.hidden_size, config.num_attention_heads
    d_qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    mla = (h * config.q_lora_rank + config.q_lora_rank * heads * d_qk
           + h * (config.kv_lora_rank + config.qk_rope_head_dim)
           + config.kv_lora_rank * heads * (config.qk_nope_head_dim + config.v_head_dim)
           + heads * config.v_head_dim * h)
    dense = 3 * h * config.intermediate_size
    moe = (h * config.n_routed_experts
           + (config.num_experts_per_tok + config.n_shared_experts)
           * 3 * h * config.moe_intermediate_size)
    n_dense = min(config.first_k_dense_replace, config.num_hidden_layers)
    layers = config.num_hidden_layers * mla + n_dense * dense + (
        config.num_hidden_layers - n_dense) * moe
    gemm = 2 * b * t * (layers + h * config.vocab_size)
    return gemm, causal_attention(config, b, t, d_qk, config.v_head_dim)


CLOSED_FORMS: dict[str, tuple[dict[str, str], Any]] = {
    "llama-3.1-405b": ({}, dense_decoder),
    "phi-3-mini": ({}, dense_decoder),
    "gemma-3-1b": ({}, dense_decoder),
    "qwen3-30b-a3b": ({}, qwen3_moe),
    "deepseek-v3": ({"first_k_dense_replace": "1"}, deepseek_v3),  # one dense, one MoE layer
    # the family names users type, through their aliases
    "qwen3-moe": ({}, qwen3_moe),
    "gemma-3": ({}, dense_decoder),
}


def flops_by_family(name: str, overrides: dict[str, str], seq_len: int) -> tuple[Any, Any]:
    """(config, FLOPs per rule family) of preset `name` at 2 layers, batch 2; the attention
    nodes' notes (the convention applied) under ``"notes"``."""
    loaded = load_preset(name, {"num_hidden_layers": "2", **overrides}, batch=2, seq_len=seq_len)
    registry = load_rules()
    graph = capture(loaded.module, loaded.inputs, registry)
    report = analyze(graph, registry, strict=True)
    assert report.coverage.complete, report.coverage.unsupported
    families: dict[str, Any] = {"notes": set()}
    for node, costed in zip(graph.calls(), report.nodes, strict=True):
        family = getattr(registry.lookup(node), "__module__", "").rpartition(".")[2]
        families[family] = families.get(family, 0) + costed.flops
        if family == "attention":
            families["notes"].add(costed.note)
    families["total"] = report.totals.flops
    return loaded.module.config, families


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_preset_forward_flops_match_the_closed_form(name: str) -> None:
    overrides, closed_form = CLOSED_FORMS[name]
    config, flops = flops_by_family(name, overrides, seq_len=64)
    gemm, attention = closed_form(config, 2, 64)
    assert flops["matmul"] == gemm
    assert flops["attention"] == attention
    assert flops["total"] - gemm - attention < 0.01 * flops["total"]  # elementwise, norms


# ---- attention against a real eager forward of each preset ----------------------------------
#
# Each preset's config, narrowed (two layers, small widths and vocabularies: the attention
# convention does not depend on them) and built with real weights on CPU, runs eagerly with
# every SDPA call noted (`tests.attention_oracle`): is_causal or a mask, and the FLOPs it
# performs by the closed form. Our capture of the same module must count each attention call
# the same, in order. Two cases narrow the sliding window below the sequence, where
# transformers hands SDPA a banded mask.

NARROW = {
    "intermediate_size": "64", "moe_intermediate_size": "32", "vocab_size": "256",
    "num_hidden_layers": "2", "n_layer": "2", "num_layers": "2", "num_decoder_layers": "2",
    "encoder_layers": "2", "decoder_layers": "2", "n_routed_experts": "8", "num_experts": "8",
    "num_experts_per_tok": "2", "n_group": "2", "topk_group": "1", "q_lora_rank": "64",
    "kv_lora_rank": "32", "first_k_dense_replace": "1", "d_ff": "64", "encoder_ffn_dim": "64",
    "decoder_ffn_dim": "64", "pad_token_id": "0", "bos_token_id": "0", "eos_token_id": "0",
}
WINDOWS = {"mistral-7b+window": ("mistral-7b", {"sliding_window": "8"}),
           "gemma-3-1b+window": ("gemma-3-1b", {"sliding_window": "4"})}


def narrowed(name: str) -> dict[str, str]:
    """Overrides that keep `name`'s architecture and attention settings at a small size."""
    config = read_preset(name).config
    out = {k: v for k, v in NARROW.items() if k in config}
    if "q_lora_rank" in config or "head_dim" in config:   # head sizes do not follow hidden
        out["hidden_size"] = "256"
    else:
        heads = config.get("num_attention_heads") or config.get("n_head")
        for key in ("hidden_size", "n_embd"):      # GPT-2's (and GPT-3's) name for it
            if config.get(key, 0) > 1024:
                out[key] = str(heads * 16)
    if name == "gemma-3-1b":
        out["num_hidden_layers"] = "6"     # five sliding layers, one global
    if name == "qwen3-next-80b-a3b":
        out["num_hidden_layers"] = "4"     # three DeltaNet layers, one attention
    return out


def _real(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    generator = torch.Generator().manual_seed(0)
    if value.dtype == torch.int64:
        return torch.randint(0, 200, value.shape, generator=generator)
    return torch.randn(value.shape, dtype=value.dtype, generator=generator)


@pytest.mark.slow
@pytest.mark.parametrize("case", [*preset_names(), *WINDOWS])
def test_preset_attention_counts_what_its_eager_run_computes(case: str) -> None:
    from tests.attention_oracle import AttentionCalls

    name, extra = WINDOWS.get(case, (case, {}))
    loaded = load_preset(name, {**narrowed(name), **extra}, seq_len=16, dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = type(loaded.module)(loaded.module.config).eval()
    inputs = {k: _real(v) for k, v in loaded.inputs.items()}
    calls = AttentionCalls()
    with torch.no_grad(), calls:
        module(**inputs)
    registry = load_rules()
    report = analyze(capture(module, inputs, registry), registry, strict=True)
    ours = [n.flops for n in report.nodes if n.target.startswith("aten.scaled_dot_product")]
    if read_preset(name).attention != "sdpa":      # GPT-OSS: matmuls and a softmax, no SDPA
        assert calls.flops == ours == []
        return
    assert calls.flops and ours == calls.flops
    if case in WINDOWS:
        assert not all(calls.causal)      # the banded layers ran with a mask, counted dense


@pytest.mark.slow
def test_llama_3_8b_attention_at_8k_is_counted_causal() -> None:
    """The issue's headline: at 8192 tokens the eager run calls SDPA with is_causal=True, and
    so does the captured graph (`capture.hf_masks`); we count the lower triangle."""
    config, flops = flops_by_family("llama-3-8b", {}, seq_len=8192)
    gemm, attention = dense_decoder(config, 2, 8192)
    assert (flops["matmul"], flops["attention"]) == (gemm, attention)


@pytest.mark.slow
def test_sliding_window_beyond_the_window_is_counted_dense() -> None:
    """Phi-3-mini's 2047-token window: past it transformers passes an explicit banded mask
    (no is_causal), so a kernel computes every score — the mask is not exactly causal."""
    t = 2048 + 16
    config, flops = flops_by_family("phi-3-mini", {}, seq_len=t)
    d = config.hidden_size // config.num_attention_heads
    dense = config.num_hidden_layers * 2 * config.num_attention_heads * t * t * (4 * d + 8)
    assert flops["attention"] == dense


@pytest.mark.slow
def test_llama_3_1_8b_attention_at_16k_is_counted_causal() -> None:
    """At 16 k tokens too the captured graph calls SDPA with is_causal=True, as the eager run
    does: no 16384² mask is built, the lower triangle counted."""
    config, flops = flops_by_family("llama-3.1-8b", {}, seq_len=16384)
    gemm, attention = dense_decoder(config, 2, 16384)
    assert (flops["matmul"], flops["attention"]) == (gemm, attention)
    (note,) = flops["notes"]
    assert note.startswith("causal: is_causal=True"), note


@pytest.mark.slow
def test_sliding_window_at_16k_is_counted_dense() -> None:
    """Mistral-7B's 4096-token window at 16 k tokens: judged by rows too, and banded."""
    t = 16384
    config, flops = flops_by_family("mistral-7b", {}, seq_len=t)
    d = config.hidden_size // config.num_attention_heads
    dense = config.num_hidden_layers * 2 * config.num_attention_heads * t * t * (4 * d + 8)
    assert flops["attention"] == dense
    (note,) = flops["notes"]
    assert note.startswith("dense: the mask is a sliding window of 4096 keys per query"), note


def test_a_causal_lm_trains_on_its_own_loss() -> None:
    """A causal LM preset's step is recorded from the model's own loss (labels = its tokens):
    the cross-entropy and its backward are in the graph, and under autocast the fp32 copy of
    the logits and the log-probabilities it keeps make the step's forward/backward peak higher
    than a backward seeded with ones on the logits."""
    import dataclasses

    from fxlens.analyzer.core.sections import Training
    from fxlens.api import AnalysisOptions, analyze_loaded

    loaded = load_preset("gpt2", {"n_layer": "1", "n_embd": "32", "n_head": "2",
                                  "vocab_size": "4096"}, 4, 64, dtype="float32")  # logits rule
    assert loaded.training_inputs is not None
    assert loaded.training_inputs["labels"] is loaded.inputs["input_ids"]
    options = AnalysisOptions(train=True, fusion=False, strict=True, precision="autocast-bf16")
    own = analyze_loaded(loaded, options)
    ones = analyze_loaded(dataclasses.replace(loaded, training_inputs=None), options)
    targets = {n.target for n in own.nodes}
    assert any("nll_loss_forward" in t for t in targets)
    assert any("nll_loss_backward" in t for t in targets)
    assert not any("nll_loss" in n.target for n in ones.nodes)
    assert (own.require(Training).saved_activation_bytes
            > ones.require(Training).saved_activation_bytes)     # the fp32 log-probabilities
    assert (own.require(Training).peak_breakdown.fwd_bwd_peak_bytes
            > ones.require(Training).peak_breakdown.fwd_bwd_peak_bytes)
    assert load_preset("bert-base", {"num_hidden_layers": "1"}, 1, 8).training_inputs is None
