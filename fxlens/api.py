"""The public API as functions: `load`, `capture`, `analyze`, and `analyze_target` for all three.

    from fxlens.api import AnalysisOptions, analyze_target
    report = analyze_target("examples/tiny_gpt.py", AnalysisOptions(train=True))
    print(report.totals.flops, report.sections["training"]["step_peak_bytes"])

This is the one place where the engine (`fxlens.analyzer`) meets the op knowledge
(`fxlens.rules`): rules, precision and optimizer policies, device specs are looked up here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fxlens.analyzer.capture.chain import METHODS, capture
from fxlens.analyzer.capture.load import load
from fxlens.analyzer.capture.training import capture_training
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.fusion.kernels import FusionAnalysis, analyze_fusion, fused_report
from fxlens.analyzer.memory.kv_cache import decode_step, kv_cache, kv_layout
from fxlens.analyzer.memory.liveness import liveness
from fxlens.analyzer.memory.measure import simulate_eager_memory
from fxlens.analyzer.memory.training_state import parse_bytes
from fxlens.analyzer.memory.training_step import StepSettings, training_section
from fxlens.analyzer.quant.section import QuantSettings, quant_section
from fxlens.analyzer.time.roofline import roofline_section, throughput_basis
from fxlens.rules import load_rules
from fxlens.rules.fusion import FUSION_RULES, kinds_of
from fxlens.rules.hardware import DeviceSpec, cached_profile, load_devices, load_profile
from fxlens.rules.hardware import device as named_device
from fxlens.rules.training import CASTABLE_DTYPES, Optimizer, Precision

__all__ = ["AnalysisOptions", "analyze", "analyze_loaded", "analyze_target", "capture", "load",
           "load_rules"]

log = logging.getLogger(__name__)

DEFAULT_PRECISION = {"float32": "fp32", "bfloat16": "amp-bf16", "float16": "amp-fp16"}


@dataclass(frozen=True)
class AnalysisOptions:
    entry: str | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)
    sizes: Mapping[str, int | None] = field(default_factory=dict)
    methods: tuple[str, ...] = METHODS
    strict: bool = False
    train: bool = False
    precision: str | None = None        # None: from the parameters' dtype
    optimizer: str = "adamw"
    device_memory: str | None = None    # "80GiB" or a GPU name ("h100")
    checkpoint: bool = False
    kv_cache: bool = False
    context: int | None = None          # KV cache context; None: the captured sequence length
    device: str | None = None           # roofline device ("h100", "cpu"); None: no roofline
    devices_file: str | None = None     # user JSON adding or overriding devices
    profile: str | None = None          # calibrated profile JSON (`analyze calibrate`)
    tf32: bool = False                  # fp32 matmuls may use TF32
    fused: bool = False                 # roofline over the predicted fused kernels
    quant: bool = False                 # data-free quantization sensitivity per layer
    calibrate: bool = False             # + real forwards: output SQNR per layer (implies quant)
    activations: bool = False           # calibrated runs also fake-quantize layer inputs
    calibrate_metric: str = "auto"      # calibrated ranking: auto (KL for logits)|sqnr|kl|agreement
    quant_plan: str | None = None       # "w8a8", "w4a16" or "auto" (implies quant)
    budget: str | None = None           # weight memory budget of the plan ("4GiB")
    group_size: int = 128               # int4 group size


def analyze_target(
    target: str,
    options: AnalysisOptions = AnalysisOptions(),
    on_step: Callable[[str], None] = lambda _: None,
) -> Report:
    """Load `target`, capture it (a training step with `options.train`) and cost every op."""
    on_step(f"loading {target}")
    loaded = load(target, options.entry, options.overrides, options.sizes)
    if not options.kv_cache:
        return analyze_loaded(loaded, options, on_step)
    if options.train:
        report = analyze_loaded(loaded, options, on_step)
        graph = capture(loaded.module, loaded.inputs, load_rules(), options.methods, on_step)
    else:
        report, graph = _inference_report(loaded, options, on_step)
    on_step("sizing the KV cache and one decode step")
    return _with_sections(report, kv_cache=_kv_section(target, loaded, graph, report, options))


def analyze_loaded(
    loaded: LoadedModel,
    options: AnalysisOptions = AnalysisOptions(),
    on_step: Callable[[str], None] = lambda _: None,
) -> Report:
    """Capture a loaded model (a training step with `options.train`) and cost every op."""
    if options.train:
        return _training_report(loaded, options, on_step)
    return _inference_report(loaded, options, on_step)[0]


def _inference_report(
    loaded: LoadedModel, options: AnalysisOptions, on_step: Callable[[str], None]
) -> tuple[Report, Graph]:
    registry = load_rules()
    graph = capture(loaded.module, loaded.inputs, registry, options.methods, on_step)
    on_step("costing ops")
    report = analyze(graph, registry, loaded.name, loaded.source, options.strict)
    on_step("simulating the eager forward's memory on fake tensors")
    memory = {**liveness(graph, registry).to_section(), "eager": _eager_memory(loaded)}
    report = _with_fusion(_with_sections(report, memory=memory), graph, options)
    report = _with_quant(report, loaded, graph, options, on_step)
    return _with_roofline(report, graph, options), graph


def _eager_memory(loaded: LoadedModel) -> dict[str, Any]:
    """The activation peak of eager PyTorch, Python's references included, from a forward
    simulated on fake tensors; graph liveness gives the peak of a graph executor instead."""
    try:
        simulated = simulate_eager_memory(loaded.module, loaded.inputs)
    except Exception as error:  # an extra figure: the report stands without it
        log.warning("eager memory simulation failed: %s", error)
        return {"peak_bytes": None, "error": f"{type(error).__name__}: {error}"[:300]}
    return {"peak_bytes": simulated.peak_bytes, "peak_op": simulated.peak_op}


def _training_report(
    loaded: LoadedModel, options: AnalysisOptions, on_step: Callable[[str], None]
) -> Report:
    registry = load_rules()
    precision = _precision(options.precision, loaded.module)
    working = precision.spec.weight_dtype
    step = capture_training(loaded.module, loaded.inputs, registry,
                            working if working in CASTABLE_DTYPES else "bfloat16", on_step)
    on_step("costing the step")
    report = analyze(step.graph, registry, loaded.name, loaded.source, options.strict)
    memory = liveness(step.graph, registry)
    device_name, device_bytes = _device(options.device_memory)
    settings = StepSettings(
        precision_name=precision.value, precision=precision.spec,
        optimizer_name=options.optimizer, optimizer=_optimizer(options.optimizer).spec,
        batch=_batch(step.graph), device_name=device_name, device_bytes=device_bytes,
        checkpoint=options.checkpoint,
    )
    training = training_section(step, report, memory, registry, settings)
    report = _with_sections(report, memory=memory.to_section(), training=training)
    return _with_roofline(report, step.graph, options)


def _kv_section(
    target: str, loaded: LoadedModel, graph: Graph, report: Report, options: AnalysisOptions
) -> dict[str, Any]:
    """KV cache at `options.context` tokens and the memory of one decode step, whose
    activations come from the model captured again at one token (``seq_len=1``)."""
    registry = load_rules()
    layout = kv_layout(loaded.module, graph)
    if not layout.layers:
        raise LoadError("--kv-cache: no attention layers found (no transformers config and "
                        "no attention op in the graph)")
    batch = options.sizes.get("batch") or _batch(graph)
    context = options.context or _sequence_length(graph)
    cache = kv_cache(layout.layers, batch, context, layout.dtype_bytes, layout.source)
    one_token = load(target, options.entry, options.overrides, {**options.sizes, "seq_len": 1})
    token_graph = capture(one_token.module, one_token.inputs, registry, options.methods)
    token_activations = liveness(token_graph, registry).peak_activation_bytes
    weights = report.model.param_bytes + report.model.buffer_bytes
    return {**cache.to_section(),
            "decode_step": decode_step(weights, cache, token_activations).to_section()}


def _with_sections(report: Report, **sections: Any) -> Report:
    return dataclasses.replace(report, sections={**report.sections, **sections})


def _with_roofline(report: Report, graph: Graph, options: AnalysisOptions) -> Report:
    if options.device is None:
        return report
    spec = device_spec(options.device, options.devices_file, options.profile)
    basis = fused_report(report, _fusion(report, graph).plan) if options.fused else report
    return _with_sections(report, roofline=roofline_section(basis, graph, spec, options.tf32))


def _fusion(report: Report, graph: Graph, bandwidth: float | None = None) -> FusionAnalysis:
    registry = load_rules()
    return analyze_fusion(report, graph, kinds_of(list(graph.nodes), registry), FUSION_RULES,
                          registry.lookup, bandwidth)


def _with_fusion(report: Report, graph: Graph, options: AnalysisOptions) -> Report:
    """`findings` (ranked by bytes saved; seconds on `options.device`) and `fusion`."""
    spec = (device_spec(options.device, options.devices_file, options.profile)
            if options.device else None)
    bandwidth = spec.achievable_bandwidth if spec is not None else None
    return _with_sections(report, **_fusion(report, graph, bandwidth).sections())


def device_spec(name: str, devices_file: str | None = None, profile: str | None = None
                ) -> DeviceSpec:
    """The device to estimate for: a calibrated `profile` when given; else `name` from the
    user's `devices_file` or the registry; ``cpu`` and ``cuda`` use their cached calibrated
    profile (`analyze calibrate`) when one exists."""
    try:
        if profile is not None:
            return load_profile(Path(profile))
        extra = load_devices(Path(devices_file)) if devices_file else {}
        key = name.strip().lower()
        cached = cached_profile(key) if key in ("cpu", "cuda") and key not in extra else None
        if cached is not None:
            return cached
        if key == "cuda" and "cuda" not in extra:
            raise ValueError("no calibrated profile for 'cuda'; run `analyze calibrate "
                             "--device cuda` or name the GPU (--device h100)")
        return named_device(name, extra)
    except ValueError as error:
        raise LoadError(f"--device: {error}") from None


def _precision(name: str | None, module: torch.nn.Module) -> Precision:
    if name is None:
        dtype = next((str(p.dtype).removeprefix("torch.") for p in module.parameters()
                      if p.is_floating_point()), "float32")
        name = DEFAULT_PRECISION.get(dtype, "fp32")
    try:
        return Precision(name)
    except ValueError:
        known = ", ".join(p.value for p in Precision)
        raise LoadError(f"unknown precision {name!r}; known: {known}") from None


def _optimizer(name: str) -> Optimizer:
    try:
        return Optimizer(name)
    except ValueError:
        known = ", ".join(o.value for o in Optimizer)
        raise LoadError(f"unknown optimizer {name!r}; known: {known}") from None


def _device(text: str | None) -> tuple[str, int | None]:
    """``"80GiB"`` → ("80GiB", bytes); ``"h100"`` → its memory; None → no fit check."""
    if text is None:
        return "", None
    try:
        return text, parse_bytes(text)
    except ValueError:
        pass
    try:
        spec = named_device(text)
    except ValueError as error:
        raise LoadError(f"--device-mem: {error}") from None
    return spec.name, spec.memory_bytes


def _batch(graph: Graph) -> int:
    """The batch of the example inputs (see `throughput_basis`)."""
    return throughput_basis(graph).samples


def _sequence_length(graph: Graph) -> int:
    """The tokens per sequence of the example inputs (see `throughput_basis`)."""
    basis = throughput_basis(graph)
    if not basis.tokens:
        raise LoadError("--kv-cache: cannot tell the sequence length; give --context")
    return basis.tokens // basis.samples


def _with_quant(report: Report, loaded: LoadedModel, graph: Graph, options: AnalysisOptions,
                on_step: Callable[[str], None]) -> Report:
    """The ``quant`` section (`fxlens.analyzer.quant.section`) when any quant option is on."""
    if not (options.quant or options.calibrate or options.quant_plan):
        return report
    from fxlens.rules.quant import knowledge, plan_request

    try:
        budget = parse_bytes(options.budget) if options.budget else None
        plan = (plan_request(options.quant_plan, budget, options.group_size)
                if options.quant_plan else None)
    except ValueError as error:
        raise LoadError(f"--quant-plan/--budget: {error}") from None
    batches, source = None, ""
    if options.calibrate:
        source = "calibration()" if loaded.calibration else "example inputs"
        batches = list(loaded.calibration()) if loaded.calibration else [loaded.inputs]
    settings = QuantSettings(calibration=batches, calibration_source=source,
                             activations=options.activations,
                             metric=options.calibrate_metric, plan=plan)
    section = quant_section(loaded.module, graph, knowledge(options.group_size), settings,
                            on_step)
    return _with_sections(report, quant=section)
