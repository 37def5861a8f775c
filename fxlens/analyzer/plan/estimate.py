"""One layout's memory per GPU, transfers and step time, from a model's `ModelFacts`.

Memory per GPU: the fullest pipeline stage's (`fxlens.analyzer.plan.stage_memory`).

Time: a micro-batch costs each stage its roofline time (split work over t, everything over
cp: causal attention load-balanced as Megatron-core does, two chunks per GPU) plus its
tensor-parallel transfers (on the critical path, unless ``tp-overlap`` runs them beside their
GEMMs), its expert all-to-alls (likewise, unless ``a2a-overlap`` runs them beside another
micro-batch's compute, layer by layer: `fxlens.analyzer.plan.a2a_overlap`), the part of the
context-parallel exchanges its attention does not hide
(`fxlens.analyzer.plan.context_parallel`), and a stage-to-stage transfer; no less than the
host takes to launch its kernels (`fxlens.analyzer.plan.host`). Expert
GEMMs are re-sized for the GPU (`fxlens.analyzer.plan.workload.ExpertGemm`): 1/(t·cp) of the
routed work, the weights of its 1/(ep·etp) of the experts; other ops sized like expert weights
(their casts, gradient copies) run on its 1/(ep·etp). A 1F1B pipeline takes ``(m + (p − 1)/v)``
micro-batch times, the bubble being ``(p − 1)/v`` of them. Gradient and ZeRO traffic overlaps
the compute it can run beside — the gradient reduce the backwards after each model chunk's
last one, ZeRO-1/2's weight gather the next step's first forwards, ZeRO-3 every micro-batch's
compute (`fxlens.analyzer.plan.overlap`) — and only the excess is exposed. The optimizer step
scales with the state a GPU holds. Transfers: `fxlens.analyzer.plan.transfers`.
Compute beside a hidden transfer runs on the SMs the transfer leaves it
(`fxlens.analyzer.plan.transfers.sm_slowdown_s`: the expert all-to-alls, ring sends and
overlapped tensor-parallel collectives per stage, the gradient/ZeRO traffic per step).
NB: congestion, NCCL's tree algorithms and memory traffic competing with compute are
not modelled (a collective's per-call latency is: `fxlens.analyzer.plan.transfers`); expert
load is taken as balanced (every GPU receives its share of the routed rows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fxlens.analyzer.core.sections import Collective, PlanLayout, PlanMemory, PlanRun, PlanTime
from fxlens.analyzer.plan.a2a_overlap import expert_exposed_s
from fxlens.analyzer.plan.compression import powersgd_flops
from fxlens.analyzer.plan.context_parallel import context_parallel
from fxlens.analyzer.plan.host import host_s
from fxlens.analyzer.plan.overlap import exposed_s, halves_s
from fxlens.analyzer.plan.stage_memory import (
    distinct_stages,
    model_stages,
    stage_memory,
)
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.plan.transfers import (
    Links,
    data_parallel,
    expert_parallel,
    pipeline_transfer,
    sm_slowdown_s,
    tensor_parallel,
    tensor_parallel_exposed_s,
)
from fxlens.analyzer.plan.unit_share import is_block, phase_s, recomputed_s

HOST_LINK_BYTES_PER_S = 25e9      # PCIe Gen4 x16 achievable, for offloaded optimizer state
HOST_OPTIMIZER_BYTES_PER_S = 50e9  # a CPU Adam streaming the states (DeepSpeed's CPUAdam)


@dataclass(frozen=True)
class _Stage:
    memory: PlanMemory
    compute_s: float                # every micro-batch, forward + backward (+ recompute)
    backward_s: float
    recompute_s: float              # every micro-batch, of compute_s
    tensor_parallel: list[Collective]
    expert_parallel: list[Collective]
    context_parallel: list[Collective]
    ring_exposed_s: float           # every micro-batch
    tensor_exposed_s: float         # every micro-batch: the tp collectives' exposed part
    expert_exposed_s: float         # every micro-batch
    sm_slowdown_s: float            # every micro-batch: compute beside hidden transfers
    data_parallel: list[Collective]
    boundary_bytes: int             # activation sent to the next stage per micro-batch
    host_s: float = 0.0             # every micro-batch: the host launching its kernels
    compression_s: float = 0.0      # PowerSGD's factorisation, on the data-parallel path
    uncompressed: tuple[Collective, ...] = ()   # the data-parallel transfers uncompressed

    @property
    def forward_s(self) -> float:
        """Every micro-batch's forward (recompute runs with the backward)."""
        return self.compute_s - self.backward_s - self.recompute_s

    def data_parallel_exposed_s(self, s: Strategy, compressed: bool = True) -> float:
        """The data-parallel seconds the stage's compute does not hide
        (`fxlens.analyzer.plan.overlap`); uncompressed: as without compression."""
        reduce, gather = (halves_s(s, self.data_parallel, self.compression_s) if compressed
                          else halves_s(s, self.uncompressed))
        return exposed_s(s, reduce, gather, self.forward_s,
                         self.backward_s + self.recompute_s)

    @property
    def data_parallel_s(self) -> float:
        return sum(c.time_s for c in self.data_parallel) + self.compression_s

    @property
    def blocking_s(self) -> float:
        """Transfers on the critical path, every micro-batch."""
        return (self.tensor_exposed_s + self.expert_exposed_s + self.ring_exposed_s
                + self.sm_slowdown_s)


