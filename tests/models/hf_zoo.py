"""Small `transformers` architectures built from tiny configs, with real seeded weights on CPU.

Each ``build_<name>()`` returns ``(module, example_inputs)`` with keyword inputs, like a model
file's ``build()``: hidden sizes 32–64, two layers, vocabularies of 100–256 and sequences of
8–16, so the whole zoo runs eagerly in seconds. All use SDPA attention, no KV cache and eval
mode. `ZOO` lists them by name.

Nothing is downloaded: configs are plain keyword arguments. Importing this module imports
transformers (a few seconds), so `tests.models` does not import it.

Known limitation: these are the architectures of the named families, not their published
sizes; the presets in `fxlens.analyzer.capture.hf` cover those (on meta, without weights).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers

SEED = 0
BATCH = 2
SEQ_LEN = 12
VOCAB = 128

Built = tuple[torch.nn.Module, dict[str, torch.Tensor]]


def _instantiate(model_cls: type, config: Any) -> torch.nn.Module:
    """`model_cls(config)` with seeded weights, SDPA attention, no cache, in eval mode."""
    config._attn_implementation = "sdpa"
    if hasattr(config, "use_cache"):
        config.use_cache = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = model_cls(config)
    return model.eval()


def _tokens(vocab: int = VOCAB, length: int = SEQ_LEN, seed: int = SEED + 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, length), generator=generator)


def _floats(*shape: int, seed: int = SEED + 2) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def build_gpt2() -> Built:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    model = _instantiate(transformers.GPT2LMHeadModel, config)
    return model, {"input_ids": _tokens()}


def build_bert() -> Built:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32,
    )
    model = _instantiate(transformers.BertForMaskedLM, config)
    mask = torch.ones(BATCH, SEQ_LEN, dtype=torch.int64)
    mask[1, -3:] = 0  # a padded second sequence, so the attention mask is real
    return model, {"input_ids": _tokens(), "attention_mask": mask}


def build_t5() -> Built:
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        dropout_rate=0.0, feed_forward_proj="relu", decoder_start_token_id=0,
    )
    model = _instantiate(transformers.T5ForConditionalGeneration, config)
    return model, {"input_ids": _tokens(), "decoder_input_ids": _tokens(length=8, seed=3)}


def build_llama() -> Built:
    """Llama with grouped-query attention: 4 query heads share 2 key/value heads."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=10000.0,
    )
    model = _instantiate(transformers.LlamaForCausalLM, config)
    return model, {"input_ids": _tokens()}


def build_mixtral() -> Built:
    """Mixtral: 4 experts, top-2 routing, GQA; experts in transformers' default implementation."""
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, sliding_window=None,
    )
    model = _instantiate(transformers.MixtralForCausalLM, config)
    return model, {"input_ids": _tokens()}


def build_whisper() -> Built:
    """Whisper with a 32-frame mel window (2 × max_source_positions) and 16 mel bins."""
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        suppress_tokens=None, begin_suppress_tokens=None,
    )
    model = _instantiate(transformers.WhisperForConditionalGeneration, config)
    features = _floats(BATCH, config.num_mel_bins, 2 * config.max_source_positions)
    return model, {"input_features": features, "decoder_input_ids": _tokens(length=8)}


def build_vit() -> Built:
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=32, patch_size=8, num_channels=3, num_labels=10,
    )
    model = _instantiate(transformers.ViTForImageClassification, config)
    return model, {"pixel_values": _floats(BATCH, 3, 32, 32)}


def build_wav2vec2() -> Built:
    """Wav2Vec2 for CTC: a 3-layer conv feature encoder (stride 20) over 400 samples."""
    config = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        hidden_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
        layerdrop=0.0,
    )
    model = _instantiate(transformers.Wav2Vec2ForCTC, config)
    return model, {"input_values": _floats(BATCH, 400)}


ZOO: dict[str, Callable[[], Built]] = {
    "gpt2": build_gpt2,
    "bert": build_bert,
    "t5": build_t5,
    "llama": build_llama,
    "mixtral": build_mixtral,
    "whisper": build_whisper,
    "vit": build_vit,
    "wav2vec2": build_wav2vec2,
}
