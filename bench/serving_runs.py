"""Published LLM serving measurements to validate the `--serve` estimate against (issue 31).

Data only: every row is one measurement read in a public source that nobody on this project
made, with the setup the source states. Nothing here is estimated, fitted or interpolated; the
one arithmetic step is noted where it happens (the TensorRT-LLM v0.9.0 tables publish output
tokens/s *per GPU*; `output_tokens_per_s` is always the whole system, so for TP > 1 rows it is
the published per-GPU figure × the GPU count, and the note gives the published figure).

How the rows were chosen: rows whose setup is stated in full (model, GPU kind and count, TP,
weight and KV precision, fixed input/output lengths, batch or concurrency, batching mode) were
preferred; within a table a spread of models, lengths, precisions and TP degrees was taken
rather than every cell. GPU names are fxlens's (`fxlens.rules.hardware`: "h100" = H100 SXM
80 GB, "a100" = the alias of "a100-80gb", A100 SXM4 80 GB, "h200" = H200 SXM 141 GB). "l40s" is
not in fxlens's device registry yet; its rows are kept for when it is. Model names are fxlens
`hf:` preset names where one exists; llama-2-13b, llama-2-70b, llama-3.1-70b and llama-3.3-70b
have no preset yet (same architecture as llama-3-70b for the last two, with llama3 RoPE
scaling and 131,072 positions).

Sources (all NVIDIA-published; no table-form vLLM/SGLang/MLPerf/paper figure with a fully
stated fixed-length setup could be read in the time available, see the session report):

- TensorRT-LLM v0.9.0 `docs/source/performance.md` ("Peak Throughput" and "Low Latency"
  tables). STATIC batching: `gptSessionBenchmark` runs the whole batch through prefill, then
  decodes all of it for exactly `output_len` tokens (paged KV cache disabled). Models are
  Llama-2 ("LLaMA 7B/70B" in the table; the page's methodology builds Llama2-7b/Llama2-70b).
  H100/H200/L40S: FP8 weights and FP8 KV cache (`quant_algo` and `kv_cache_quant_algo` FP8);
  A100: FP16 with both quantization fields removed. First-token rows: batch 1, output 1 token.
  Caveat: the page's build commands show `--max_batch_size 64` while the tables list batches
  up to 1024; the table's batch is recorded.
- TensorRT-LLM v0.13.0 `docs/source/performance/perf-overview.md`. IN-FLIGHT batching at
  maximum load (`trtllm-bench throughput`: every request queued at once, infinite rate;
  3,000 requests at 1000/1000, 1,500 at 2048/2048, 30,000 at 128/128, ...). Concurrency is
  not stated: the runtime admits as many requests as the KV cache holds (example shows
  "Max Runtime Batch Size: 4096, Max Runtime Tokens: 8192, Scheduling Policy: Guaranteed No
  Evict"), so `batch` is None — the estimate's own maximum load belongs there. "Token Throughput"
  is output tokens/s of the whole system (the page's example: 3,000 × 128 / 16.41 s).
  FP8 rows: "If you specify FP8 quantization, the KV cache will automatically be set to FP8".
  FP16 rows: engines built without quantization (KV FP16).
- TensorRT-LLM main `docs/source/performance/perf-overview.md` (PyTorch backend, v1.x).
  Same in-flight max-load method; ModelOpt FP8 checkpoints (nvidia/*-FP8); the KV dtype is not
  stated on the page (kv_dtype None); `--kv_cache_free_gpu_mem_fraction` 0.95 "in many cases".
  Every H100 and H200 cell of its tables for models with an fxlens preset is a row
  (`_PERF_MAIN`: Llama 3.1 8B, 3.3 70B, 3.1 405B, and Qwen3-235B-A22B, whose MoE command
  line is `--tp 8 --ep 8`: attention tensor-parallel, the experts split 8 ways; `_MOE_TP`).
- TensorRT-LLM's DeepSeek-R1 best-practice blog, "H200 max-throughput" (`_DSR1`).
- TensorRT-LLM blog `docs/source/blogs/H200launch.md` (v0.5.0, "H200 FP8 Max throughput").
- NVIDIA NIM for LLMs benchmarking guide 1.0.0, "Performance" (NIM 1.8.0, AIPerf client):
  fixed concurrency C (C requests in flight, continuous batching), TTFT, ITL and output
  tokens/s per concurrency. ITL is recorded as `tpot_s`.

Caveats for comparing an estimate with these rows:
- Throughput-mode rows (static batch at the largest batch that fits, or in-flight at maximum
  load) report tokens/s only; their TTFT is queueing-dominated and is not published.
  Latency-mode rows (batch 1, or NIM at low concurrency) report TTFT/TPOT.
- Static-batch throughput includes the prefill of the whole batch in the elapsed time; in-flight
  throughput at max load mixes prefill and decode steps (chunked/overlapped) and its effective
  batch changes as requests finish.
- Engine versions differ by up to two years; the same cell moves by 10-30 % between versions
  (compare the v0.9.0 and v0.13.0 Llama-2 rows), which bounds what any estimate can match.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServingRun:
    """One published serving measurement (see the module docstring for the conventions)."""

    source: str                         # citation: URL or repo@path, and the table/section
    engine: str                         # engine and version as the source states it
    gpu: str                            # fxlens device name: "h100", "a100", "h200", "l40s"
    gpus: int                           # GPUs in the measured system
    tp: int                             # tensor-parallel degree
    model: str                          # fxlens preset name (or the name a preset should get)
    weights: str                        # "fp16", "bf16", "fp8", "fp8-dense" (experts 16-bit), ...
    kv_dtype: str | None                # KV-cache dtype; None where the source does not state it
    input_len: int                      # prompt tokens per request (fixed in every row here)
    output_len: int                     # generated tokens per request
    batch: int | None                   # static batch or concurrency; None: max load, unstated
    batching: str                       # "static" or "inflight"
    output_tokens_per_s: float | None   # whole system (all GPUs)
    ttft_s: float | None                # time to first token
    tpot_s: float | None                # time per output token (NIM: inter-token latency)
    note: str = ""
    attention_dp: bool = False          # attention data-parallel, experts expert-parallel
    caps: tuple[int, int] | None = None  # (max_num_tokens, max_batch_size) the run set


_TRT09 = ("NVIDIA/TensorRT-LLM v0.9.0, docs/source/performance.md "
          "(https://github.com/NVIDIA/TensorRT-LLM/blob/v0.9.0/docs/source/performance.md; "
          "the version stating 'All data was generated using version 0.9.0')")
_TRT09_THR = _TRT09 + ", Peak Throughput, "
_TRT09_LAT = _TRT09 + ", Low Latency (batch 1, 1st Token Latency), "
_E09 = "TensorRT-LLM 0.9.0 (gptSessionBenchmark)"

_REL10 = ("NVIDIA/TensorRT-LLM docs/source/release-notes.md, 'TensorRT-LLM Release 0.10.0', "
          "Key Features and Enhancements: 'Added FP8 quantization support for Mixtral.'")

_TRT13 = ("NVIDIA/TensorRT-LLM v0.13.0, docs/source/performance/perf-overview.md "
          "(https://github.com/NVIDIA/TensorRT-LLM/blob/v0.13.0/docs/source/performance/"
          "perf-overview.md; 'All data in the table below was generated using version 0.13.0'), "
          "Throughput Measurements table, ")
_E13 = "TensorRT-LLM 0.13.0 (trtllm-bench throughput)"

_TRTMAIN = ("NVIDIA/TensorRT-LLM@00f37686aa854010d68bcbd0f4ab000221541ca6 "
            "docs/source/performance/perf-overview.md "
            "(https://nvidia.github.io/TensorRT-LLM/performance/perf-overview.html), "
            "Throughput Measurements, ")
_EMAIN = "TensorRT-LLM 1.x PyTorch backend (trtllm-bench throughput)"

_H200 = ("NVIDIA/TensorRT-LLM@1555478c1b417a0b34de05209862ea5a2ab9add1 "
         "docs/source/blogs/H200launch.md, table 'H200 FP8 Max throughput'")

_NIM = ("https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance.md, "
        "Llama-3.3-70b-instruct Results, Version: 1.8.0, 2 x H100 80G, fp8 TP2, ")
_ENIM = "NVIDIA NIM for LLMs 1.8.0 (AIPerf client)"

_MAXLOAD = "in-flight at max load; concurrency not stated (KV-capacity bound)"

# TensorRT-LLM main's perf overview (`_TRTMAIN`), the H100 and H200 columns of its tables for
# models with a preset (Llama 3.1 8B, 3.3 70B, 3.1 405B; Qwen3-235B-A22B), output tokens/s of
# the whole system by (input, output) length, as the page prints them
_PERF_MAIN: dict[tuple[str, str, str, int], dict[tuple[int, int], int]] = {
    ("llama-3.1-8b", "Llama 3.1 8B", "h200", 1): {
        (128, 128): 27911, (128, 2048): 26221, (128, 4096): 18027, (500, 2000): 20770,
        (1000, 1000): 17744, (1000, 2000): 16828, (2048, 128): 3538, (2048, 2048): 12194,
        (5000, 500): 3902, (20000, 2000): 1804},
    ("llama-3.1-8b", "Llama 3.1 8B", "h100", 1): {
        (128, 128): 28312, (128, 2048): 22714, (128, 4096): 14325, (500, 2000): 17660,
        (1000, 1000): 15220, (1000, 2000): 13899, (2048, 128): 3450, (2048, 2048): 9305,
        (5000, 500): 3459, (20000, 2000): 1351},
    ("llama-3.3-70b", "Llama 3.3 70B", "h200", 1): {
        (128, 128): 3803, (128, 2048): 4336, (128, 4096): 2872, (500, 2000): 3666,
        (1000, 1000): 2909, (1000, 2000): 2994, (2048, 128): 442, (2048, 2048): 2003,
        (5000, 500): 566, (20000, 2000): 283},
    ("llama-3.3-70b", "Llama 3.3 70B", "h100", 2): {
        (128, 128): 6378, (128, 2048): 6651, (128, 4096): 4199, (500, 2000): 5222,
        (1000, 1000): 4205, (1000, 2000): 4146, (2048, 128): 762, (2048, 2048): 3082,
        (5000, 500): 898, (20000, 2000): 437},
    ("llama-3.1-405b", "Llama 3.1 405B", "h200", 8): {
        (128, 128): 3814, (128, 2048): 5348, (128, 4096): 4741, (500, 2000): 4724,
        (1000, 1000): 3330, (1000, 2000): 3722, (2048, 128): 456, (2048, 2048): 2948,
        (5000, 500): 650, (20000, 2000): 505},
    ("llama-3.1-405b", "Llama 3.1 405B", "h100", 8): {
        (128, 128): 3627, (128, 2048): 4340, (128, 4096): 3116, (500, 2000): 3994,
        (1000, 1000): 2919, (1000, 2000): 2895, (2048, 128): 453, (2048, 2048): 2296,
        (5000, 500): 610, (20000, 2000): 345},
    # MoE: the page's MoE command line (`--tp 8 --ep 8`; `_MOE_TP`); H100 prints no
    # 128/128, 2048/128 or 20000/2000 cell
    ("qwen3-235b-a22b", "Qwen3-235B-A22B", "h200", 8): {
        (128, 128): 30429, (128, 2048): 42821, (128, 4096): 26852, (500, 2000): 28026,
        (1000, 1000): 23789, (1000, 2000): 22061, (2048, 128): 3331, (2048, 2048): 16672,
        (5000, 500): 3623, (20000, 2000): 1876},
    ("qwen3-235b-a22b", "Qwen3-235B-A22B", "h100", 8): {
        (128, 2048): 19658, (128, 4096): 12447, (500, 2000): 18351, (1000, 1000): 14898,
        (1000, 2000): 15136, (2048, 2048): 9924, (5000, 500): 3225},
}
# the cells of those tables already among the rows (with their own notes)
_ROWS_ABOVE = {("llama-3.1-8b", "h100", 1000, 1000), ("llama-3.1-8b", "h100", 20000, 2000),
               ("llama-3.1-8b", "h200", 5000, 500), ("llama-3.3-70b", "h100", 1000, 1000),
               ("llama-3.3-70b", "h200", 1000, 1000)}

_DSR1 = ("NVIDIA/TensorRT-LLM@f0c873f5ffdd170c9f5b70c844c02ecca9860b8f docs/source/blogs/"
         "Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md, 'H200 max-throughput' "
         "(Batch = 1024, ISL = 1K, OSL = 2K, 5,120 requests of a synthetic token-norm-dist "
         "dataset with stdev 0), Total Output Throughput")
_EDSR1 = "TensorRT-LLM PyTorch backend (trtllm-bench throughput, enable_attention_dp, EP 8)"

# The page's MoE yaml puts `enable_attention_dp: true` inside `cuda_graph_config`, which the
# LLM API of that release rejects (`CudaGraphConfig` is a `StrictBaseModel`, extra="forbid":
# NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py), so the runs cannot have used it as
# printed; what the page states without doubt is the command line, `--tp 8 --ep 8`, whose
# default keeps attention tensor-parallel (`enable_attention_dp` False). In fxlens that is
# `--tp 8`: an expert split by its width over 8 GPUs or whole on one of them costs each GPU
# the same FLOPs and expected bytes, and one all-reduce of the tokens' hidden states per MoE
# layer either way. (Read as attention DP instead, `--attention-dp`, 1 of the 17 cells is
# within ±25 %: bench/README.md.)
_MOE_TP = ("nvidia/Qwen3-235B-A22B-FP8; the page's MoE command line --tp 8 --ep 8 (its yaml's "
           "enable_attention_dp sits where the LLM API rejects it); " + _MAXLOAD)


RUNS: tuple[ServingRun, ...] = (
    # --- TensorRT-LLM v0.9.0, static batch, throughput mode -------------------------------
    ServingRun(_TRT09_THR + "H100 GPUs (FP8), LLaMA 7B", _E09, "h100", 1, 1, "llama-2-7b",
               "fp8", "fp8", 128, 128, 896, "static", 19854.0, None, None,
               "published 19,854 out tok/s/GPU"),
    ServingRun(_TRT09_THR + "H100 GPUs (FP8), LLaMA 7B", _E09, "h100", 1, 1, "llama-2-7b",
               "fp8", "fp8", 2048, 2048, 56, "static", 2826.0, None, None,
               "published 2,826 out tok/s/GPU"),
    ServingRun(_TRT09_THR + "H100 GPUs (FP8), LLaMA 70B", _E09, "h100", 2, 2, "llama-2-70b",
               "fp8", "fp8", 128, 128, 1024, "static", 6428.0, None, None,
               "published 3,214 out tok/s/GPU; × 2 GPUs"),
    ServingRun(_TRT09_THR + "H100 GPUs (FP8), LLaMA 70B", _E09, "h100", 2, 2, "llama-2-70b",
               "fp8", "fp8", 2048, 2048, 64, "static", 2022.0, None, None,
               "published 1,011 out tok/s/GPU; × 2 GPUs"),
    ServingRun(_TRT09_THR + "H100 GPUs (FP8), Mixtral 8x7B", _E09, "h100", 2, 2,
               "mixtral-8x7b", "fp8-dense", "fp8", 128, 128, 512, "static", 10510.0, None,
               None, "published 5,255 out tok/s/GPU; × 2 GPUs; MoE. FP8 dense layers, 16-bit "
               "experts: the v0.9.0 engine had no FP8 MoE (" + _REL10 + ")"),
    ServingRun(_TRT09_THR + "A100 GPUs (FP16), LLaMA 7B", _E09, "a100", 1, 1, "llama-2-7b",
               "fp16", "fp16", 128, 128, 256, "static", 5390.0, None, None,
               "published 5,390 out tok/s/GPU"),
    ServingRun(_TRT09_THR + "A100 GPUs (FP16), LLaMA 7B", _E09, "a100", 1, 1, "llama-2-7b",
               "fp16", "fp16", 2048, 2048, 16, "static", 603.0, None, None,
               "published 603 out tok/s/GPU"),
    ServingRun(_TRT09_THR + "A100 GPUs (FP16), LLaMA 70B", _E09, "a100", 4, 4, "llama-2-70b",
               "fp16", "fp16", 128, 128, 1024, "static", 2744.0, None, None,
               "published 686 out tok/s/GPU; × 4 GPUs"),
    ServingRun(_TRT09_THR + "A100 GPUs (FP16), LLaMA 70B", _E09, "a100", 4, 4, "llama-2-70b",
               "fp16", "fp16", 2048, 2048, 64, "static", 1156.0, None, None,
               "published 289 out tok/s/GPU; × 4 GPUs"),
    ServingRun(_TRT09_THR + "A100 GPUs (FP16), Mistral 7B", _E09, "a100", 1, 1, "mistral-7b",
               "fp16", "fp16", 128, 2048, 120, "static", 3776.0, None, None,
               "published 3,776 out tok/s/GPU; Mistral 7B version not stated (2,176 tokens "
               "stay inside the 4,096 sliding window of v0.1)"),
    ServingRun(_TRT09_THR + "A100 GPUs (FP16), Mixtral 8x7B", _E09, "a100", 2, 2,
               "mixtral-8x7b", "fp16", "fp16", 2048, 128, 64, "static", 638.0, None, None,
               "published 319 out tok/s/GPU; × 2 GPUs; MoE"),
    ServingRun(_TRT09_THR + "H200 GPUs (FP8), LLaMA 70B", _E09, "h200", 1, 1, "llama-2-70b",
               "fp8", "fp8", 2048, 2048, 64, "static", 1458.0, None, None,
               "published 1,458 out tok/s/GPU"),
    ServingRun(_TRT09_THR + "L40S GPUs (FP8), LLaMA 7B", _E09, "l40s", 1, 1, "llama-2-7b",
               "fp8", "fp8", 128, 128, 256, "static", 5885.0, None, None,
               "published 5,885 out tok/s/GPU; l40s not in fxlens's registry yet"),
    # --- TensorRT-LLM v0.9.0, batch 1, time to first token (latency mode) -----------------
    ServingRun(_TRT09_LAT + "A100 GPUs (FP16), LLaMA 7B", _E09, "a100", 1, 1, "llama-2-7b",
               "fp16", "fp16", 2048, 1, 1, "static", None, 0.1324, None, "132.4 ms"),
    ServingRun(_TRT09_LAT + "H100 GPUs (FP8), LLaMA 7B", _E09, "h100", 1, 1, "llama-2-7b",
               "fp8", "fp8", 2048, 1, 1, "static", None, 0.0308, None, "30.8 ms"),
    ServingRun(_TRT09_LAT + "A100 GPUs (FP16), LLaMA 70B", _E09, "a100", 4, 4, "llama-2-70b",
               "fp16", "fp16", 128, 1, 1, "static", None, 0.0456, None, "45.6 ms"),
    ServingRun(_TRT09_LAT + "A100 GPUs (FP16), LLaMA 70B", _E09, "a100", 8, 8, "llama-2-70b",
               "fp16", "fp16", 2048, 1, 1, "static", None, 0.2492, None, "249.2 ms"),
    ServingRun(_TRT09_LAT + "H100 GPUs (FP8), LLaMA 70B", _E09, "h100", 8, 8, "llama-2-70b",
               "fp8", "fp8", 2048, 1, 1, "static", None, 0.0851, None, "85.1 ms"),
    ServingRun(_TRT09_LAT + "H200 GPUs (FP8), LLaMA 70B", _E09, "h200", 4, 4, "llama-2-70b",
               "fp8", "fp8", 2048, 1, 1, "static", None, 0.1030, None, "103.0 ms"),
    # --- TensorRT-LLM v0.5.0 H200 launch blog, throughput mode ----------------------------
    ServingRun(_H200, "TensorRT-LLM 0.5.0", "h200", 1, 1, "llama-2-13b", "fp8", None,
               128, 128, 1024, "static", 11819.0, None, None,
               "published 11,819 out tok/s/GPU, TP1; batch = 'largest batch supported ... by "
               "power of 2'; batching mode not stated on the page (v0.5 benchmarks were "
               "static); KV dtype not stated"),
    # --- TensorRT-LLM v0.13.0, in-flight batching at max load -----------------------------
    ServingRun(_TRT13 + "LLaMA v3.1 8B, A100-SXM4-80GB FP16", _E13, "a100", 1, 1,
               "llama-3.1-8b", "fp16", "fp16", 1000, 1000, None, "inflight", 3592.16, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "LLaMA v3.1 8B, A100-SXM4-80GB FP16", _E13, "a100", 1, 1,
               "llama-3.1-8b", "fp16", "fp16", 2048, 128, None, "inflight", 796.17, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "LLaMA v3.1 8B, H100 80GB HBM3 FP16", _E13, "h100", 1, 1,
               "llama-3.1-8b", "fp16", "fp16", 1000, 1000, None, "inflight", 7160.92, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "LLaMA v3.1 8B, H100 80GB HBM3 FP8", _E13, "h100", 1, 1,
               "llama-3.1-8b", "fp8", "fp8", 1000, 1000, None, "inflight", 13411.43, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "LLaMA v3.1 8B, H200 141GB HBM3 FP8", _E13, "h200", 1, 1,
               "llama-3.1-8b", "fp8", "fp8", 1000, 1000, None, "inflight", 16435.21, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "LLaMA v3.1 8B, L40S FP8", _E13, "l40s", 1, 1, "llama-3.1-8b",
               "fp8", "fp8", 1000, 1000, None, "inflight", 3648.21, None, None,
               _MAXLOAD + "; l40s not in fxlens's registry yet"),
    ServingRun(_TRT13 + "LLaMA v2 7B, A100-SXM4-80GB FP16", _E13, "a100", 1, 1, "llama-2-7b",
               "fp16", "fp16", 2048, 2048, None, "inflight", 734.38, None, None,
               _MAXLOAD + "; compare the v0.9.0 static row at batch 16 (603)"),
    ServingRun(_TRT13 + "LLaMA v3.1 70B, A100-SXM4-80GB FP16, TP 4", _E13, "a100", 4, 4,
               "llama-3.1-70b", "fp16", "fp16", 500, 2000, None, "inflight", 2072.88, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "LLaMA v3.1 70B, H100 80GB HBM3 FP8, TP 2", _E13, "h100", 2, 2,
               "llama-3.1-70b", "fp8", "fp8", 128, 128, None, "inflight", 5215.12, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "LLaMA v2 70B, H100 80GB HBM3 FP16, TP 4", _E13, "h100", 4, 4,
               "llama-2-70b", "fp16", "fp16", 1000, 1000, None, "inflight", 3866.05, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "LLaMA v2 70B, A100-SXM4-80GB FP16, TP 8", _E13, "a100", 8, 8,
               "llama-2-70b", "fp16", "fp16", 2048, 2048, None, "inflight", 2492.09, None,
               None, _MAXLOAD),
    ServingRun(_TRT13 + "Mixtral 8x7B, A100-SXM4-80GB FP16, TP 2", _E13, "a100", 2, 2,
               "mixtral-8x7b", "fp16", "fp16", 128, 128, None, "inflight", 5927.88, None,
               None, _MAXLOAD + "; MoE"),
    # --- TensorRT-LLM main (PyTorch backend), in-flight at max load -----------------------
    ServingRun(_TRTMAIN + "Llama 3.1 8B, H100 TP1 (FP8)", _EMAIN, "h100", 1, 1,
               "llama-3.1-8b", "fp8", None, 1000, 1000, None, "inflight", 15220.0, None, None,
               _MAXLOAD + "; nvidia/Llama-3.1-8B-Instruct-FP8"),
    ServingRun(_TRTMAIN + "Llama 3.1 8B, H100 TP1 (FP8)", _EMAIN, "h100", 1, 1,
               "llama-3.1-8b", "fp8", None, 20000, 2000, None, "inflight", 1351.0, None, None,
               _MAXLOAD + "; long context (22k tokens per request)"),
    ServingRun(_TRTMAIN + "Llama 3.1 8B, H200 TP1 (FP8)", _EMAIN, "h200", 1, 1,
               "llama-3.1-8b", "fp8", None, 5000, 500, None, "inflight", 3902.0, None, None,
               _MAXLOAD),
    ServingRun(_TRTMAIN + "Llama 3.3 70B, H100 TP2 (FP8)", _EMAIN, "h100", 2, 2,
               "llama-3.3-70b", "fp8", None, 1000, 1000, None, "inflight", 4205.0, None, None,
               _MAXLOAD + "; nvidia/Llama-3.3-70B-Instruct-FP8"),
    ServingRun(_TRTMAIN + "Llama 3.3 70B, H200 TP1 (FP8)", _EMAIN, "h200", 1, 1,
               "llama-3.3-70b", "fp8", None, 1000, 1000, None, "inflight", 2909.0, None, None,
               _MAXLOAD + "; 70B FP8 on one GPU"),
    # --- NVIDIA NIM 1.8.0, fixed concurrency (latency and throughput together) ------------
    ServingRun(_NIM + "5000 Input Tokens / 500 Output Tokens, Concurrency 1", _ENIM, "h100",
               2, 2, "llama-3.3-70b", "fp8", None, 5000, 500, 1, "inflight", 51.67, 0.40677,
               0.01858, "TTFT 406.77 ms, ITL 18.58 ms; backend and KV dtype not stated"),
    ServingRun(_NIM + "5000 Input Tokens / 500 Output Tokens, Concurrency 25", _ENIM, "h100",
               2, 2, "llama-3.3-70b", "fp8", None, 5000, 500, 25, "inflight", 623.4, 0.68869,
               0.03875, "TTFT 688.69 ms, ITL 38.75 ms"),
    ServingRun(_NIM + "5000 Input Tokens / 500 Output Tokens, Concurrency 50", _ENIM, "h100",
               2, 2, "llama-3.3-70b", "fp8", None, 5000, 500, 50, "inflight", 814.37, 0.83451,
               0.05973, "TTFT 834.51 ms, ITL 59.73 ms; at concurrency 100 TTFT jumps to "
               "7,996 ms (queueing): capacity lies between 50 and 100 requests"),
    ServingRun(_NIM + "500 Input Tokens / 2000 Output Tokens, Concurrency 1", _ENIM, "h100",
               2, 2, "llama-3.3-70b", "fp8", None, 500, 2000, 1, "inflight", 52.85, 0.04777,
               0.01891, "TTFT 47.77 ms, ITL 18.91 ms"),
    # --- TensorRT-LLM main: every other H100/H200 cell of its Llama and Qwen3-235B tables ----
    *(ServingRun(_TRTMAIN + f"{title}, {gpu.upper()} TP{tp} (FP8), {isl}/{osl}", _EMAIN, gpu,
                 tp, tp, model, "fp8", None, isl, osl, None, "inflight", float(rate), None,
                 None, _MOE_TP if moe else _MAXLOAD + "; the same table as the rows above")
      for (model, title, gpu, tp), cells in _PERF_MAIN.items()
      for moe in [model.startswith("qwen3")]
      for (isl, osl), rate in cells.items()
      if (model, gpu, isl, osl) not in _ROWS_ABOVE),
    # --- DeepSeek-R1 (MLA, MoE), attention data-parallel with expert parallelism ----------
    ServingRun(_DSR1, _EDSR1, "h200", 8, 8, "deepseek-v3", "fp8", "bf16", 1024, 2048, 1024,
               "inflight", 11489.2671, None, None,
               "deepseek-ai/DeepSeek-R1 (its own block-scaled FP8 weights; DeepSeek-V3's "
               "architecture, fxlens's deepseek-v3 preset); --concurrency 1024 with "
               "--max_batch_size 128 per rank over 8 ranks and --max_num_tokens 1151; the KV "
               "dtype is not set, so the checkpoint's BF16 (the same page notes FP8 KV was "
               "enabled by default only in the later R1-0528-FP4 checkpoint)",
               attention_dp=True, caps=(1151, 128)),
)
