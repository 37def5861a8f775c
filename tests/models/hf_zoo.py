"""Small `transformers` architectures built from tiny configs, with real seeded weights on CPU.

Each ``build_<name>()`` returns ``(module, example_inputs)`` with keyword inputs, like a model
file's ``build()``: hidden sizes 32–64, two layers, vocabularies of 100–256 and sequences of
8–16, so the whole zoo runs eagerly in seconds. All use SDPA attention where the architecture
has it, no KV cache and eval mode. `ZOO` lists them by name.

The families: decoder-only with GQA (Llama, Qwen2, Phi-3), GPT-2, GPT-NeoX, OPT, Falcon (the
new decoder architecture: grouped KV heads, parallel attention), sliding windows narrower than
the sequence (Mistral; Gemma-3 alternating local and global layers), ALiBi (Bloom, eager
attention), MoE (Mixtral, Qwen3-MoE), MLA + MoE (DeepSeek-V3), attention + Mamba + MoE
(Jamba), state-space and recurrent (Mamba, RWKV), a vision-language model (Llava: CLIP vision
tower + Llama), encoder-only (BERT, DistilBERT, ModernBERT with local attention),
encoder-decoder (T5, Whisper), ViT, convnets (ResNet; ConvNeXt and MobileNetV2, depthwise),
detection (DETR on a transformers ResNet backbone), segmentation (SegFormer), and audio (a
conv + transformer speech model, Wav2Vec2; the Audio Spectrogram Transformer). Diffusion
models are in `tests.models.diffusers_zoo`.

Nothing is downloaded: configs are plain keyword arguments. Importing this module imports
transformers (a few seconds), so `tests.models` does not import it.

Known limitation: these are the architectures of the named families, not their published
sizes; the presets in `fxlens.analyzer.capture.hf` cover those (on meta, without weights).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import transformers

from tests.models.hf_build import BATCH, SEQ_LEN, VOCAB, Built, floats, instantiate, tokens
from tests.models.hf_zoo_hybrid import ZOO as HYBRID_ZOO


def build_gpt2() -> Built:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    model = instantiate(transformers.GPT2LMHeadModel, config)
    return model, {"input_ids": tokens()}


def build_bert() -> Built:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32,
    )
    model = instantiate(transformers.BertForMaskedLM, config)
    mask = torch.ones(BATCH, SEQ_LEN, dtype=torch.int64)
    mask[1, -3:] = 0  # a padded second sequence, so the attention mask is real
    return model, {"input_ids": tokens(), "attention_mask": mask}


def build_t5() -> Built:
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        dropout_rate=0.0, feed_forward_proj="relu", decoder_start_token_id=0,
    )
    model = instantiate(transformers.T5ForConditionalGeneration, config)
    return model, {"input_ids": tokens(), "decoder_input_ids": tokens(length=8, seed=3)}


def build_llama() -> Built:
    """Llama with grouped-query attention: 4 query heads share 2 key/value heads."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=10000.0,
    )
    model = instantiate(transformers.LlamaForCausalLM, config)
    return model, {"input_ids": tokens()}


def build_mixtral() -> Built:
    """Mixtral: 4 experts, top-2 routing, GQA; experts in transformers' default implementation."""
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, sliding_window=None,
    )
    model = instantiate(transformers.MixtralForCausalLM, config)
    return model, {"input_ids": tokens()}


def build_whisper() -> Built:
    """Whisper with a 32-frame mel window (2 × max_source_positions) and 16 mel bins."""
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        suppress_tokens=None, begin_suppress_tokens=None,
    )
    model = instantiate(transformers.WhisperForConditionalGeneration, config)
    features = floats(BATCH, config.num_mel_bins, 2 * config.max_source_positions)
    return model, {"input_features": features, "decoder_input_ids": tokens(length=8)}


def build_vit() -> Built:
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=32, patch_size=8, num_channels=3, num_labels=10,
    )
    model = instantiate(transformers.ViTForImageClassification, config)
    return model, {"pixel_values": floats(BATCH, 3, 32, 32)}


def build_wav2vec2() -> Built:
    """Wav2Vec2 for CTC: a 3-layer conv feature encoder (stride 20) over 400 samples."""
    config = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        hidden_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
        layerdrop=0.0,
    )
    model = instantiate(transformers.Wav2Vec2ForCTC, config)
    return model, {"input_values": floats(BATCH, 400)}


def build_qwen2() -> Built:
    """Qwen2: GQA with biased Q/K/V projections."""
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return instantiate(transformers.Qwen2ForCausalLM, config), {"input_ids": tokens()}