def estimate(facts: ModelFacts, strategy: Strategy, device: Links,
             tokens: int | None = None, price_per_gpu_hour: float | None = None) -> PlanLayout:
    """`strategy` on `device` for the model of `facts` (see the module docstring)."""
    s = strategy
    parts = model_stages(facts, s)
    evaluated = [_stage(facts, s, device, units, i, parts)
                 for i, units in distinct_stages(facts, s)]
    worst = max(evaluated, key=lambda e: e.memory.peak_bytes)
    p2p = pipeline_transfer(s, device, max(e.boundary_bytes for e in evaluated))
    gpu_micro = max(e.compute_s + e.blocking_s for e in evaluated) / s.micro_batches
    # a micro-batch runs no faster than the host launches its kernels (`plan.host`)
    per_micro = max(max(e.compute_s + e.blocking_s, e.host_s) for e in evaluated) \
        / s.micro_batches
    host_wait = s.micro_batches * (per_micro - gpu_micro)
    per_micro += (p2p.time_s / s.micro_batches) if p2p else 0.0
    bubble = (s.pp - 1) / s.v * per_micro
    busiest = max(evaluated, key=lambda e: e.data_parallel_s)
    dp_s = busiest.data_parallel_s
    exposed = busiest.data_parallel_exposed_s(s)
    dp_slowdown = sm_slowdown_s(busiest.data_parallel, exposed, device, total_s=dp_s)
    optimizer = _optimizer_s(facts, s, worst.memory)
    step = s.micro_batches * per_micro + bubble + exposed + dp_slowdown + optimizer
    samples = facts.samples * s.micro_batches * s.dp
    step_tokens = facts.tokens * s.micro_batches * s.dp
    model_flops = facts.flops * s.micro_batches * s.dp
    slowest = max(evaluated, key=lambda e: e.compute_s)
    timing = PlanTime(
        compute_s=slowest.compute_s, recompute_s=slowest.recompute_s,
        forward_s=slowest.forward_s,
        tensor_parallel_s=max(sum((c.time_s for c in e.tensor_parallel), 0.0)
                              for e in evaluated),
        tensor_parallel_exposed_s=(max(e.tensor_exposed_s for e in evaluated)
                                   if s.tp_overlap else None),
        expert_parallel_s=max(sum((c.time_s for c in e.expert_parallel), 0.0)
                              for e in evaluated),
        expert_parallel_exposed_s=max(e.expert_exposed_s for e in evaluated),
        overlap_slowdown_s=max(e.sm_slowdown_s for e in evaluated) + dp_slowdown,
        host_s=max(e.host_s for e in evaluated), host_wait_s=host_wait,
        pipeline_s=p2p.time_s if p2p else 0.0, bubble_s=bubble, data_parallel_s=dp_s,
        data_parallel_exposed_s=exposed, optimizer_s=optimizer, step_s=step,
        samples_per_step=samples, tokens_per_step=step_tokens,
        tokens_per_s=step_tokens / step if step > 0 else 0.0,
        mfu=model_flops / (step * s.gpus * facts.peak_flops)
        if step > 0 and facts.peak_flops > 0 else 0.0,
        context_parallel_s=max(e.ring_exposed_s for e in evaluated),
        uncompressed_data_parallel_s=(sum(c.time_s for c in busiest.uncompressed)
                                      if s.compresses else None),
        uncompressed_exposed_s=(busiest.data_parallel_exposed_s(s, compressed=False)
                                if s.compresses else None),
    )
    collectives = tuple(worst.tensor_parallel + worst.context_parallel + worst.expert_parallel
                        + busiest.data_parallel + ([p2p] if p2p else []))
    headroom = device.usable_bytes - worst.memory.peak_bytes
    return PlanLayout(
        strategy=s.label, gpus=s.gpus, nodes=math.ceil(s.gpus / device.gpus_per_node),
        dp=s.dp, tp=s.tp, pp=s.pp, ep=s.ep, zero=s.zero, micro_batches=s.micro_batches,
        memory=worst.memory, collectives=collectives, time=timing, fits=headroom >= 0,
        headroom_bytes=headroom, run=_run(step, step_tokens, s.gpus, tokens, price_per_gpu_hour),
        cp=s.cp, etp=s.expert_tp, v=s.v,
    )


