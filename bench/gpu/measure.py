"""What a real device does: forward, training-step and decode timings and peaks, torch only.

Nothing here imports fxlens, so the measurements run on a machine whose torch fxlens does not
support (a lent GPU image with another torch release); `bench/gpu/predict.py` computes the
predictions for the same cases wherever fxlens runs, and `bench/gpu_check.py` joins them.

Models are the shipped `transformers` presets (`fxlens/analyzer/capture/hf_presets/*.json`,
read as plain JSON) built with random weights directly on the device, attention forced to
``sdpa`` as fxlens captures it.

- `forward`: the eager forward (``use_cache=False``, ``no_grad``), median of `repeat` timed
  passes after `warmup`; on CUDA ``max_memory_allocated`` from an allocator holding only the
  model and its inputs.
- `train_step`: one AdamW step under ``torch.autocast`` (fp32 weights: fxlens's
  ``--precision autocast-bf16``), with the loss fxlens models (a gradient of ones on the
  logits) and the model's own cross-entropy loss (``labels``); the peak of the first step
  (the optimizer's states appear in it) and of the second (steady state) apart.
- `decode`: one new token per sequence against a ``StaticCache`` filled by a real prefill to
  `context` tokens (the cache engines use: written in place, never copied), timed eagerly and,
  on a GPU, the profiler's kernel time per step (the GPU's work without Python's gaps); the
  same step
  with a ``DynamicCache`` (what ``generate`` uses by default: the cache grows by a copy); the
  cache's tensor bytes and the step's ``max_memory_allocated``.

Legend: ``B`` batch, ``T`` tokens, ``C`` cached context.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PRESETS = Path(__file__).resolve().parents[2] / "fxlens/analyzer/capture/hf_presets"
TOP_KERNELS = 6     # kernels named in a decode step's note
DECODE_SLOTS = 64   # cache slots past the context: one per decode step taken
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Case:
    """One model at one size: a preset, config overrides, batch, tokens, dtype."""

    name: str
    preset: str
    batch: int
    seq_len: int
    dtype: str = "bfloat16"
    overrides: Mapping[str, Any] = field(default_factory=dict)
    context: int = 0            # decode: tokens already in the cache

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "preset": self.preset, "batch": self.batch,
                "seq_len": self.seq_len, "dtype": self.dtype, "overrides": dict(self.overrides),
                "context": self.context}


def build(case: Case, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """The preset's model with random weights on `device` in `dtype` (default the case's)."""
    import transformers

    spec = json.loads((PRESETS / f"{case.preset}.json").read_text())
    config = getattr(transformers, spec["config_class"])(**{**spec["config"], **case.overrides})
    config._attn_implementation = "sdpa"
    config.use_cache = False
    model_cls = getattr(transformers, spec["model_class"])
    torch.manual_seed(0)
    with torch.device(device), _default_dtype(dtype or DTYPES[case.dtype]):
        model = model_cls(config)
    return model.eval()


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def tokens(case: Case, model: Any, device: torch.device, length: int | None = None
           ) -> torch.Tensor:
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (case.batch, length or case.seq_len), generator=generator)
    return ids.to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, warmup: int, repeat: int) -> float:
    """Median wall seconds of `fn` over `repeat` calls after `warmup`, synchronised."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def reset_peak(device: torch.device) -> int:
    """Reset the peak counter; the bytes allocated now (0 where there is no counter)."""
    if device.type != "cuda":
        return 0
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))


def peak(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    sync(device)
    return int(torch.cuda.max_memory_allocated(device))


def free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def param_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())


def forward(case: Case, device: torch.device, warmup: int, repeat: int) -> dict[str, Any]:
    model = build(case, device)
    ids = tokens(case, model, device)

    def run() -> Any:
        return model(input_ids=ids)
    with torch.no_grad():
        resident = reset_peak(device)
        run()
        first_peak = peak(device)
        seconds = timed(run, device, warmup, repeat)
        kernel_s, kernel_note = _kernel_time(run, device, repeat)
    return {"forward_s": seconds, "weights_bytes": param_bytes(model),
            "resident_bytes": resident, "peak_bytes": first_peak,
            "kernel_s": kernel_s, "kernel_note": kernel_note}


