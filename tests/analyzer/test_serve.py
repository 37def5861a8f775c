"""``--serve``: decode steps captured against a cache, timed at any batch and context, capacity
by the closed form, the curve, the formats (`fxlens.analyzer.serve`, `fxlens.serve_pass`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from itertools import pairwise

import pytest
import torch

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.sections import Serve
from fxlens.analyzer.serve.estimate import ServeMemory, ServeRequest, serve_section
from fxlens.analyzer.serve.kernels import Kernel, Point, ShapeError, fit
from fxlens.analyzer.serve.steps import Steps
from fxlens.cli.main import main
from fxlens.pipeline import AnalysisOptions, run_pipeline
from fxlens.rules.hardware import device

SMALL = {"num_hidden_layers": "3", "hidden_size": "256", "intermediate_size": "512",
         "num_attention_heads": "4", "num_key_value_heads": "2", "vocab_size": "1024",
         "max_position_embeddings": "4096"}


@functools.cache
def _serve(**options: object) -> tuple[Serve, torch.nn.Module]:
    """The small Llama served with `options`; each pipeline runs once per process (tests only
    read the section and the module)."""
    loaded = load_preset("llama-3-8b", SMALL, batch=1, seq_len=32)
    settings = {"serve": True, "device": "h100", "input_len": 512, "output_len": 64,
                "fusion": False, **options}
    serve = run_pipeline(loaded, AnalysisOptions(**settings)).get(Serve)   # type: ignore[arg-type]
    assert serve is not None
    return serve, loaded.module


def _kernels(batch: int, context: int, coefficients: list[tuple[float, ...]]
             ) -> tuple[Kernel, ...]:
    return tuple(Kernel(f"op{i}", f"m{i}", "bf16", "", a + b * batch + c * context
                        + d * batch * context, 2 * a + b + 3 * c * context + d * batch * context)
                 for i, (a, b, c, d) in enumerate(coefficients))


def test_four_captures_give_the_bilinear_work_exactly() -> None:
    truth = [(7.0, 3.0, 0.5, 0.25), (0.0, 11.0, 0.0, 2.0)]
    step = fit([Point(b, c, _kernels(b, c, truth)) for b in (2, 4) for c in (100, 164)])
    for batch, context in ((1, 1), (64, 9000), (3, 100)):
        flops, moved = step.work(batch, context)
        expected = _kernels(batch, context, truth)
        assert flops.tolist() == pytest.approx([k.flops for k in expected])
        assert moved.tolist() == pytest.approx([k.bytes for k in expected])


def test_captures_of_different_graphs_are_refused() -> None:
    truth = [(1.0, 1.0, 0.0, 0.0)]
    other = (Kernel("other", "m0", "bf16", "", 1.0, 1.0),)
    with pytest.raises(ShapeError, match="batch 4"):
        fit([Point(2, 10, _kernels(2, 10, truth)), Point(4, 10, other)])


def test_max_batch_is_free_memory_over_the_blocks_of_a_request() -> None:
    step = fit([Point(b, 7, _kernels(b, 7, [(1e9, 1e6, 0.0, 1e3)])) for b in (2, 4)])
    memory = ServeMemory(device_bytes=80 * 2**30, weights_bytes=16 * 2**30,
                         workspace_bytes=300 * 2**20, kv_bytes_per_token=131072)
    serve = serve_section(Steps(step, step), device("h100"), 32,
                          ServeRequest(input_len=1000, output_len=37), memory)
    per_request = math.ceil(1037 / 16) * 16 * 131072
    free = int(80 * 2**30 * 0.9) - 16 * 2**30 - 300 * 2**20
    assert serve.kv_bytes_per_sequence == per_request
    assert serve.max_batch == free // per_request
    assert serve.block_waste_bytes == (math.ceil(1037 / 16) * 16 - 1037) * 131072
    assert serve.curve[-1].batch == serve.max_batch and serve.curve[-1].fits
    # the process's CUDA context sits inside the engine's share (vLLM's budget holds it)
    held = serve_section(Steps(step, step), device("h100"), 32,
                         ServeRequest(input_len=1000, output_len=37),
                         dataclasses.replace(memory, context_bytes=2**30))
    assert held.max_batch == (free - 2**30) // per_request < serve.max_batch
    assert held.context_bytes == 2**30


@pytest.mark.slow
def test_decode_at_batch_one_reads_the_weights_and_the_cache_once() -> None:
    serve, module = _serve(serve_batches=(1,))
    embedding = module.get_input_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    streamed = weights - embedding.numel() * embedding.element_size()  # one row per token
    middle = 512 + (64 - 2) / 2
    cache = middle * serve.kv_bytes_per_token
    assert serve.decode_bytes_per_step == pytest.approx(streamed + cache, rel=0.02)
    assert serve.kv_bytes_per_token == 3 * 2 * 2 * 64 * 2   # layers · K,V · kv heads · d · bf16


@pytest.mark.slow
def test_throughput_rises_with_the_batch_then_saturates() -> None:
    """Memory-bound at small batches (a doubling almost doubles the rate), compute-bound at
    large ones (the rate levels off): each doubling gains less than the one before."""
    serve, _ = _serve()
    powers = [p for p in serve.curve if p.fits and p.batch & (p.batch - 1) == 0]
    rates = [p.output_tokens_per_s for p in powers]
    assert len(rates) >= 8
    gains = [b / a for a, b in pairwise(rates)]
    assert gains[0] > 1.5 and all(g >= 1 for g in gains)
    assert all(later < earlier for earlier, later in pairwise(gains))
    assert gains[-1] < 1.01
    assert all(b.tpot_s >= a.tpot_s for a, b in pairwise(powers))


@pytest.mark.slow
def test_fp8_weights_and_cache_halve_what_they_store() -> None:
    base, module = _serve(serve_batches=(1,))
    fp8, _ = _serve(serve_batches=(1,), precision="fp8", kv_dtype="fp8")
    linear = sum(m.weight.numel() for name, m in module.named_modules()
                 if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head"))
    assert base.weights_bytes - fp8.weights_bytes == linear       # 2 bytes → 1 per weight
    assert fp8.kv_bytes_per_token * 2 == base.kv_bytes_per_token
    middle = 512 + (64 - 2) / 2
    saved = linear + middle * fp8.kv_bytes_per_token
    assert base.decode_bytes_per_step - fp8.decode_bytes_per_step == pytest.approx(saved,
                                                                                  rel=0.01)
    assert fp8.max_batch > base.max_batch


@pytest.mark.slow
def test_the_slo_picks_the_fastest_batch_that_meets_it() -> None:
    free, _ = _serve()
    target = free.curve[2].tpot_s * 1.0001
    met, _ = _serve(tpot_slo_s=target)
    assert met.batch == max((p for p in met.curve if p.fits and p.tpot_s <= target),
                            key=lambda p: p.output_tokens_per_s).batch


@pytest.mark.parametrize(("argv", "said"), [
    (["hf:llama-3-8b", "--serve"], "add --device"),
    (["hf:llama-3-8b", "--batch", "1,8"], "a list (1,8,32) is for --serve"),
    (["hf:llama-3-8b", "--serve", "--device", "h100", "--precision", "amp-bf16"],
     "serving runs at bf16, fp8"),
    (["hf:llama-3-8b", "--serve", "--device", "h100", "--kv-dtype", "fp4"],
     "--kv-dtype: 'fp4'"),
    (["hf:llama-3-8b", "--serve", "--device", "h100", "--input-len", "8000",
      "--output-len", "500", "--set", "num_hidden_layers=2"],
     "exceed the model's context of 8192"),
    (["hf:bert-base", "--serve", "--device", "h100", "--input-len", "100", "--output-len",
      "10"], "BertForMaskedLM does not generate text"),
    (["hf:t5-small", "--serve", "--device", "h100"], "an encoder-decoder model"),
])
def test_serving_options_that_cannot_work_are_one_line(argv: list[str], said: str,
                                                       capsys: pytest.CaptureFixture[str],
                                                       tmp_path: object) -> None:
    assert main([*argv, "--out", str(tmp_path), "--no-pages"]) == 2
    error = capsys.readouterr().err
    assert said in error and error.count("\n") <= 1


def test_a_model_without_a_config_is_refused() -> None:
    from fxlens.analyzer.capture.hf_decode import check_servable

    with pytest.raises(LoadError, match="no transformers config"):
        check_servable(torch.nn.Linear(2, 2))


def test_a_hybrid_model_is_refused_with_the_option_that_sizes_its_cache() -> None:
    from fxlens.analyzer.capture.hf_decode import check_servable
    from tests.models.hf_zoo_hybrid import build_qwen3_next

    with pytest.raises(LoadError, match="linear_attention .* --kv-cache"):
        check_servable(build_qwen3_next()[0])


@pytest.mark.slow
def test_the_view_draws_the_curve_of_the_batches_that_fit() -> None:
    from fxlens.reports.view import Chart, Detail
    from fxlens.reports.views.serve import serve_view

    loaded = load_preset("llama-3-8b", SMALL, batch=1, seq_len=32)
    report = run_pipeline(loaded, AnalysisOptions(
        serve=True, device="h100", input_len=512, output_len=64, fusion=False,
        serve_batches=(1, 4, 1_000_000)))
    serve, view = report.get(Serve), serve_view(report, Detail())
    assert serve is not None and view is not None
    chart = next(b for b in view.blocks if isinstance(b, Chart))
    fitting = [(p.tpot_s, p.output_tokens_per_s) for p in serve.curve if p.fits]
    assert list(chart.series[0].points) == fitting and len(fitting) == 3   # 1, 4, max_batch
    assert chart.marks[0].label == f"batch {serve.batch}"
    assert not serve.curve[-1].fits and serve.curve[-1].batch == 1_000_000


@pytest.mark.slow
def test_tensor_parallel_splits_the_linear_work_and_all_reduces_twice_per_layer() -> None:
    """tp=2: each GPU holds half the linear weights and half the cache; a decode step moves
    the split kernels' bytes ÷ 2 and all-reduces the two row-parallel outputs of every layer
    (batch × hidden × 2 bytes each) at ring cost 2(t−1)/t over NVLink."""
    one, module = _serve(serve_batches=(1,))
    two, _ = _serve(serve_batches=(1,), tp=2)
    linear = sum(m.weight.numel() * 2 for m in module.modules()
                 if isinstance(m, torch.nn.Linear))
    assert one.weights_bytes - two.weights_bytes == linear // 2
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.max_batch > one.max_batch
    # a model this small decodes in 2 µs: its 6 all-reduce calls' latency (NCCL's 6.6 µs base
    # + 2 NVLink steps × 0.6 µs each) is most of a step over two GPUs
    assert 6 * 7.8e-6 < two.tpot_s < one.tpot_s + 6 * 7.8e-6
    assert "tensor parallel over 2 GPUs" in " ".join(two.notes)
    assert "7.8 µs per call" in " ".join(two.notes)
    assert "routed experts" not in " ".join(two.notes)           # a dense model
    from fxlens.reports.views.serve import serve_verdict

    assert serve_verdict(two).label == "serving on 2× h100 (TP 2)"
    assert "per request per GPU" in serve_verdict(two).detail


def test_a_decode_step_all_reduces_the_two_row_parallel_outputs_of_each_layer() -> None:
    from fxlens.analyzer.capture.chain import capture
    from fxlens.analyzer.capture.hf_decode import decode_inputs, decode_step, with_layers
    from fxlens.analyzer.plan.forward import forward_split
    from fxlens.rules import load_rules
    from fxlens.rules.kv_layouts import layers_from_config
    from fxlens.rules.parallel import PARALLEL

    small = with_layers(load_preset("llama-3-8b", SMALL, batch=1, seq_len=32).module, 2)
    layout = layers_from_config(small.config)
    graph = capture(decode_step(small), decode_inputs(small, 2, 100, layout), load_rules())
    split = forward_split(graph, PARALLEL)
    rows = sorted(graph.nodes[n].module for n in split.reduce_bytes)
    assert rows == [f"model.model.layers.{i}.{m}" for i in (0, 1)
                    for m in ("mlp.down_proj", "self_attn.o_proj")]
    assert set(split.reduce_bytes.values()) == {2 * 1 * 256 * 2}   # batch · token · hidden · bf16
    split_modules = {graph.nodes[n].module for n in split.split_nodes}
    assert "model.lm_head" in split_modules                           # vocab-parallel head
    assert not any(m.endswith("layernorm") for m in split_modules)   # norms replicated


def test_tensor_parallel_stays_in_one_node(capsys: pytest.CaptureFixture[str],
                                           tmp_path: object) -> None:
    assert main(["hf:llama-3-8b", "--serve", "--device", "h100", "--tp", "16", "--out",
                 str(tmp_path), "--no-pages"]) == 2
    assert "stays inside one node (8 h100 per node)" in capsys.readouterr().err


MOE = {**SMALL, "num_local_experts": "8", "num_experts_per_tok": "2"}


@pytest.mark.slow
def test_a_moe_decode_step_reads_the_experts_its_tokens_route_to() -> None:
    """Mixtral-shaped, 8 experts, top-2: at batch 1 a decode step reads the dense weights,
    2/8 of the experts' and the cache; with 64 sequences 1 − (3/4)^64 of the experts."""
    loaded = load_preset("mixtral-8x7b", MOE, batch=1, seq_len=32)
    serve = run_pipeline(loaded, AnalysisOptions(
        serve=True, device="h100", input_len=512, output_len=64, fusion=False,
        serve_batches=(1,))).get(Serve)
    assert serve is not None
    module = loaded.module
    embedding = module.get_input_embeddings().weight
    experts = sum(p.numel() * p.element_size() for name, p in module.named_parameters()
                  if ".experts." in name)
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    dense = weights - experts - embedding.numel() * embedding.element_size()
    cache = (512 + (64 - 2) / 2) * serve.kv_bytes_per_token
    assert serve.decode_bytes_per_step == pytest.approx(dense + experts * 2 / 8 + cache,
                                                        rel=0.02)
    assert any("E·(1 − (1 − k/E)^tokens) of E = 8" in note for note in serve.notes)


