"""The `training` section of a report: FLOPs, memory and fit of one training step.

Joins what the other modules compute, nothing new: the joint graph's FLOPs by phase
(`fxlens.analyzer.capture.training`), the persistent state of the precision and optimizer policies
(`fxlens.analyzer.memory.training_state`), and liveness over the joint graph
(`fxlens.analyzer.memory.liveness`),
in which activations and gradients are allocated as the forward and backward produce them.

The step's peak = persistent state (working weights, master weights, optimizer state, buffers)
+ the larger of
  - the liveness peak of the forward+backward (activations, saved tensors, gradients), and
  - the optimizer step: every gradient plus its temporaries: `OPTIMIZER_TEMPORARIES` the size
    of the largest parameter in the optimizer's precision (torch's single-tensor AdamW computes
    ``exp_avg_sq.sqrt() / bias_correction``: two such tensors live at once), or, for a
    multi-tensor (foreach) step, its state-sized copies of every parameter at once
    (`foreach_temporaries`, `fxlens.rules.training`), whichever is larger. torch.optim takes
    the foreach step when every parameter is on a GPU, the single-tensor one on a CPU: an
    analysis for a CPU device counts the latter. Measured on an
    H200 (2-layer Llama-3-8B, 1.5 B fp32 parameters, AdamW under autocast): the step peaked
    at 28.7 GiB; with the largest parameter's two temporaries fxlens said 26.1.
`step_peak_bytes` takes the optimizer state as existing before the step (a steady-state step);
`first_step_peak_bytes` lets the optimizer allocate it during the step, as a first step does.

Largest batch: activations scale with the batch, states and gradients do not (NB: linear in
batch, measured at the captured batch).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fxlens.analyzer.capture.lora import adapted_layers
from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.graph import Graph, NodeKind, TensorRef, dtype_bytes, repeated_blocks
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Checkpointing,
    Fit,
    ModuleBytes,
    PeakBreakdown,
    Training,
)
from fxlens.analyzer.memory.liveness import Category, MemoryProfile, plan_storages
from fxlens.analyzer.memory.training_state import (
    BlockActivations,
    LinearActivation,
    OptimizerPolicy,
    PrecisionPolicy,
    checkpoint_what_if,
    fits,
    largest_batch,
    optimizer_step_bytes,
    optimizer_step_flops,
    state_memory,
)

OPTIMIZER_TEMPORARIES = 2


@dataclass(frozen=True)
class StepSettings:
    precision_name: str
    precision: PrecisionPolicy
    optimizer_name: str
    optimizer: OptimizerPolicy
    batch: int
    device_name: str = ""
    device_bytes: int | None = None
    checkpoint: bool = False
    foreach: bool = True        # the multi-tensor optimizer step (a GPU's default; not a CPU's)
    loss_dtype: str = "fp32"    # the loss the step was recorded with (`Training.loss_dtype`)
    mtp: int = 0                # multi-token prediction depths it trained (`Training.mtp`)
    mtp_shared: bool = False
    lora: int = 0               # LoRA adapters' rank (`Training.lora`)
    lora_base: str | None = None  # their frozen weights' format (`Training.lora_base`)
    packed: int = 0             # samples' length of packed sequences (`Training.packed`)


def training_section(
    step: TrainingGraph, report: Report, memory: MemoryProfile, registry: CostRegistry,
    settings: StepSettings,
) -> Training:
    graph = step.graph
    flops = Counter[str]()
    for node in report.nodes:
        flops[node.phase] += node.flops
    optimizer_flops = optimizer_step_flops(graph.params, settings.optimizer)
    states = state_memory(graph.params, settings.precision, settings.optimizer)
    persistent = states.total - states.grad_bytes
    gradients = memory.at_peak_by_category.get(Category.GRADIENT.value, 0)
    all_gradients = memory.peak_by_category.get(Category.GRADIENT.value, 0)
    temporaries = _optimizer_temporaries(graph, settings.precision, settings.optimizer,
                                         settings.foreach)
    optimizer_phase = all_gradients + temporaries
    breakdown = PeakBreakdown(persistent_bytes=persistent,
                              fwd_bwd_peak_bytes=memory.peak_activation_bytes,
                              gradients_at_peak_bytes=gradients,
                              optimizer_phase_bytes=optimizer_phase,
                              moments=memory.moments)
    before_first_step = persistent - states.optimizer_bytes
    first_step_peak = before_first_step + max(memory.peak_activation_bytes,
                                              optimizer_phase + states.optimizer_bytes)
    saved = saved_activations(graph, step.saved, registry)
    checkpointing = None
    if settings.checkpoint:
        step_flops = flops["forward"] + flops["backward"] + optimizer_flops
        checkpointing = _checkpointing(step, report, registry, step_flops)
    fit = None
    if settings.device_bytes is not None:
        # NB: with --checkpoint the verdict is for the checkpointed step: the saved
        # activations checkpointing drops come off the forward/backward peak (the recompute's
        # own temporaries, one block at a time, are not added).
        relieved = checkpointing.memory_saved_bytes if checkpointing is not None else 0
        needed = breakdown.step_bytes(relieved)
        activations = max(breakdown.fwd_bwd_bytes(relieved) - gradients, 0)
        per_sample = LinearActivation.proportional(settings.batch, activations)
        verdict = fits(needed, settings.device_bytes)
        # the optimizer step's gradients and temporaries do not shrink with the batch
        batch_fits = persistent + optimizer_phase <= settings.device_bytes
        fit = Fit(device=settings.device_name, device_bytes=settings.device_bytes,
                  fits=verdict.fits, headroom_bytes=verdict.headroom_bytes,
                  utilisation=verdict.utilisation,
                  largest_batch=largest_batch(persistent + gradients, per_sample,
                                              settings.device_bytes) if batch_fits else 0,
                  needed_bytes=needed, with_checkpointing=checkpointing is not None)
    return Training(
        loss_dtype=settings.loss_dtype, mtp=settings.mtp, mtp_shared=settings.mtp_shared,
        lora=settings.lora, lora_layers=adapted_layers(graph.params) if settings.lora else 0,
        packed=settings.packed, lora_base=settings.lora_base,
        precision=settings.precision_name,
        optimizer=settings.optimizer_name,
        forward_flops=flops["forward"],
        backward_flops=flops["backward"],
        optimizer_flops=optimizer_flops,
        optimizer_step_bytes=optimizer_step_bytes(graph.params, settings.precision,
                                                  settings.optimizer),
        step_flops=flops["forward"] + flops["backward"] + optimizer_flops,
        states=states.to_section(),
        saved_activation_bytes=sum(saved.values()),
        saved_by_module=tuple(ModuleBytes(m, b) for m, b in saved.most_common()),
        step_peak_bytes=breakdown.step_bytes(),
        first_step_peak_bytes=first_step_peak,
        peak_breakdown=breakdown,
        checkpointing=checkpointing,
        fit=fit,
    )


def saved_activations(
    graph: Graph, saved: tuple[TensorRef, ...], registry: CostRegistry
) -> Counter[str]:
    """Bytes autograd saves for the backward, per module of the producing node; each storage
    once, parameters, buffers and graph inputs left out."""
    storages = plan_storages(graph, registry)
    by_module: Counter[str] = Counter()
    seen: set[int] = set()
    for ref in saved:
        sid = storages.of_ref.get(ref)
        if sid is None or sid in seen or storages.category[sid] is not Category.ACTIVATION:
            continue
        seen.add(sid)
        node, _ = storages.origin[sid]
        by_module[node.module] += storages.size[sid]
    return by_module


def _optimizer_temporaries(graph: Graph, precision: PrecisionPolicy,
                           optimizer: OptimizerPolicy, foreach: bool = True) -> int:
    """Bytes of the optimizer step's temporaries (see the module docstring); `foreach`: the
    multi-tensor step (torch.optim's default when every parameter is on a GPU)."""
    trainable = [p for p in graph.params if not p.is_buffer and p.requires_grad]
    largest = max((precision.master_bytes(p.spec) or precision.weight_bytes(p.spec)
                   for p in trainable), default=0)
    state_dtype = optimizer.moments_dtype or precision.state_dtype
    every = sum(p.spec.numel for p in trainable) * dtype_bytes(state_dtype)
    copies = optimizer.foreach_temporaries if foreach else 0
    return max(OPTIMIZER_TEMPORARIES * largest, int(copies * every))


def _checkpointing(
    step: TrainingGraph, report: Report, registry: CostRegistry, step_flops: int
) -> Checkpointing:
    graph = step.graph
    blocks = repeated_blocks(graph.module_types)
    saved = saved_activations(graph, step.saved, registry)
    measured = [
        BlockActivations(
            path=block,
            saved_bytes=sum(b for m, b in saved.items() if _inside(m, block)),
            input_bytes=_block_input_bytes(graph, block),
            forward_flops=sum(n.flops for n in report.nodes
                              if n.phase == "forward" and _inside(n.module, block)),
        )
        for block in blocks
    ]
    what_if = checkpoint_what_if(measured)
    return Checkpointing(
        blocks=tuple(blocks),
        saved_bytes_before=what_if.saved_bytes_before,
        saved_bytes_after=what_if.saved_bytes_after,
        memory_saved_bytes=what_if.memory_saved_bytes,
        recompute_flops=what_if.recompute_flops,
        flops_overhead=what_if.flops_overhead(step_flops),
    )


def _inside(module: str, block: str) -> bool:
    return module == block or module.startswith(block + ".")


def _block_input_bytes(graph: Graph, block: str) -> int:
    """Bytes of the activations a block's forward reads but did not produce."""
    inside = {n.id for n in graph.nodes if n.phase == "forward" and _inside(n.module, block)}
    outside: dict[TensorRef, int] = {}
    for node_id in inside:
        for ref in graph.nodes[node_id].input_refs():
            producer = graph.nodes[ref.node]
            spec = graph.spec(ref)
            if ref.node not in inside and producer.kind is NodeKind.CALL and spec is not None:
                outside[ref] = spec.nbytes
    return sum(outside.values())