def _run(step_s: float, step_tokens: int, gpus: int, tokens: int | None,
         price: float | None) -> PlanRun | None:
    if tokens is None or step_tokens <= 0:
        return None
    steps = math.ceil(tokens / step_tokens)
    wall = steps * step_s
    hours = wall * gpus / 3600
    return PlanRun(steps=steps, wall_s=wall, gpu_hours=hours,
                   cost=hours * price if price is not None else None)


def _stage(facts: ModelFacts, s: Strategy, device: Links, units: Sequence[Unit], index: int,
           parts: Sequence[Sequence[Unit]]) -> _Stage:
    m, c = s.micro_batches, s.cp
    seq_div = s.tp if s.sp else 1
    stored = stage_memory(facts, s, device, index)
    dense, expert, shard, expert_shard = (stored.dense, stored.expert, stored.shard,
                                          stored.expert_shard)
    mine = stored.matrices
    forward = sum(phase_s(s, u, "forward") for u in units)
    backward = sum(phase_s(s, u, "backward") for u in units)
    if s.checkpoint:
        recompute_s = sum(phase_s(s, u, "forward") for u in units if is_block(u))
    elif s.checkpoint_ops:
        recompute_s = sum(phase_s(s, facts.twin(u).op_policy, "forward") for u in units
                          if is_block(u))
    else:
        recompute_s = sum(recomputed_s(s, facts.twin(u)) for u in units
                          if s.recompute and is_block(u))
    ring, ring_exposed = context_parallel(s, device, units)
    experts = expert_parallel(s, device, units, facts.tokens, facts.routing)
    gradients = data_parallel(s, device, dense, expert, shard, expert_shard,
                              facts.grad_element_bytes, mine)
    uncompressed = (data_parallel(_uncompressed(s), device, dense, expert, shard, expert_shard)
                    if s.compresses else gradients)
    nxt = parts[index + 1][0] if index + 1 < len(parts) and parts[index + 1] else None
    exposed = expert_exposed_s(s, units, sum(c.time_s for c in experts), index)
    tp = tensor_parallel(s, device, units)
    tp_exposed = tensor_parallel_exposed_s(s, sum(c.time_s for c in tp),
                                           _split_gemm_s(s, units) if s.tp_overlap else 0.0)
    return _Stage(
        memory=stored.memory, compute_s=m * (forward + backward + recompute_s),
        backward_s=m * backward, recompute_s=m * recompute_s,
        tensor_parallel=tp, tensor_exposed_s=tp_exposed,
        expert_parallel=experts,
        expert_exposed_s=exposed,
        sm_slowdown_s=(sm_slowdown_s(experts, exposed, device)
                       + sm_slowdown_s(ring, ring_exposed, device)
                       + sm_slowdown_s(tp, tp_exposed, device)),
        context_parallel=ring, ring_exposed_s=ring_exposed,
        data_parallel=gradients,
        compression_s=(powersgd_flops(mine, s.powersgd) / facts.peak_flops
                       if s.powersgd and facts.peak_flops > 0 else 0.0),
        uncompressed=tuple(uncompressed),
        boundary_bytes=round(nxt.input_bytes / seq_div / c) if nxt is not None else 0,
        host_s=m * host_s(s, units, device.framework_launch_s),
    )


def _split_gemm_s(s: Strategy, units: Sequence[Unit]) -> float:
    """Every micro-batch's seconds on split features (the GEMMs tp-overlap hides transfers
    behind), a recomputed forward's included."""
    forwards = 2 if s.checkpoint else 1
    return s.micro_batches * sum(forwards * u.forward_split_s + u.backward_split_s
                                 for u in units) / (s.tp * s.cp)


def _uncompressed(s: Strategy) -> Strategy:
    return replace(s, gradq=None, powersgd=0, zeropp=False)


def _optimizer_s(facts: ModelFacts, s: Strategy, memory: PlanMemory) -> float:
    """The single-GPU optimizer step scaled to the state one GPU updates; offloaded: the
    gradients down and the weights up over PCIe, the update at host speed."""
    full = facts.states
    full_bytes = full.weights_bytes + full.master_bytes + full.optimizer_bytes + full.grad_bytes
    if s.offload:
        host_states = memory.host_bytes + memory.gradients_bytes
        return ((memory.gradients_bytes + memory.weights_bytes) / HOST_LINK_BYTES_PER_S
                + host_states / HOST_OPTIMIZER_BYTES_PER_S)
    held = (memory.weights_bytes + memory.master_bytes + memory.optimizer_bytes
            + memory.gradients_bytes)
    return facts.optimizer_s * held / full_bytes if full_bytes else 0.0