def test_fp8_dense_reduces_the_linear_layers_and_leaves_the_experts_at_16_bits() -> None:
    """``fp8-dense``: the linear GEMMs in FP8 (lm_head kept), the experts' grouped GEMMs not;
    ``fp8`` reduces both; a mixed step shares the experts' weights under either."""
    from fxlens.rules.serving import WEIGHT_FORMATS
    from fxlens.serve_pass import _reads_weights, _reduced_by

    linear, head = Kernel("aten.linear.default", "layers.0.mlp.up_proj", "bf16", "", 0, 0), \
        Kernel("aten.linear.default", "lm_head", "bf16", "", 0, 0)
    experts = Kernel("aten._grouped_mm.default", "layers.0.mlp.experts", "bf16", "", 0, 0)
    dense, full = _reduced_by(WEIGHT_FORMATS["fp8-dense"]), _reduced_by(WEIGHT_FORMATS["fp8"])
    assert [dense(k) for k in (linear, head, experts)] == [True, False, False]
    assert [full(k) for k in (linear, head, experts)] == [True, False, True]
    assert _reads_weights(experts) and _reads_weights(linear)
    assert WEIGHT_FORMATS["fp8-dense"].bytes_per_weight == 1.0


@pytest.mark.slow
def test_fp8_dense_stores_a_moe_models_linear_layers_in_one_byte_and_its_experts_in_two(
        ) -> None:
    """Mixtral-shaped: against bf16, ``fp8-dense`` saves one byte per weight of every linear
    layer but lm_head (the router's gate included) and none of the experts'; ``fp8`` saves
    the experts' byte as well."""
    loaded = load_preset("mixtral-8x7b", MOE, batch=1, seq_len=32)
    options = {"serve": True, "device": "h100", "input_len": 256, "output_len": 16,
               "fusion": False, "serve_batches": (1,)}
    served = {p: run_pipeline(loaded, AnalysisOptions(**options, precision=p)).get(Serve)
              for p in (None, "fp8-dense", "fp8")}                # type: ignore[arg-type]
    module = loaded.module
    linear = sum(m.weight.numel() for name, m in module.named_modules()
                 if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head"))
    experts = sum(p.numel() for name, p in module.named_parameters() if ".experts." in name)
    base, dense, full = (served[p] for p in (None, "fp8-dense", "fp8"))
    assert base and dense and full
    assert base.weights_bytes - dense.weights_bytes == linear
    assert base.weights_bytes - full.weights_bytes == linear + experts
    assert dense.weights_format == "fp8-dense"


@pytest.mark.slow
def test_weight_only_formats_read_packed_weights_and_their_group_scales() -> None:
    """w4a16: every linear weight but lm_head in 4 bits plus a 16-bit scale per 128 (0.516
    bytes), read once per decode step; w8a16 1.016 bytes; the GEMMs stay at 16 bits, so a
    compute-bound prefill is as long as at bf16."""
    base, module = _serve(serve_batches=(1,))
    linear = sum(m.weight.numel() for name, m in module.named_modules()
                 if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head"))
    for precision, per_weight in (("w4a16", 0.5 + 2 / 128), ("w8a16", 1 + 2 / 128)):
        packed, _ = _serve(serve_batches=(1,), precision=precision)
        saved = linear * (2 - per_weight)
        assert base.weights_bytes - packed.weights_bytes == pytest.approx(saved, abs=1)
        assert base.decode_bytes_per_step - packed.decode_bytes_per_step == pytest.approx(
            saved, rel=0.01)
        assert packed.kv_bytes_per_token == base.kv_bytes_per_token
        assert packed.weights_format == precision


@pytest.mark.slow     # three whole serving pipelines, 5 s each
def test_max_load_keeps_the_most_requests_the_caps_allow_in_flight() -> None:
    """This model's KV cache holds far more than 8,192 tokens a step admit: r = 8192 /
    (512 + 64 − 1) requests a step, r·64 in flight; with --max-num-seqs 100, 100."""
    serve, _ = _serve(serve_batches=(1,))
    load = serve.max_load
    assert load is not None and serve.max_batch > 10_000
    assert load.bound == "max_num_tokens" and (load.max_num_tokens, load.max_num_seqs) == (
        8192, 2048)
    assert load.requests == pytest.approx(8192 / 575 * 64)
    assert load.decodes_per_step + load.prompt_tokens_per_step == pytest.approx(8192)
    capped, _ = _serve(serve_batches=(1,), max_num_seqs=100)
    assert capped.max_load is not None and capped.max_load.bound == "max_num_seqs"
    assert capped.max_load.requests == pytest.approx(100)
    assert capped.max_load.output_tokens_per_s < load.output_tokens_per_s
    point = capped.curve[0]
    assert point.inflight_tokens_per_s == pytest.approx(point.output_tokens_per_s, rel=0.05)
    assert Serve.from_json(json.loads(json.dumps(capped.to_json()))) == capped
    from fxlens.reports.view import Detail, Table
    from fxlens.reports.views.serve import serve_view

    report = run_pipeline(load_preset("llama-3-8b", SMALL, batch=1, seq_len=32), AnalysisOptions(
        serve=True, device="h100", input_len=512, output_len=64, fusion=False,
        serve_batches=(1,), max_num_seqs=100))
    view = serve_view(report, Detail())
    assert view is not None
    titles = [b.title for b in view.blocks if isinstance(b, Table)]
    assert "in-flight batching at maximum load · h100" in titles


@pytest.mark.parametrize(("argv", "said"), [
    (["hf:llama-3-8b", "--precision", "w4a16"], "weight-only serving format: add --serve"),
    (["hf:llama-3-8b", "--precision", "fp8-dense"], "is a serving format: add --serve"),
    (["hf:llama-3-8b", "--serve", "--device", "h100", "--max-num-tokens", "0"],
     "--max-num-tokens"),
])
def test_serving_engine_options_that_cannot_work_are_one_line(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    try:                                        # the parser's own errors exit
        code = main([*argv, "--out", str(tmp_path), "--no-pages"])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    error = capsys.readouterr().err
    assert said in error and error.count("\n") <= 1


def test_the_cli_repeats_the_rules_serving_choices_and_defaults() -> None:
    from fxlens.cli import args
    from fxlens.cli.analyze import build_parser
    from fxlens.rules import serving

    assert args.SERVE_ONLY == serving.SERVE_ONLY
    parsed = build_parser().parse_args(["m.py"])
    assert (parsed.max_num_tokens, parsed.max_num_seqs) == (serving.MAX_NUM_TOKENS,
                                                           serving.MAX_NUM_SEQS)


def test_a_model_serve_cannot_serve_is_refused_before_the_capture(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import fxlens.pipeline

    def no_capture(*_: object, **__: object) -> None:
        raise AssertionError("captured before the refusal")

    monkeypatch.setattr(fxlens.pipeline, "capture", no_capture)
    loaded = load_preset("t5-small", {}, batch=1, seq_len=8)
    with pytest.raises(LoadError, match="encoder-decoder"):
        run_pipeline(loaded, AnalysisOptions(serve=True, device="h100"))


@pytest.mark.slow
def test_a_tensor_parallel_moe_layer_all_reduces_its_tokens_not_their_routed_rows() -> None:
    """Under --tp a MoE layer's experts are all-reduced once their top-k rows are combined:
    the payload is batch × hidden, as attention's, not top-k times it."""
    from types import SimpleNamespace

    from fxlens.analyzer.capture.chain import capture
    from fxlens.analyzer.capture.hf_decode import decode_inputs, decode_step, with_layers
    from fxlens.rules import load_rules
    from fxlens.rules.kv_layouts import layers_from_config
    from fxlens.serve_pass import _affine

    small = with_layers(load_preset("mixtral-8x7b", MOE, batch=1, seq_len=8).module, 2)
    registry = load_rules()
    step = decode_step(small)
    points = [(b, c, capture(step, decode_inputs(small, b, c, layers_from_config(small.config)),
                             registry)) for b in (2, 4) for c in (100, 164)]
    ctx = SimpleNamespace(registry=registry, options=SimpleNamespace(tf32=False))
    _, reduce = _affine(ctx, points, lambda _: 1.0, "model.", [], 2, (8, 2))  # type: ignore[arg-type]
    assert reduce is not None
    payloads = reduce.work(16, 100)[1].tolist()
    modules = [k.module for k in reduce.kernels]
    assert len(payloads) == 4 and all(p == 16 * 256 * 2 for p in payloads), (modules, payloads)


@pytest.mark.slow
def test_a_tensor_parallel_moe_says_its_experts_split_as_expert_parallelism_would() -> None:
    """`--tp 2` on a MoE model: the note says the experts split 2 ways, which costs each GPU
    what expert parallelism over the two would (the page a user compares with runs --ep)."""
    loaded = load_preset("mixtral-8x7b", MOE, batch=1, seq_len=32)
    serve = run_pipeline(loaded, AnalysisOptions(serve=True, device="h100", input_len=128,
                                                 output_len=16, fusion=False, tp=2,
                                                 serve_batches=(1,))).get(Serve)
    assert serve is not None
    (note,) = [n for n in serve.notes if n.startswith("tensor parallel over 2 GPUs")]
    assert "routed experts split 2 ways" in note and "--ep 2" in note