def train_step(case: Case, device: torch.device, warmup: int, repeat: int) -> dict[str, Any]:
    """Peaks and time of AdamW steps under autocast bf16, for both losses (one model each,
    freed before the next is built)."""
    result = {}
    for loss in ("ones", "labels"):
        result[loss] = _train(case, device, loss, warmup, repeat)
        free(device)
    return result


def _train(case: Case, device: torch.device, loss: str, warmup: int, repeat: int
           ) -> dict[str, Any]:
    model = build(case, device, torch.float32).train()
    ids = tokens(case, model, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            if loss == "labels":
                model(input_ids=ids, labels=ids).loss.backward()
            else:
                logits = model(input_ids=ids).logits
                logits.backward(torch.ones_like(logits))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    resident = reset_peak(device)
    step()
    first = peak(device)
    reset_peak(device)
    step()
    steady = peak(device)
    result = {"resident_bytes": resident, "first_step_peak_bytes": first,
              "step_peak_bytes": steady, "step_s": timed(step, device, max(warmup - 2, 0), repeat),
              "weights_bytes": param_bytes(model)}
    result["kernel_s"], result["kernel_note"] = _kernel_time(step, device, min(repeat, 3))
    return result


def cache_bytes(cache: Any) -> int:
    """Bytes of the K and V tensors a transformers cache holds (any of its layouts)."""
    tensors: list[torch.Tensor] = []
    for layer in getattr(cache, "layers", ()):
        tensors += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                    if isinstance(t, torch.Tensor)]
    if not tensors:
        tensors = list(getattr(cache, "key_cache", ())) + list(getattr(cache, "value_cache", ()))
    return sum(t.numel() * t.element_size() for t in tensors)


def decode(case: Case, device: torch.device, warmup: int, repeat: int) -> dict[str, Any]:
    """One decode token per sequence against `case.context` cached tokens."""
    model = build(case, device)
    prompt = tokens(case, model, device, case.context)
    with torch.no_grad():
        def prefill() -> None:   # the time to first token: the prompt's forward, no cache
            model(input_ids=prompt, logits_to_keep=1)
        result = {"weights_bytes": param_bytes(model),
                  "prefill_s": timed(prefill, device, 1, 2)}
        free(device)
        result.update(_static_decode(model, prompt, device, warmup, repeat))
        free(device)
        result["dynamic_step_s"] = _dynamic_decode(model, prompt, device, warmup, repeat)
    return result


def _static_decode(model: Any, prompt: torch.Tensor, device: torch.device, warmup: int,
                   repeat: int) -> dict[str, Any]:
    """The step against a StaticCache: time, kernel time, cache bytes and the step's peak."""
    from transformers import StaticCache

    context = prompt.shape[1]
    # Room for every timed step: transformers releases differ in whether a step's
    # cache_position is honoured or the cache's own length is, so each step may take a slot.
    cache = StaticCache(config=model.config, max_cache_len=context + DECODE_SLOTS)
    model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1,
          cache_position=torch.arange(context, device=device))
    position = torch.tensor([context], device=device)

    def step() -> Any:
        return model(input_ids=prompt[:, -1:], past_key_values=cache, cache_position=position,
                     use_cache=True)
    resident = reset_peak(device)
    step()
    result = {"cache_tokens": context + DECODE_SLOTS, "kv_cache_bytes": cache_bytes(cache),
              "resident_bytes": resident, "step_peak_bytes": peak(device),
              "static_step_s": timed(step, device, warmup, repeat)}
    result["kernel_step_s"], result["kernel_note"] = _kernel_time(step, device, repeat)
    return result


