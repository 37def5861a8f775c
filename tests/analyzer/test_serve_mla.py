"""``--serve`` for multi-head latent attention (DeepSeek-V3): the latent cache, the absorbed
decode engines run, tensor parallelism over heads with the latent on every GPU, and the first
k dense layers captured apart from the MoE ones (`fxlens.analyzer.capture.hf_mla`)."""

from __future__ import annotations

import pytest
import torch

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.core.sections import Serve
from fxlens.pipeline import AnalysisOptions, run_pipeline

SMALL = {"num_hidden_layers": "4", "first_k_dense_replace": "2", "hidden_size": "256",
         "intermediate_size": "512", "moe_intermediate_size": "64", "num_attention_heads": "4",
         "num_key_value_heads": "4", "q_lora_rank": "96", "kv_lora_rank": "64",
         "qk_rope_head_dim": "16", "qk_nope_head_dim": "32", "v_head_dim": "32",
         "n_routed_experts": "8", "num_experts_per_tok": "2", "n_group": "1", "topk_group": "1",
         "n_shared_experts": "1", "vocab_size": "1024", "max_position_embeddings": "4096"}
LATENT = 64 + 16           # kv_lora_rank + qk_rope_head_dim


def _serve(**options: object) -> tuple[Serve, torch.nn.Module]:
    loaded = load_preset("deepseek-v3", SMALL, batch=1, seq_len=32)
    settings = {"serve": True, "device": "h100", "input_len": 512, "output_len": 64,
                "fusion": False, "serve_batches": (1,), **options}
    serve = run_pipeline(loaded, AnalysisOptions(**settings)).get(Serve)   # type: ignore[arg-type]
    assert serve is not None
    return serve, loaded.module


def test_the_absorbed_decode_gives_the_librarys_own_logits() -> None:
    """Real weights on CPU: a prompt prefilled by the library, then one token decoded by
    `transformers`' expanded attention and by the engine's absorbed one over the latent."""
    from transformers import DynamicCache, StaticCache

    from fxlens.analyzer.capture.hf_decode import ENGINE_ATTENTION, _register_engine_attention
    from fxlens.analyzer.capture.hf_mla import absorb_latent, latent_layer
    from tests.models.hf_zoo import build_deepseek_v3

    torch.manual_seed(0)
    model, _ = build_deepseek_v3()
    model.set_attn_implementation("sdpa")
    config: object = model.config
    prompt, token = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 1))
    with torch.no_grad():
        cache = DynamicCache(config=config)
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        latents = [torch.cat((layer.keys, layer.values), dim=-1) for layer in cache.layers]
        expected = model(input_ids=token, past_key_values=cache, use_cache=True).logits

        _register_engine_attention()
        model.set_attn_implementation(ENGINE_ATTENTION)
        absorb_latent(model)
        static = StaticCache(config=config, max_cache_len=8)
        for index, latent in enumerate(latents):
            static.layers[index] = latent_layer(torch.cat(
                (latent, torch.zeros_like(latent[:, :, :1])), dim=2))
        decoded = model(input_ids=token, past_key_values=static, use_cache=True).logits
    assert latents[0].shape[-1] == model.config.kv_lora_rank + model.config.qk_rope_head_dim
    torch.testing.assert_close(decoded, expected, rtol=1e-5, atol=1e-5)
    assert decoded.abs().max() > 0.05          # not two vanishing outputs


def test_an_mla_layer_caches_one_latent_per_token_for_every_head() -> None:
    from fxlens.rules.kv_layouts import layers_from_config

    module = load_preset("deepseek-v3", {"num_hidden_layers": "5"}, batch=1, seq_len=8).module
    layers = layers_from_config(module.config)
    assert [(layer.kv_heads, layer.k_head_dim, layer.v_head_dim) for layer in layers] == [
        (1, 512 + 64, 0)] * 5


@pytest.mark.slow      # two serving pipelines, ~6 s each
def test_an_mla_decode_reads_the_weights_and_the_latent_cache_once() -> None:
    """Batch 1: the dense weights (the absorbed W_UK and W_UV are ``kv_b_proj``'s, read once),
    2 of 8 routed experts, and 576-wide-latent bytes per cached token, not per-head K and V."""
    serve, module = _serve()
    embedding = module.get_input_embeddings().weight
    sizes = {name: p.numel() * p.element_size() for name, p in module.named_parameters()}
    experts = sum(size for name, size in sizes.items() if ".experts." in name
                  and "shared" not in name)
    dense = sum(sizes.values()) - experts - embedding.numel() * embedding.element_size()
    assert serve.kv_bytes_per_token == 4 * LATENT * 2
    cache = (512 + (64 - 2) / 2) * serve.kv_bytes_per_token      # 9 % of the step
    # the rest is activations (2 %: a 256-wide model's are a visible share)
    assert serve.decode_bytes_per_step == pytest.approx(dense + experts * 2 / 8 + cache,
                                                        rel=0.03)

    two, _ = _serve(tp=2)
    assert two.kv_bytes_per_token == serve.kv_bytes_per_token     # the latent on every GPU
    assert two.max_batch < 2 * serve.max_batch


