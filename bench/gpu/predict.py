"""What fxlens predicts for the cases `bench/gpu/measure.py` runs, on fake tensors, anywhere.

Each function loads the same preset at the same sizes (`fxlens.analyzer.capture.hf.load_preset`)
and reads one figure per measured one from the report:

- `forward`: the roofline's forward time; the peak of an inference forward as the allocator sees
  it: weights and buffers + inputs + the eager activation peak (`Memory.activation_peak_bytes`).
- `train_step`: ``--train --precision autocast-bf16 --optimizer adamw`` (what the measured
  step runs: fp32 weights under ``torch.autocast``), with the model's own loss and with the
  backward seeded by ones: the first step's and the steady step's peaks
  (`Training.first_step_peak_bytes`, `step_peak_bytes`) and the step time.
- `decode`: ``--kv-cache --context C`` for the cache bytes and the decode step's memory; the
  decode step's time as fxlens's parts give it, stated: the roofline of the model on one token
  (every weight read once, the per-kernel launch costs) plus reading the whole cache once at
  the device's achievable bandwidth. NB: the one-token graph is captured without a cache, so its
  attention covers one token; the attention over the cache is counted as the cache read alone
  (its FLOPs, 4·B·H·C·d per layer, are a few hundred per byte read: memory bound).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.core.sections import KVCache, Memory, Roofline, Training
from fxlens.api import analyze_loaded
from fxlens.pipeline import AnalysisOptions
from fxlens.rules.hardware import DeviceSpec

from .measure import Case


def _loaded(case: Case, dtype: str | None = None, batch: int | None = None,
            seq_len: int | None = None) -> Any:
    overrides = {k: str(v) for k, v in case.overrides.items()}
    return load_preset(case.preset, overrides, batch or case.batch, seq_len or case.seq_len,
                       dtype=dtype or case.dtype)


def _options(spec: DeviceSpec, **more: Any) -> AnalysisOptions:
    return AnalysisOptions(device=spec.name, fusion=False, **more)


def forward(case: Case, spec: DeviceSpec) -> dict[str, Any]:
    report = analyze_loaded(_loaded(case), _options(spec), device=spec)
    memory = report.require(Memory)
    resident = memory.param_bytes + memory.buffer_bytes + memory.input_bytes
    return {"forward_s": report.require(Roofline).totals.time_s,
            "weights_bytes": memory.param_bytes + memory.buffer_bytes,
            "peak_bytes": resident + memory.activation_peak_bytes}


def train_step(case: Case, spec: DeviceSpec) -> dict[str, Any]:
    """Per loss the measurement used: ``labels`` (the model's own loss, what a preset of a
    causal LM is trained on) and ``ones`` (the backward seeded on the logits)."""
    options = _options(spec, train=True, precision="autocast-bf16", optimizer="adamw")
    loaded = _loaded(case, dtype="float32")
    result = {}
    for loss, model in (("labels", loaded), ("ones", replace(loaded, training_inputs=None))):
        report = analyze_loaded(model, options, device=spec)
        training = report.require(Training)
        result[loss] = {"first_step_peak_bytes": training.first_step_peak_bytes,
                        "step_peak_bytes": training.step_peak_bytes,
                        "step_s": report.require(Roofline).totals.total_s}
    return result


def decode(case: Case, spec: DeviceSpec, cache_tokens: int) -> dict[str, Any]:
    """The cache at `cache_tokens` (the measured cache's length) and one decode step."""
    options = _options(spec, kv_cache=True, context=cache_tokens)
    report = analyze_loaded(_loaded(case, seq_len=case.context), options, device=spec)
    cache = report.require(KVCache)
    token = analyze_loaded(_loaded(case, seq_len=1), _options(spec), device=spec)
    graph_s = token.require(Roofline).totals.time_s
    cache_read_s = cache.total_bytes / spec.achievable_bandwidth
    return {"kv_cache_bytes": cache.total_bytes,
            "step_peak_bytes": cache.decode_step.total_bytes,
            "weights_bytes": cache.decode_step.weights_bytes,
            "static_step_s": graph_s + cache_read_s,
            "step_graph_s": graph_s, "cache_read_s": cache_read_s}