def _dynamic_decode(model: Any, prompt: torch.Tensor, device: torch.device, warmup: int,
                    repeat: int) -> float:
    """Seconds of the step against a DynamicCache (what ``generate`` uses by default)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)

    def step() -> None:
        model(input_ids=prompt[:, -1:], past_key_values=cache, use_cache=True)
        cache.crop(-1)    # back to the context: the next step grows it again
    return timed(step, device, warmup, repeat)


def kernel_table(step: Callable[[], Any], device: torch.device, repeat: int
                 ) -> list[dict[str, Any]]:
    """Each GPU kernel `step` launches: name, launches and µs per step (the profiler's device
    time, launch gaps left out), the longest first. Raises where the profiler cannot start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            step()
        sync(device)
    rows = [{"kernel": e.key, "calls_per_step": e.count / repeat,
             "us_per_step": (getattr(e, "self_device_time_total", None)
                             or getattr(e, "self_cuda_time_total", 0)) / repeat}
            for e in prof.key_averages()]
    return sorted((row for row in rows if row["us_per_step"] > 0),
                  key=lambda row: -row["us_per_step"])


def _kernel_time(step: Callable[[], Any], device: torch.device, repeat: int
                 ) -> tuple[float | None, str | None]:
    """Seconds of GPU kernels per step (the profiler's device time, launch gaps left out)."""
    if device.type != "cuda":
        return None, "kernel time needs a GPU"
    try:
        kernels = kernel_table(step, device, repeat)
    except Exception as error:  # a profiler that cannot start here: keep the eager figure
        return None, f"{type(error).__name__}: {error}"[:300]
    note = "; ".join(f"{row['kernel'][:60]} {row['us_per_step']:.0f} µs"
                     for row in kernels[:TOP_KERNELS])
    return sum(row["us_per_step"] for row in kernels) * 1e-6, f"top kernels per step: {note}"


def each_case(rows: Iterable[dict[str, Any]], time: Callable[[dict[str, Any]], dict[str, Any]],
              device: torch.device, error_chars: int = 400) -> list[dict[str, Any]]:
    """Each row (a case's description) updated with what `time` measures for it, or with why
    it could not (each case stands alone: record why, go on), printed as it ends; the
    device's memory freed between cases."""
    done = []
    for row in rows:
        try:
            row.update(time(row))
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {error}"[:error_chars]
        free(device)
        done.append(row)
        print(json.dumps(row), flush=True)
    return done


def each_named_case(cases: Iterable[Any], time: Callable[[Any], dict[str, Any]],
                    device: torch.device) -> list[dict[str, Any]]:
    """`each_case` over dataclass cases with a ``name``: each row is the case's fields, timed
    by `time` on the case itself."""
    from dataclasses import asdict

    cases = list(cases)
    by_name = {case.name: case for case in cases}
    return each_case([asdict(case) for case in cases],
                     lambda row: time(by_name[row["name"]]), device)


def measure_and_predict(doc: str, out_name: str, default_device: str,
                        measure: Callable[[torch.device], list[dict[str, Any]]],
                        predict: Callable[[dict[str, Any], str], Any],
                        table: Callable[[dict[str, Any]], str]) -> None:
    """The command line of a measured-and-predicted case list (`bench.gpu.moe`,
    `bench.gpu.serving`): ``--measure`` on this machine's GPU (or its CPU) into ``--out``;
    ``--predict FILE`` adds fxlens's prediction of each row for ``--device`` and prints the
    table."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--predict", type=Path, help="a --measure JSON to add predictions to")
    parser.add_argument("--device", default=default_device,
                        help="the registry device to predict for")
    args = parser.parse_args()
    if args.measure:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                  "torch": torch.__version__, "rows": measure(device)}
        (args.out or Path(out_name)).write_text(json.dumps(result, indent=1))
    if args.predict:
        result = json.loads(args.predict.read_text())
        for row in result["rows"]:
            row["predicted"] = predict(row, args.device)
        args.predict.write_text(json.dumps(result, indent=1))
        print(table(result))