@pytest.mark.slow
def test_tensor_parallel_splits_the_absorbed_heads_and_replicates_the_latent() -> None:
    """The decode graph's heads split (q_b_proj, W_UK, attention, W_UV, o_proj); the query's
    and the latent's down-projections stay whole on every GPU."""
    from fxlens.analyzer.capture.chain import capture
    from fxlens.analyzer.capture.hf_decode import decode_inputs, decode_step, with_layers
    from fxlens.analyzer.plan.forward import forward_split
    from fxlens.rules import load_rules
    from fxlens.rules.kv_layouts import layers_from_config
    from fxlens.rules.parallel import PARALLEL

    small = with_layers(load_preset("deepseek-v3", SMALL, batch=1, seq_len=8).module, 2)
    graph = capture(decode_step(small), decode_inputs(small, 2, 100, layers_from_config(
        small.config)), load_rules())
    split = forward_split(graph, PARALLEL)
    attention = [n for n in graph.nodes if n.module.startswith("model.model.layers.1.self_attn")]
    split_of = {(n.module.rsplit(".", 1)[-1], n.packet): n.id in split.split_nodes
                for n in attention if n.packet in ("aten.linear", "aten.matmul",
                                                   "aten.scaled_dot_product_attention")}
    assert split_of == {("q_a_proj", "aten.linear"): False,
                        ("kv_a_proj_with_mqa", "aten.linear"): False,
                        ("q_b_proj", "aten.linear"): True,
                        ("self_attn", "aten.matmul"): True,
                        ("self_attn", "aten.scaled_dot_product_attention"): True,
                        ("o_proj", "aten.linear"): True}
    sdpa = next(n for n in attention if n.packet == "aten.scaled_dot_product_attention")
    key = graph.spec(list(sdpa.input_refs())[1])
    assert key is not None and key.shape == (2, 1, 101, LATENT)      # the latent, read once


def test_the_first_dense_layers_are_captured_once_and_counted_k_times() -> None:
    from fxlens.analyzer.capture.hf_decode import layers_standing_for, with_layers

    module = load_preset("deepseek-v3", {"num_hidden_layers": "5"}, batch=1, seq_len=8).module
    full = load_preset("deepseek-v3", {}, batch=1, seq_len=8).module
    assert layers_standing_for(module) == (3, 2)
    assert layers_standing_for(full) == (3, 58)
    small: torch.nn.Module = with_layers(full, 2)
    mlps = [type(layer.mlp).__name__ for layer in small.model.layers]  # type: ignore[union-attr]
    assert mlps == ["DeepseekV3MLP", "DeepseekV3MoE"]
    dense = load_preset("llama-3-8b", {"num_hidden_layers": "4"}, batch=1, seq_len=8).module
    assert layers_standing_for(dense) == (1, 3)


@pytest.mark.parametrize("family", ["DeepseekV2", pytest.param("MiniCPM3", marks=pytest.mark.slow)])
def test_other_mla_families_decode_against_their_latent(family: str) -> None:
    """DeepSeek-V2 (complex rotary, no query LoRA) and MiniCPM3 (dense) share the latent cache
    and ``expand_kv``: their decode attention reads the one-head latent too."""
    import transformers

    from fxlens.analyzer.capture.chain import capture
    from fxlens.analyzer.capture.hf_decode import decode_inputs, decode_step, with_layers
    from fxlens.rules import load_rules
    from fxlens.rules.kv_layouts import layers_from_config

    config = getattr(transformers, f"{family}Config")(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1)
    with torch.device("meta"):
        model = getattr(transformers, f"{family}ForCausalLM")(config)
    small = with_layers(model, 2)
    graph = capture(decode_step(small), decode_inputs(small, 2, 100, layers_from_config(
        small.config)), load_rules())
    keys = [graph.spec(list(n.input_refs())[1]) for n in graph.nodes
            if n.packet == "aten.scaled_dot_product_attention"]
    assert [k.shape for k in keys if k is not None] == [(2, 1, 101, 32 + 8)] * 2


def test_a_shared_latent_is_read_whole_while_its_queries_split() -> None:
    """Under tp = 8 a decode attention's FLOPs and its per-sequence bytes (queries, outputs)
    split with the heads; the bytes growing with the context (the one-head latent) do not."""
    from fxlens.analyzer.serve.kernels import Kernel, Point, fit
    from fxlens.analyzer.serve.steps import sharded

    def kernels(batch: int, context: int) -> tuple[Kernel, ...]:
        return (Kernel("attention", "self_attn", "bf16", "", 10.0 * batch * context,
                       100 + 7 * batch + 3 * batch * context),)

    step = fit([Point(b, c, kernels(b, c)) for b in (2, 4) for c in (10, 20)])
    flops, moved = sharded(step, [8], [8], [1]).work(5, 100)
    assert flops.tolist() == pytest.approx([10 * 5 * 100 / 8])
    assert moved.tolist() == pytest.approx([(100 + 7 * 5) / 8 + 3 * 5 * 100])
    whole = sharded(step, [8], [8]).work(5, 100)[1]           # a cache split by KV heads
    assert whole.tolist() == pytest.approx([(100 + 7 * 5 + 3 * 5 * 100) / 8])
