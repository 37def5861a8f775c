"""`transformers` captured as its eager run calls attention (`capture.hf_masks`), and the
"pass is_causal" findings on the architectures that build their own masks.

Llama-style causal LMs call SDPA with ``is_causal=True`` eagerly; captured, they must too (no
mask in the graph, the lower triangle counted). Falcon always hands SDPA its mask: counted
dense, with FUS009 saying what ``is_causal=True`` would skip. Eager attention written by hand
(Llama, DeepSeek-V3, GPT-2 and Falcon with ``attn_implementation="eager"``) is FUS004, and its
mask, exactly causal, adds the same saving: dense − causal by the closed form
B·H·(T² − T(T+1)/2)·(2·d_qk + 2·d_v + 8), per layer.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import masking_utils

from fxlens.analyzer.capture import hf_masks
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.sections import Findings
from fxlens.api import AnalysisOptions, analyze_loaded
from fxlens.rules.conventions import SOFTMAX_FLOPS_PER_ELEMENT as SOFTMAX
from tests.models.hf_build import BATCH, SEQ_LEN, instantiate, tokens

LAYERS, HEADS = 2, 4


def config(name: str) -> tuple[type, Any, int, int]:
    """A two-layer config of `name`'s family, with its query/key and value head dims."""
    common = dict(vocab_size=128, num_hidden_layers=LAYERS, max_position_embeddings=64)
    if name == "llama":
        return (transformers.LlamaForCausalLM, transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_attention_heads=HEADS,
            num_key_value_heads=2, **common), 8, 8)
    if name == "falcon":
        return (transformers.FalconForCausalLM, transformers.FalconConfig(
            hidden_size=32, num_attention_heads=HEADS, num_kv_heads=2,
            new_decoder_architecture=True, **common), 8, 8)
    if name == "gpt2":
        return (transformers.GPT2LMHeadModel, transformers.GPT2Config(
            vocab_size=128, n_embd=32, n_layer=LAYERS, n_head=HEADS, n_positions=64,
            bos_token_id=0, eos_token_id=0), 8, 8)
    return (transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config(
        hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=8, rope_scaling=None, **common), 12, 8)


def analysed(name: str, attention: str) -> Any:
    cls, cfg, _, _ = config(name)
    module = instantiate(cls, cfg, attention)
    return analyze_loaded(LoadedModel(module, {"input_ids": tokens()}, name, name),
                          AnalysisOptions(device="h100"))


def causal_skip(d_qk: int, d_v: int) -> int:
    """FLOPs a causal kernel skips per layer at SEQ_LEN: the upper triangle's scores."""
    skipped = SEQ_LEN * SEQ_LEN - SEQ_LEN * (SEQ_LEN + 1) // 2
    return BATCH * HEADS * skipped * (2 * d_qk + 2 * d_v + SOFTMAX)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "deepseek", "gpt2", "falcon"])
def test_hand_written_attention_with_a_causal_mask_says_what_is_causal_skips(name: str) -> None:
    report = analysed(name, "eager")
    found = [f for f in report.require(Findings).items if f.code == "FUS004"]
    _, _, d_qk, d_v = config(name)
    assert len(found) == LAYERS
    assert all(f.saved_flops == causal_skip(d_qk, d_v) for f in found)
    assert all("its mask is exactly causal" in f.message for f in found)


@pytest.mark.slow
def test_falcon_hands_sdpa_its_mask_counted_dense_with_the_finding() -> None:
    report = analysed("falcon", "sdpa")
    attention = [n for n in report.nodes if "scaled_dot_product" in n.target]
    assert len(attention) == LAYERS
    dense = BATCH * HEADS * SEQ_LEN * SEQ_LEN * (2 * 8 + 2 * 8 + SOFTMAX)
    assert all(n.flops == dense and n.note.startswith("dense: the mask is exactly causal")
               for n in attention)
    found = [f for f in report.require(Findings).items if f.code == "FUS009"]
    assert len(found) == LAYERS
    assert all(f.saved_flops == causal_skip(8, 8) for f in found)


@pytest.mark.slow
def test_llama_with_sdpa_is_captured_as_its_eager_run_calls_it() -> None:
    """No mask in the graph: SDPA with is_causal=True, the lower triangle, no finding."""
    report = analysed("llama", "sdpa")
    attention = [n for n in report.nodes if "scaled_dot_product" in n.target]
    causal = SEQ_LEN * (SEQ_LEN + 1) // 2
    assert [n.note for n in attention] == ["causal: is_causal=True (a flash kernel skips the "
                                           "upper triangle)"] * LAYERS
    assert all(n.flops == BATCH * HEADS * causal * (2 * 8 + 2 * 8 + SOFTMAX) for n in attention)
    assert not [f for f in report.require(Findings).items if f.code in ("FUS004", "FUS009")]
    assert masking_utils._ignore_causal_mask_sdpa.__module__ == "transformers.masking_utils"


def test_the_eager_answers_read_values_where_tensors_hold_them() -> None:
    positions = torch.arange(6)[None]
    packed = torch.tensor([[0, 1, 2, 0, 1, 2]])
    assert hf_masks.packed_sequences(positions) is None
    assert hf_masks.packed_sequences(packed).tolist() == [[0, 0, 0, 1, 1, 1]]
    with FakeTensorMode():
        assert hf_masks.packed_sequences(torch.tensor([[0, 1, 2, 0, 1, 2]])) is None
    padded = torch.tensor([[True, True, False]])
    assert not hf_masks.skips_causal_mask(padded, 3, 3, 0, 0)
    assert hf_masks.skips_causal_mask(torch.ones(1, 3, dtype=torch.bool), 3, 3, 0, 0)
    assert not hf_masks.skips_causal_mask(None, 8, 8, 0, 0, local_attention_size=4)
    assert hf_masks.skips_causal_mask(None, 3, 8, 0, 0)     # an empty cache, no padding mask
    assert not hf_masks.skips_causal_mask(None, 3, 8, 5, 0)
    assert not hf_masks.skips_bidirectional_mask(padded, 3)
    assert not hf_masks.skips_bidirectional_mask(None, 8, local_attention_size=4)


def test_the_decisions_are_transformers_own_outside_a_capture() -> None:
    before = {name: getattr(masking_utils, name) for name in hf_masks.DECISIONS}
    with hf_masks.eager_mask_decisions():
        assert masking_utils._ignore_causal_mask_sdpa is hf_masks.skips_causal_mask
    assert {name: getattr(masking_utils, name) for name in hf_masks.DECISIONS} == before
