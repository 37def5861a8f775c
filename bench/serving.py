"""The ``--serve`` estimate against published serving measurements (issue 31).

Each row of `bench/serving_runs.py` that this estimate covers (the GPUs one tensor-parallel
group, a device fxlens knows) is estimated with the row's own setup: the preset, ``--device``,
``--tp``, ``--input-len``/``--output-len``, ``--precision fp8`` for FP8 weights
(``fp8-dense`` where the engine kept a MoE model's experts at 16 bits) and the KV
dtype the row states (FP8 rows whose source does not state it: FP8, what TensorRT-LLM sets with FP8
quantization). What is compared:

- static batch: output tokens/s at the row's batch (the whole batch through prefill, then
  decoded together: `fxlens.analyzer.serve.estimate`);
- in-flight at a stated concurrency (NIM): the in-flight batcher's steady state with that many
  requests in flight (`fxlens.analyzer.serve.inflight`);
- in-flight at maximum load (concurrency not stated): the in-flight batcher's steady state
  with as many requests as the estimate's KV cache holds, under the engine's default caps
  (8,192 tokens per step, 2,048 requests: TensorRT-LLM's defaults);
- first-token rows (output 1): TTFT at batch 1;
- rows served with attention data parallelism and expert parallelism (DeepSeek-R1 on
  TensorRT-LLM) run ``--attention-dp`` over their GPUs, with the per-rank caps the run set.

No figure here is fitted: the device's datasheet peaks and its achievable factors
(`fxlens.rules.hardware`) time every kernel, and the links (bandwidth, NCCL's per-call
latency: `fxlens.rules.links`) every all-reduce.

    .venv/bin/python bench/serving.py             # every covered row; a Markdown table
    .venv/bin/python bench/serving.py --only h100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_runs import RUNS, ServingRun  # noqa: E402

from fxlens.analyzer.capture.hf import load_preset  # noqa: E402
from fxlens.analyzer.core.sections import Serve, ServePoint  # noqa: E402
from fxlens.pipeline import AnalysisOptions, run_pipeline  # noqa: E402
from fxlens.rules.hardware import ALIASES, DEVICES  # noqa: E402


def covered(run: ServingRun) -> str | None:
    """Why `run` is not estimated here (None: it is)."""
    if run.tp != run.gpus:
        return f"TP {run.tp} on {run.gpus} GPUs (data-parallel replicas)"
    if ALIASES.get(run.gpu, run.gpu) not in DEVICES:
        return f"no {run.gpu} device"
    return None


def estimate(run: ServingRun) -> Serve:
    loaded = load_preset(run.model, batch=1, seq_len=128)
    kv = run.kv_dtype or ("fp8" if run.weights == "fp8" else None)
    batches = (run.batch,) if run.batch else ()
    options = AnalysisOptions(serve=True, device=run.gpu, input_len=run.input_len,
                              output_len=max(run.output_len, 1), serve_batches=batches,
                              precision=_precision(run.weights),
                              kv_dtype=kv, fusion=False, tp=run.tp,
                              attention_dp=run.attention_dp,
                              **({"max_num_tokens": run.caps[0], "max_num_seqs": run.caps[1]}
                                 if run.caps else {}))
    serve = run_pipeline(loaded, options).get(Serve)
    assert serve is not None
    return serve


def _precision(weights: str) -> str | None:
    """The row's weights as ``--precision`` names them (None: the model's 16 bits)."""
    return {"fp8": "fp8", "fp8-dense": "fp8-dense", "int8-w8a16": "w8a16",
            "int4-w4a16": "w4a16"}.get(weights)


def compared(run: ServingRun, serve: Serve) -> tuple[str, float, float | None]:
    """(what, published, estimated); estimated None where no request fits."""
    if run.ttft_s is not None and run.output_tokens_per_s is None:
        point = _at(serve, 1)
        return "TTFT s", run.ttft_s, point.ttft_s
    assert run.output_tokens_per_s is not None
    if run.batch is None:
        load = serve.max_load
        return "tok/s", run.output_tokens_per_s, load.output_tokens_per_s if load else None
    point = _at(serve, run.batch)
    if run.batching == "inflight":
        return "tok/s", run.output_tokens_per_s, point.inflight_tokens_per_s
    return "tok/s", run.output_tokens_per_s, point.output_tokens_per_s


def batch_label(run: ServingRun, serve: Serve) -> str:
    """The row's batch as estimated: ``64``, ``25 in flight``, ``max (233 in flight)``."""
    if run.batch is None:
        load = serve.max_load
        return f"max ({load.requests:.0f} in flight)" if load else "max"
    return f"{run.batch} in flight" if run.batching == "inflight" else str(run.batch)


def _at(serve: Serve, batch: int) -> ServePoint:
    return next(p for p in serve.curve if p.batch == batch)


def _figure(value: float) -> str:
    """Tokens/s whole with thousands separators; seconds to four significant digits."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.4g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one GPU kind (h100, a100, h200)")
    args = parser.parse_args(argv)
    print("| GPU | TP | model | weights/KV | in/out | batch | what | published | fxlens | error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    errors, skipped = [], []
    for run in RUNS:
        if args.only and run.gpu != args.only:
            continue
        why = covered(run)
        if why is not None:
            skipped.append(f"{run.gpu} {run.model} {run.input_len}/{run.output_len}: {why}")
            continue
        started = time.perf_counter()
        serve = estimate(run)
        what, published, predicted = compared(run, serve)
        if predicted is None:
            skipped.append(f"{run.gpu} TP {run.tp} {run.model} {run.input_len}/"
                           f"{run.output_len}: no request fits (weights "
                           f"{serve.weights_bytes / 2**30:.1f} GiB per GPU)")
            continue
        error = predicted / published - 1
        errors.append(error)
        batch = batch_label(run, serve)
        print(f"| {run.gpu} | {run.tp} | {run.model} | {run.weights}/{run.kv_dtype or '—'} | "
              f"{run.input_len}/{run.output_len} | {batch} | {what} | {_figure(published)} | "
              f"{_figure(predicted)} | {error:+.0%} |  "
              f"<!-- {time.perf_counter() - started:.0f} s -->")
    if errors:
        within = sum(abs(e) <= 0.25 for e in errors)
        print(f"\n{within} of {len(errors)} rows within ±25 %; median |error| "
              f"{statistics.median(abs(e) for e in errors):.0%}")
    print(f"not covered: {len(skipped)} rows")
    for line in skipped:
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
