"""The option groups of ``analyze TARGET`` past loading and output: training step, plan,
roofline, quantization, serving, pruning, pre-merge review, graph and pages — each group's
options, types and help, in the order ``analyze --help`` lists them.

Like `fxlens.cli.analyze`, it imports neither torch nor the engine (`fxlens.cli.args` holds
the choices), so ``analyze --help`` answers at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fxlens.cli.args import (
    ATTENTION_KERNELS,
    LORA_BASES,
    LOSS_DTYPES,
    OPTIMIZERS,
    PRECISIONS,
    SERVE_ONLY,
    count,
    layer_names,
    non_negative_float,
    percent,
    positive_int,
    seconds,
)

CHECKPOINT_MODES = ("blocks", "auto")


def add_option_groups(parser: argparse.ArgumentParser) -> None:
    _training_options(parser)
    _plan_options(parser)
    _roofline_options(parser)
    _quant_options(parser)
    _serve_options(parser)
    _prune_options(parser)
    _review_options(parser)
    _page_options(parser)


def _training_options(parser: argparse.ArgumentParser) -> None:
    training = parser.add_argument_group("training step")
    training.add_argument("--train", action="store_true",
                          help="capture the joint forward+backward graph of one training step")
    training.add_argument("--precision", choices=PRECISIONS + SERVE_ONLY,
                          help="with --serve: fp8, fp8-dense (a MoE model's experts at 16 "
                               "bits), or weight-only w8a16 / w4a16; "
                               "training precision policy: amp-bf16 / amp-fp16 = 16-bit "
                               "weights + fp32 master copy (Megatron, apex O2); autocast-bf16 "
                               "/ autocast-fp16 = torch.autocast over fp32 weights (HF "
                               "Trainer, Accelerate, Lightning); default: fp32 for fp32 "
                               "weights, amp-bf16 / amp-fp16 for 16-bit weights")
    training.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                          help="optimizer whose state is accounted (default adamw)")
    training.add_argument("--loss-dtype", choices=LOSS_DTYPES, default="fp32",
                          help="a transformers causal LM's loss: fp32 (default: transformers' "
                               "own, the logits cast to float32) or logits (the cross-entropy "
                               "in the logits' dtype, as trainers that skip the cast run it: "
                               "NeMo Automodel's fp32_upcast: false)")
    training.add_argument("--mtp", type=int, metavar="N",
                          help="train N multi-token prediction depths beside the LM, as "
                               "DeepSeek-V3 and recipes with mtp_num_layers do (each: a copy "
                               "of the last decoder layer, or of the layer kinds the config's "
                               "mtp_layers_block_type lists, with the shared head and one "
                               "more loss); transformers builds none")
    training.add_argument("--mtp-shared", action="store_true",
                          help="with --mtp N: one depth's weights run N times (Nemotron 3's "
                               "repeated MTP layer)")
    training.add_argument("--lora", type=positive_int, metavar="R",
                          help="LoRA fine-tuning: rank-R adapters on the linear layers (all "
                               "but the output head, or --lora-targets), the model's own "
                               "weights frozen: no weight gradient, gradient or optimizer "
                               "state for them")
    training.add_argument("--lora-targets", type=layer_names, metavar="NAMES",
                          help="with --lora R: the linear layers to adapt, by the tail of "
                               "their name, comma-separated (q_proj,k_proj,v_proj,o_proj or "
                               "mlp.down_proj)")
    training.add_argument("--lora-base", choices=LORA_BASES,
                          help="with --lora R: the frozen linear weights in 4-bit NormalFloat, "
                               "double-quantized, dequantized to bf16 at each use (nf4: QLoRA, "
                               "bitsandbytes), or in FP8 alone (fp8: Transformer Engine's "
                               "fp8_model_init, MLPerf's Llama 2 70B LoRA)")
    training.add_argument("--packed", type=positive_int, metavar="L",
                          help="sequences packed from samples of L tokens (SFT's packed "
                               "datasets): causal attention runs within each sample, as "
                               "varlen kernels run it (THD, cu_seqlens)")
    training.add_argument("--checkpoint", nargs="?", const="blocks", choices=CHECKPOINT_MODES,
                          metavar="auto",
                          help="activation checkpointing of the repeated blocks: alone, every "
                               "block recomputed (a what-if); 'auto', which ops to save and "
                               "which to recompute so the step fits --checkpoint-budget at "
                               "the least recompute (a torch.utils.checkpoint policy to paste)")
    training.add_argument("--checkpoint-budget", metavar="SIZE|GPU",
                          help="the step peak --checkpoint auto plans for: 70GiB or a GPU "
                               "name (default: --device-mem, else --device's memory; "
                               "--budget is --quant-plan's)")
    training.add_argument("--checkpoint-granularity", choices=("op", "module"), default="op",
                          help="what --checkpoint auto decides on: 'op' (default), which ops "
                               "of each block to save (a selective-checkpoint policy); "
                               "'module', which child modules of each block (attention, "
                               "MLP, norms) to wrap in torch.utils.checkpoint")
    training.add_argument("--device-mem", metavar="SIZE|GPU",
                          help="device memory for a fits verdict: 80GiB, 24GB or a GPU name")
    inference = parser.add_argument_group("inference memory")
    inference.add_argument("--kv-cache", action="store_true",
                           help="KV cache bytes per layer and the memory of one decode step")
    inference.add_argument("--context", type=positive_int,
                           help="KV cache context in tokens (default: the sequence length)")


def _plan_options(parser: argparse.ArgumentParser) -> None:
    plan = parser.add_argument_group(
        "many GPUs (a parallel plan of the training step; --device picks the GPU, h100 "
        "by default)")
    plan.add_argument("--plan", action="store_true",
                      help="lay the training step out over GPUs (implies --train)")
    plan.add_argument("--strategy", metavar="TEXT",
                      help="one layout: ddp, zero1|zero2|zero3, fsdp, hsdp, or degrees "
                           "dp=2,tp=4,pp=2,ep=2,zero=1,v=2 with sp, ckpt, offload, graphs "
                           "(CUDA graphs: no host launches), and "
                           "Megatron's pipeline layout as layout='Et*4|(t*4|)*14tmL' "
                           "or layout=slots "
                           "(default: search the layouts of --gpus)")
    plan.add_argument("--gpus", type=positive_int, metavar="N",
                      help="GPUs of the layout (dp fills what tp·pp leave)")
    plan.add_argument("--search", action="store_true",
                      help="search layouts on 1 … --max-gpus GPUs, ranked")
    plan.add_argument("--max-gpus", type=positive_int, metavar="N",
                      help="the most GPUs a search considers (default --gpus, else 8)")
    plan.add_argument("--micro-batches", type=positive_int, default=1, metavar="M",
                      help="micro-batches per step of --strategy (pipeline, accumulation)")
    plan.add_argument("--global-batch", type=positive_int, metavar="SAMPLES",
                      help="samples per step a search holds fixed (default: the captured "
                           "batch on every GPU)")
    plan.add_argument("--tokens", type=count, metavar="N",
                      help="a whole run of N tokens (1e12 works): GPU-hours and days")
    plan.add_argument("--price", type=non_negative_float, metavar="USD",
                      help="price per GPU-hour: the run's cost, and a search ranks by cost")


def _roofline_options(parser: argparse.ArgumentParser) -> None:
    roofline = parser.add_argument_group("roofline time estimate")
    roofline.add_argument("--device", help="estimate time on this device: h100, a100-80gb, "
                          "cpu… (see fxlens/rules/hardware.py)")
    roofline.add_argument("--devices", metavar="PATH",
                          help="JSON file adding or overriding devices")
    roofline.add_argument("--profile", metavar="PATH",
                          help="calibrated profile (analyze calibrate) instead of the datasheet")
    roofline.add_argument("--tf32", action="store_true", help="fp32 matmuls may use TF32")
    roofline.add_argument("--attention-kernel", choices=ATTENTION_KERNELS,
                          help="the fused attention kernel the stack runs: cudnn (Transformer "
                               "Engine's; PyTorch SDPA's on Hopper from torch 2.10; the "
                               "default) or flash2 (FlashAttention-2: SDPA's on Hopper before "
                               "torch 2.10), at the shares measured on the device")
    roofline.add_argument("--fused", action="store_true",
                          help="estimate over the predicted fused kernels (the fusion section); "
                               "with --plan also the activations fused kernels keep")


def _serve_options(parser: argparse.ArgumentParser) -> None:
    serve = parser.add_argument_group("serving (a decoder LM on --device)")
    serve.add_argument("--serve", action="store_true",
                       help="time to first token, time per output token, throughput and how "
                            "many requests fit, per batch (--batch 1,8,32)")
    serve.add_argument("--input-len", type=positive_int, default=2048,
                       help="prompt tokens per request (2048)")
    serve.add_argument("--output-len", type=positive_int, default=256,
                       help="generated tokens per request (256)")
    serve.add_argument("--kv-dtype", metavar="DTYPE",
                       help="the KV cache's dtype: fp8, int8, fp16, bf16 (default: the model's)")
    serve.add_argument("--tp", type=positive_int, default=1, metavar="N",
                       help="serve over N GPUs of one node with tensor parallelism (1)")
    serve.add_argument("--attention-dp", action="store_true",
                       help="with --tp N: attention and dense layers data-parallel (each GPU "
                            "its own requests and their KV cache), routed experts split over "
                            "the N GPUs (TensorRT-LLM's enable_attention_dp, SGLang's "
                            "--enable-dp-attention)")
    serve.add_argument("--max-num-tokens", type=positive_int, default=8192, metavar="N",
                       help="in-flight batching: tokens per engine step, decode and prompt "
                            "together (8192, TensorRT-LLM's max_num_tokens)")
    serve.add_argument("--max-num-seqs", type=positive_int, default=2048, metavar="N",
                       help="in-flight batching: requests in flight at most (2048, "
                            "TensorRT-LLM's max_batch_size)")
    serve.add_argument("--tpot-slo", type=seconds, metavar="TIME",
                       help="time-per-output-token target (50ms): the headline is the batch "
                            "with most throughput that meets it")


def _quant_options(parser: argparse.ArgumentParser) -> None:
    quant = parser.add_argument_group("quantization sensitivity")
    quant.add_argument("--quant", action="store_true",
                       help="data-free per-layer quantization scores from the weights")
    quant.add_argument("--quant-calibrate", action="store_true",
                       help="run real forwards (example inputs or the model file's "
                            "calibration()): output SQNR per layer")
    # Deprecated spelling, confused with the `analyze calibrate` subcommand: still works.
    quant.add_argument("--calibrate", dest="calibrate_deprecated", action="store_true",
                       help=argparse.SUPPRESS)
    quant.add_argument("--activations", action="store_true",
                       help="with --quant-calibrate, also fake-quantize each layer's inputs")
    quant.add_argument("--calibrate-metric", choices=("auto", "sqnr", "kl", "agreement"),
                       default="auto", help="what ranks layers under --quant-calibrate: output "
                       "SQNR, KL of the softmax or top-1 agreement; auto (default): KL when the "
                       "model returns a linear head's output (logits), else SQNR")
    quant.add_argument("--quant-plan", choices=("w8a8", "w4a16", "auto"),
                       help="per-layer precision plan keeping sensitive layers higher")
    quant.add_argument("--budget", metavar="SIZE", help="weight memory budget of the plan: 4GiB")
    quant.add_argument("--group-size", type=positive_int, default=128,
                       help="int4 group size (128)")
    quant.add_argument("--quant-tolerance", type=percent, metavar="PCT",
                       help="with the model file's evaluate(model): how far a metric may worsen "
                            "(%% of its value) before a quantized model counts as changing the "
                            "task (default 1: MLPerf's 99 %% accuracy target)")


def _prune_options(parser: argparse.ArgumentParser) -> None:
    prune = parser.add_argument_group("structured pruning what-if")
    prune.add_argument("--prune", action="store_true",
                       help="coupled groups (channels, heads, KV groups, neurons, blocks) and "
                            "what removing a unit of each saves")
    prune.add_argument("--prune-target", metavar="PCT",
                       help="plan removing the least important units: 30%% (of parameters) "
                            "or 30%%flops, then 'blocks' (whole blocks only) or 'units' "
                            "(no whole block); implies --prune")
    prune.add_argument("--prune-save", metavar="PATH",
                       help="write the planned pruned module here (torch.save)")


def _page_options(parser: argparse.ArgumentParser) -> None:
    pages = parser.add_argument_group("graph and pages (default: graph.dot, graph.svg, "
                                      "report.html, summary.md in the report folder)")
    pages.add_argument("--no-pages", action="store_true",
                       help="write the JSON report only: no graph, HTML or Markdown")
    pages.add_argument("--dot", type=Path, metavar="PATH", help="write the graphviz graph here")
    pages.add_argument("--svg", type=Path, metavar="PATH",
                       help="write the graph as SVG here (needs graphviz's dot)")
    pages.add_argument("--png", action="store_true", help="also a PNG next to the SVG")
    pages.add_argument("--color", default="flops", choices=("flops", "bytes", "time", "memory"),
                       help="colour graph nodes by this metric (default flops; time needs "
                            "--device)")
    pages.add_argument("--expand", action="store_true",
                       help="draw every op of repeated blocks instead of one node per block")
    pages.add_argument("--html", type=Path, metavar="PATH", help="write the HTML page here")
    pages.add_argument("--md", type=Path, metavar="PATH", help="write the Markdown summary here")


def _review_options(parser: argparse.ArgumentParser) -> None:
    review = parser.add_argument_group("pre-merge review (see analyze diff)")
    review.add_argument("--baseline", metavar="REPORT|TARGET",
                        help="compare with this report .json, model or git:REF:path")
    review.add_argument("--fail-on", metavar="GATES",
                        help='exit 1 when a metric grows past a threshold against --baseline: '
                             '"flops:+2%%,peak_memory:+5%%,params:+0" (time needs --device)')
