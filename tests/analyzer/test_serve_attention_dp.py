"""``--serve --tp N --attention-dp``: attention and dense layers data-parallel over the N GPUs
(each its own requests and their KV cache, the weights whole), the routed experts split N
ways over every rank's tokens, one gather and scatter of the hidden states per MoE layer
(`fxlens.analyzer.serve.attention_dp`)."""

from __future__ import annotations

import pytest
import torch

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.core.sections import Serve
from fxlens.analyzer.serve.attention_dp import attention_data_parallel, exchange_step
from fxlens.analyzer.serve.kernels import Kernel, Point, fit
from fxlens.cli.main import main
from fxlens.pipeline import AnalysisOptions, run_pipeline

MOE = {"num_hidden_layers": "3", "hidden_size": "256", "intermediate_size": "512",
       "num_attention_heads": "4", "num_key_value_heads": "2", "vocab_size": "1024",
       "max_position_embeddings": "4096", "num_local_experts": "8", "num_experts_per_tok": "2"}


def _step(batch: int, context: int) -> tuple[Kernel, ...]:
    """An attention kernel (weights 100, 10 a sequence, 1 a cached token) and an expert
    GEMM (weights 8,000, 50 a token)."""
    return (Kernel("attn", "layers.0.self_attn", "bf16", "", 0.0,
                   100 + 10 * batch + batch * context),
            Kernel("aten._grouped_mm.default", "layers.0.mlp.experts", "bf16", "", 0.0,
                   8000 + 50 * batch))


def test_the_busiest_rank_runs_its_share_and_the_experts_split_over_every_token() -> None:
    step = fit([Point(b, c, _step(b, c)) for b in (2, 4) for c in (10, 20)])
    dp = attention_data_parallel(step, [False, True], ranks=4)
    # whole requests: the busiest rank holds ⌈b/4⌉ (a lone request runs whole on one GPU);
    # an in-flight mean over steps spreads evenly, at least min(b, 1)
    for batch, share in ((64, 16), (6, 2), (3, 1), (1, 1), (6.4, 1.6), (0.5, 0.5)):
        _, moved = dp.work(batch, 100)
        assert moved.tolist() == pytest.approx([100 + 10 * share + share * 100,
                                                (8000 + 50 * batch) / 4])
    exchange = exchange_step("experts", 512.0, 7, prefill=False)
    assert exchange.work(64, 100)[1].tolist() == [64 * 512.0]
    assert exchange_step("experts", 512.0, 7, prefill=True).work(3, 100)[1].tolist() == [
        3 * 100 * 512.0]
    assert exchange.weights.tolist() == [7.0]


def _serve(**options: object) -> tuple[Serve, torch.nn.Module]:
    loaded = load_preset("mixtral-8x7b", MOE, batch=1, seq_len=32)
    settings = {"serve": True, "device": "h100", "input_len": 512, "output_len": 64,
                "fusion": False, "serve_batches": (1, 64), **options}
    serve = run_pipeline(loaded, AnalysisOptions(**settings)).get(Serve)   # type: ignore[arg-type]
    assert serve is not None
    return serve, loaded.module


@pytest.mark.slow      # two serving pipelines, ~5 s each
def test_attention_dp_holds_whole_weights_but_the_experts_and_each_gpus_own_requests() -> None:
    one, module = _serve()
    two, _ = _serve(tp=2, attention_dp=True)
    experts = sum(p.numel() * p.element_size() for name, p in module.named_parameters()
                  if ".experts." in name)
    assert one.weights_bytes - two.weights_bytes == experts // 2
    assert two.kv_bytes_per_token == one.kv_bytes_per_token        # a request on one GPU
    room = (two.usable_bytes - two.weights_bytes - two.workspace_bytes
            - two.context_bytes)
    assert two.max_batch == 2 * (room // two.kv_bytes_per_sequence)
    # batch 1 on one GPU reads its whole dense weights and half its share of 2 of 8 experts
    embedding = module.get_input_embeddings().weight
    dense = (sum(p.numel() * p.element_size() for p in module.parameters()) - experts
             - embedding.numel() * embedding.element_size())
    cache = (512 + (64 - 2) / 2) * two.kv_bytes_per_token
    assert two.decode_bytes_per_step == pytest.approx(dense + experts * 2 / 8 / 2 + cache,
                                                      rel=0.02)
    # every decode step gathers and scatters once per MoE layer: 3 calls at NCCL's 7.8 µs
    # over 2 GPUs, what a lone request's step on two GPUs costs over one (less the few
    # expert weights it no longer reads)
    one_1, two_1 = (next(p for p in s.curve if p.batch == 1) for s in (one, two))
    assert two_1.tpot_s - one_1.tpot_s == pytest.approx(3 * 7.8e-6, rel=0.1)
    assert any("attention data-parallel over 2 GPUs" in note for note in two.notes)
    from fxlens.reports.views.serve import serve_verdict

    assert serve_verdict(two).label == "serving on 2× h100 (attention DP 2, experts EP 2)"


@pytest.mark.parametrize(("argv", "said"), [
    (["--serve", "--device", "h100", "--attention-dp"], "add --tp 2 or more"),
    (["--attention-dp"], "--attention-dp lays out serving: add --serve"),
    (["--serve", "--device", "h100", "--tp", "2", "--attention-dp"],
     "LlamaForCausalLM has none (serve one replica per GPU"),
])
def test_attention_dp_without_its_gpus_or_serving_is_one_line(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str],
        tmp_path: object) -> None:
    assert main(["hf:llama-3-8b", *argv, "--out", str(tmp_path), "--no-pages"]) == 2
    error = capsys.readouterr().err
    assert said in error and error.count("\n") <= 1


def test_experts_that_do_not_split_evenly_are_refused(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: object) -> None:
    assert main(["hf:mixtral-8x7b", "--set", "num_hidden_layers=2", "--serve", "--device",
                 "h100", "--tp", "3", "--attention-dp", "--out", str(tmp_path),
                 "--no-pages"]) == 2
    error = capsys.readouterr().err
    assert "8 routed experts do not split evenly over them" in error
    assert error.count("\n") <= 1

