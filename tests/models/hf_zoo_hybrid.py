"""The architectures of 2025–26 from `transformers` configs: linear-attention and state-space
hybrids, MoE with shared experts, attention sinks, chunked and NoPE attention.

Part of `tests.models.hf_zoo`'s ZOO, built like the others there (seeded weights on CPU, no
cache, eval mode, SDPA where the architecture has it, keyword inputs), on sequences of
`SEQ_LEN` tokens with chunk sizes below it where the config allows, so chunked scans run more
than one chunk:

- gated DeltaNet + gated attention + MoE with a shared expert: Qwen3-Next, Qwen3.5, OLMo-hybrid
  (DeltaNet without MoE), Kimi-Linear (DeltaNet with MLA);
- lightning (linear) attention + softmax attention + MoE: MiniMax;
- Mamba-2 (SSD) heads: Mamba-2 alone, and beside attention in Falcon-H1 (parallel), Bamba,
  Granite-4 (MoE hybrid), Nemotron-H and Zamba2 (shared attention blocks);
- short convolutions + attention: LFM2;
- attention sinks, sliding windows and MoE: GPT-OSS; chunked attention with NoPE layers and
  MoE: Llama 4 (text); AltUp, LAuReL and KV-shared layers: Gemma 3n (text).

Nothing is downloaded. Importing this module imports transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import transformers

from tests.models.hf_build import Built, instantiate, tokens

SEQ_LEN = 24
VOCAB = 128


def _lm(model_cls: type, config: Any, attention: str | None = "sdpa") -> Built:
    return instantiate(model_cls, config, attention), {"input_ids": tokens(VOCAB, SEQ_LEN)}


def build_qwen3_next() -> Built:
    """Gated DeltaNet every layer but each second, gated softmax attention there; MoE with a
    shared expert."""
    return _lm(transformers.Qwen3NextForCausalLM, transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, intermediate_size=128,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=2))


def build_qwen3_5() -> Built:
    return _lm(transformers.Qwen3_5ForCausalLM, transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, intermediate_size=128,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"]))


def build_olmo_hybrid() -> Built:
    return _lm(transformers.OlmoHybridForCausalLM, transformers.OlmoHybridConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, intermediate_size=128,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"],
        pad_token_id=0))


def build_kimi_linear() -> Built:
    return _lm(transformers.KimiLinearForCausalLM, transformers.KimiLinearConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, intermediate_size=128,
        moe_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, linear_head_dim=16, linear_num_heads=4,
        layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse"], pad_token_id=0))


def build_minimax() -> Built:
    return _lm(transformers.MiniMaxForCausalLM, transformers.MiniMaxConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, intermediate_size=64,
        num_local_experts=4, num_experts_per_tok=2, block_size=8,
        layer_types=["linear_attention", "full_attention"]))


def build_mamba2() -> Built:
    return _lm(transformers.Mamba2ForCausalLM, transformers.Mamba2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
        state_size=16, n_groups=2, expand=2, chunk_size=8), attention=None)


def build_falcon_h1() -> Built:
    return _lm(transformers.FalconH1ForCausalLM, transformers.FalconH1Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
        mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
        mamba_chunk_size=8))


def build_bamba() -> Built:
    return _lm(transformers.BambaForCausalLM, transformers.BambaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
        attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=16, mamba_chunk_size=8))


def build_granite_moe_hybrid() -> Built:
    return _lm(transformers.GraniteMoeHybridForCausalLM, transformers.GraniteMoeHybridConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=32, max_position_embeddings=64,
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64,
        layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_head=16,
        mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=8))


def build_nemotron_h() -> Built:
    return _lm(transformers.NemotronHForCausalLM, transformers.NemotronHConfig(
        vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=64, intermediate_size=128,
        layers_block_type=["mamba", "attention", "mlp"], ssm_state_size=16,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=2, chunk_size=8))


def build_zamba2() -> Built:
    return _lm(transformers.Zamba2ForCausalLM, transformers.Zamba2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=128, max_position_embeddings=64,
        layers_block_type=["mamba", "hybrid", "mamba"], mamba_d_state=16, n_mamba_heads=4,
        mamba_ngroups=1, chunk_size=8, num_mem_blocks=1, use_mem_rope=True))


def build_lfm2() -> Built:
    return _lm(transformers.Lfm2ForCausalLM, transformers.Lfm2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
        layer_types=["conv", "full_attention"], block_auto_adjust_ff_dim=False))


def build_gpt_oss() -> Built:
    """Attention sinks, alternating sliding (8 tokens) and full attention, 4 experts; eager
    attention (transformers has no SDPA path for sinks)."""
    return _lm(transformers.GptOssForCausalLM, transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=64, max_position_embeddings=64,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"]), attention="eager")


def build_llama4() -> Built:
    """Chunked attention (8 tokens) with RoPE, a NoPE full-attention layer, MoE + dense."""
    return _lm(transformers.Llama4ForCausalLM, transformers.Llama4TextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=64, intermediate_size_mlp=128,
        max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=2, attention_chunk_size=8, no_rope_layers=[1, 0]))


def build_gemma3n() -> Built:
    return _lm(transformers.Gemma3nForCausalLM, transformers.Gemma3nTextConfig(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=64,
        hidden_size_per_layer_input=8, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=64,
        sliding_window=8, num_kv_shared_layers=2, laurel_rank=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
        activation_sparsity_pattern=[0.0] * 4))


ZOO: dict[str, Callable[[], Built]] = {
    name.removeprefix("build_"): fn for name, fn in globals().items()
    if name.startswith("build_") and callable(fn)
}