def build_phi3() -> Built:
    """Phi-3: fused QKV and gate-up projections, GQA."""
    config = transformers.Phi3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        original_max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        sliding_window=None,
    )
    return instantiate(transformers.Phi3ForCausalLM, config), {"input_ids": tokens()}


def build_gpt_neox() -> Built:
    """GPT-NeoX: parallel attention + MLP, rotary embeddings on a quarter of each head."""
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25,
    )
    return instantiate(transformers.GPTNeoXForCausalLM, config), {"input_ids": tokens()}


def build_opt() -> Built:
    """OPT: learned positions with an offset of 2, ReLU MLP."""
    config = transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
        num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
        dropout=0.0, pad_token_id=1,
    )
    return instantiate(transformers.OPTForCausalLM, config), {"input_ids": tokens()}


def build_falcon() -> Built:
    """Falcon's new decoder architecture (40B/180B): 2 KV groups, parallel attention + MLP."""
    config = transformers.FalconConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_kv_heads=2, new_decoder_architecture=True, max_position_embeddings=64,
    )
    return instantiate(transformers.FalconForCausalLM, config), {"input_ids": tokens()}


def build_qwen3_moe() -> Built:
    """Qwen3-MoE: 4 experts of width 16, top-2, QK-norm, GQA with head_dim 8."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=64,
    )
    return instantiate(transformers.Qwen3MoeForCausalLM, config), {"input_ids": tokens()}


def build_deepseek_v3() -> Built:
    """DeepSeek-V3: multi-head latent attention (low-rank Q and KV), a dense first layer, then
    4 routed experts (top-2 of 2 groups) + 1 shared expert."""
    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=64, rope_scaling=None,
    )
    return instantiate(transformers.DeepseekV3ForCausalLM, config), {"input_ids": tokens()}


def build_jamba() -> Built:
    """Jamba: a Mamba layer then an attention layer with a 4-expert MoE (PyTorch scan)."""
    config = transformers.JambaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
        max_position_embeddings=64,
    )
    return instantiate(transformers.JambaForCausalLM, config), {"input_ids": tokens()}


def build_mamba() -> Built:
    """Mamba: selective state-space layers, no attention (the PyTorch reference scan)."""
    config = transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
        conv_kernel=4, time_step_rank=4, use_mambapy=False,
    )
    model = instantiate(transformers.MambaForCausalLM, config, attention=None)
    return model, {"input_ids": tokens()}


def build_resnet() -> Built:
    """ResNet from transformers: two stages of basic blocks, batch norm in eval mode."""
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
        layer_type="basic", num_labels=10,
    )
    model = instantiate(transformers.ResNetForImageClassification, config, attention=None)
    return model, {"pixel_values": floats(BATCH, 3, 32, 32)}


LLAVA_IMAGE = 32
LLAVA_PATCH = 8


def build_llava() -> Built:
    """Llava: a CLIP vision tower (32 px, 8 px patches) projected into a Llama; the prompt
    holds one image token per patch (CLS dropped, the "default" strategy)."""
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        image_size=LLAVA_IMAGE, patch_size=LLAVA_PATCH, projection_dim=32,
    )
    text = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=VOCAB - 1,
        projector_hidden_act="gelu", vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    model = instantiate(transformers.LlavaForConditionalGeneration, config)
    patches = (LLAVA_IMAGE // LLAVA_PATCH) ** 2
    ids = tokens(vocab=VOCAB - 1, length=SEQ_LEN + patches)
    ids[:, 1:1 + patches] = VOCAB - 1
    return model, {"input_ids": ids, "pixel_values": floats(BATCH, 3, LLAVA_IMAGE, LLAVA_IMAGE)}


def build_distilbert() -> Built:
    """DistilBERT: six-layer BERT without token types, here two layers."""
    config = transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
        max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
    )
    model = instantiate(transformers.DistilBertForMaskedLM, config)
    return model, {"input_ids": tokens()}


def build_modernbert() -> Built:
    """ModernBERT: rotary encoder alternating global and local (sliding-window) attention,
    gated GELU MLP, no biases; the local window (4) is narrower than the sequence."""
    config = transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, global_attn_every_n_layers=2,
        local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2, sep_token_id=2,
        cls_token_id=1,
    )
    model = instantiate(transformers.ModernBertForMaskedLM, config)
    return model, {"input_ids": tokens()}


def build_mistral() -> Built:
    """Mistral with a sliding window (8) narrower than the sequence: a banded mask."""
    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        sliding_window=8,
    )
    return instantiate(transformers.MistralForCausalLM, config), {"input_ids": tokens()}


def build_gemma3() -> Built:
    """Gemma-3 text: one sliding-window layer (window 4) then one global layer, QK-norm,
    GQA with head_dim 16, tied embeddings."""
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=64,
    )
    return instantiate(transformers.Gemma3ForCausalLM, config), {"input_ids": tokens()}


def build_bloom() -> Built:
    """Bloom: ALiBi position biases added to the scores (baddbmm, no SDPA)."""
    config = transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = instantiate(transformers.BloomForCausalLM, config, attention="eager")
    return model, {"input_ids": tokens()}


def build_rwkv() -> Built:
    """RWKV (v4): linear-attention recurrence over time, token shift, channel mixing."""
    config = transformers.RwkvConfig(
        vocab_size=VOCAB, context_length=32, hidden_size=32, num_hidden_layers=2,
        attention_hidden_size=32, intermediate_size=64, rescale_every=0,
    )
    model = instantiate(transformers.RwkvForCausalLM, config, attention=None)
    return model, {"input_ids": tokens()}


def build_ast() -> Built:
    """Audio Spectrogram Transformer: a ViT over 16 × 16 patches of a 32-frame,
    16-bin spectrogram (strides 10), for audio classification."""
    config = transformers.ASTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        patch_size=16, frequency_stride=10, time_stride=10, max_length=32, num_mel_bins=16,
        num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    model = instantiate(transformers.ASTForAudioClassification, config)
    return model, {"input_values": floats(BATCH, config.max_length, config.num_mel_bins)}


def build_convnext() -> Built:
    """ConvNeXt: 4 × 4 patchify stem, depthwise 7 × 7 convs, layer norm, inverted MLP."""
    config = transformers.ConvNextConfig(
        num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], patch_size=4, num_stages=2,
        num_labels=10, drop_path_rate=0.0,
    )
    model = instantiate(transformers.ConvNextForImageClassification, config, attention=None)
    return model, {"pixel_values": floats(BATCH, 3, 32, 32)}


def build_mobilenet_v2() -> Built:
    """MobileNetV2: inverted residuals with depthwise 3 × 3 convs, ReLU6, width 0.25."""
    config = transformers.MobileNetV2Config(
        num_channels=3, image_size=32, depth_multiplier=0.25, num_labels=10,
        classifier_dropout_prob=0.0,
    )
    model = instantiate(transformers.MobileNetV2ForImageClassification, config,
                         attention=None)
    return model, {"pixel_values": floats(BATCH, 3, 32, 32)}


def build_detr() -> Built:
    """DETR: a transformers ResNet backbone (no timm, no pretrained weights), a one-layer
    encoder and decoder over 8 object queries, class and box heads."""
    backbone = transformers.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
        layer_type="basic", out_features=["stage2"],
    )
    config = transformers.DetrConfig(
        use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False,
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8,
        num_labels=5, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )
    config._attn_implementation = {"": "sdpa", "backbone_config": "eager"}  # ResNet: no SDPA
    model = instantiate(transformers.DetrForObjectDetection, config, attention=None)
    return model, {"pixel_values": floats(BATCH, 3, 64, 64),
                   "pixel_mask": torch.ones(BATCH, 64, 64, dtype=torch.int64)}


def build_segformer() -> Built:
    """SegFormer: a two-stage Mix Transformer (overlapping patch embeddings, attention over
    spatially reduced keys, depthwise-conv MLPs) and an all-MLP decode head."""
    config = transformers.SegformerConfig(
        num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
        hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
        mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0, drop_path_rate=0.0,
    )
    model = instantiate(transformers.SegformerForSemanticSegmentation, config)
    return model, {"pixel_values": floats(BATCH, 3, 32, 32)}


ZOO: dict[str, Callable[[], Built]] = {
    "gpt2": build_gpt2,
    "bert": build_bert,
    "t5": build_t5,
    "llama": build_llama,
    "mixtral": build_mixtral,
    "whisper": build_whisper,
    "vit": build_vit,
    "wav2vec2": build_wav2vec2,
    "qwen2": build_qwen2,
    "phi3": build_phi3,
    "gpt_neox": build_gpt_neox,
    "opt": build_opt,
    "falcon": build_falcon,
    "qwen3_moe": build_qwen3_moe,
    "deepseek_v3": build_deepseek_v3,
    "jamba": build_jamba,
    "mamba": build_mamba,
    "resnet": build_resnet,
    "llava": build_llava,
    "distilbert": build_distilbert,
    "modernbert": build_modernbert,
    "mistral": build_mistral,
    "gemma3": build_gemma3,
    "bloom": build_bloom,
    "rwkv": build_rwkv,
    "ast": build_ast,
    "convnext": build_convnext,
    "mobilenet_v2": build_mobilenet_v2,
    "detr": build_detr,
    "segformer": build_segformer,
    **HYBRID_ZOO,
}
