"""One layout's memory per GPU, transfers and step time, from a model's `ModelFacts`.

Memory per GPU (the fullest pipeline stage). Parameters split over tp (Megatron pairs,
vocab-parallel embedding and head) are divided by t, expert parameters by ep · etp, then ZeRO
partitions over the GPUs holding the same weights (dp · cp; experts over their expert
data-parallel group): stage 1 (Megatron's distributed optimizer) the optimizer state and
master weights, stage 2 also the gradients, stage 3 also the weights (Rajbhandari et al. 2020:
DDP 16Ψ, ZeRO-1 4Ψ + 12Ψ/N_d, ZeRO-2 2Ψ + 14Ψ/N_d, ZeRO-3 16Ψ/N_d under AMP + Adam), plus under
ZeRO-3 what FSDP holds unsharded: the weights of two units (the one computing and the one
prefetched) and one unit's gradients (the reduce-scatter's input).
Activations: what the units of a stage save, on this GPU's 1/cp of the tokens, on 1/t of the
features inside tensor-parallel pairs and everywhere with sequence parallel (Korthikanti et
al. 2022); with full recompute only each block's input, plus one block's saved set while it
is recomputed. A 1F1B pipeline keeps ``min(m, p − i)`` micro-batches in flight on stage i;
interleaved (v > 1), Megatron-core's schedule warms up ``2(p − i − 1) + (v − 1)p`` model
chunks, so stage i holds ``min(2(p − i − 1) + (v − 1)p + 1, m·v)`` chunks of 1/v of its
layers each (on the first stage ≈ p(1 + 1/v), more than the p of plain 1F1B). The peak is
then taken like the single-GPU step's (`fxlens.analyzer.memory.training_step`): persistent
state + the larger of the forward/backward working set and the optimizer phase; on one GPU the
two agree.

Time: a micro-batch costs each stage its roofline time (split work over t, everything over
cp: causal attention load-balanced as Megatron-core does, two chunks per GPU) plus its
tensor-parallel transfers (on the critical path: not overlapped), its expert all-to-alls
(likewise, unless ``a2a-overlap`` runs them beside another micro-batch's compute), the part of
the ring-attention sends its attention does not hide, and a stage-to-stage transfer. Expert
GEMMs are re-sized for the GPU (`fxlens.analyzer.plan.workload.ExpertGemm`): 1/(t·cp) of the
routed work, the weights of its 1/(ep·etp) of the experts; other ops sized like expert weights
(their casts, gradient copies) run on its 1/(ep·etp). A 1F1B pipeline takes ``(m + (p − 1)/v)``
micro-batch times, the bubble being ``(p − 1)/v`` of them. Gradient and ZeRO traffic overlaps
the compute it can run beside — the gradient reduce the backwards after each model chunk's
last one, ZeRO-1/2's weight gather the next step's first forwards, ZeRO-3 every micro-batch's
compute (`fxlens.analyzer.plan.overlap`) — and only the excess is exposed. The optimizer step
scales with the state a GPU holds. Transfers: `fxlens.analyzer.plan.transfers`.
Compute beside a hidden transfer runs on the SMs the transfer leaves it
(`fxlens.analyzer.plan.transfers.sm_slowdown_s`: the expert all-to-alls and ring sends per
stage, the gradient/ZeRO traffic per step).
NB: congestion, NCCL's tree algorithms and memory traffic competing with compute are
not modelled (a collective's per-call latency is: `fxlens.analyzer.plan.transfers`); expert
load is taken as balanced (every GPU receives its share of the routed rows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fxlens.analyzer.core.sections import Collective, PlanLayout, PlanMemory, PlanRun, PlanTime
from fxlens.analyzer.memory.training_state import StateBytes
from fxlens.analyzer.plan.compression import (
    Matrix,
    on_gpu,
    powersgd_bytes,
    powersgd_flops,
    quantized_bytes,
)
from fxlens.analyzer.plan.overlap import exposed_s, halves_s
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.plan.transfers import (
    Group,
    Links,
    data_parallel,
    expert_parallel,
    pipeline_transfer,
    ring_attention,
    sm_slowdown_s,
    tensor_parallel,
)
from fxlens.analyzer.plan.types import remembered
from fxlens.analyzer.plan.unit_share import (
    is_block,
    phase_s,
    recomputed_share,
    saved_on_gpu,
    scaled,
    unit_state,
    unit_states,
)

DDP_BUCKET_BYTES = 25 * 2**20     # torch DDP's default bucket_cap_mb
DDP_BUCKETS_IN_FLIGHT = 2
ZERO3_UNITS_GATHERED = 2          # the unit computing and the one prefetched
HOST_LINK_BYTES_PER_S = 25e9      # PCIe Gen4 x16 achievable, for offloaded optimizer state
HOST_OPTIMIZER_BYTES_PER_S = 50e9  # a CPU Adam streaming the states (DeepSpeed's CPUAdam)


def stages(units: Sequence[Unit], blocks: int, pp: int) -> list[list[Unit]]:
    """Units per pipeline stage: blocks in contiguous runs as even as possible (the first
    ``blocks % pp`` stages one more), what runs before them on the first, after on the last."""
    block_units = [u for u in units if u.name not in ("pre", "post")]
    pre = [u for u in units if u.name == "pre"]
    post = [u for u in units if u.name == "post"]
    if pp == 1:
        return [list(units)]
    base, extra = divmod(blocks, pp)
    out, start = [], 0
    for i in range(pp):
        size = base + (1 if i < extra else 0)
        out.append(block_units[start:start + size])
        start += size
    out[0] = pre + out[0]
    out[-1] = out[-1] + post
    return out


def in_flight(s: Strategy, stage: int) -> float:
    """Micro-batches of a stage's activations held at once on `stage` (see the docstring)."""
    if s.v == 1:
        return min(s.micro_batches, s.pp - stage)
    chunks = 2 * (s.pp - stage - 1) + (s.v - 1) * s.pp + 1
    return min(chunks, s.micro_batches * s.v) / s.v


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
    expert_exposed_s: float         # every micro-batch
    sm_slowdown_s: float            # every micro-batch: compute beside hidden transfers
    data_parallel: list[Collective]
    boundary_bytes: int             # activation sent to the next stage per micro-batch
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
        return (sum(c.time_s for c in self.tensor_parallel) + self.expert_exposed_s
                + self.ring_exposed_s + self.sm_slowdown_s)


def estimate(facts: ModelFacts, strategy: Strategy, device: Links,
             tokens: int | None = None, price_per_gpu_hour: float | None = None) -> PlanLayout:
    """`strategy` on `device` for the model of `facts` (see the module docstring)."""
    s = strategy
    parts = stages(facts.units, facts.blocks, s.pp)
    evaluated = [_stage(facts, s, device, units, i, parts) for i, units in enumerate(parts)]
    worst = max(evaluated, key=lambda e: e.memory.peak_bytes)
    p2p = pipeline_transfer(s, device, max(e.boundary_bytes for e in evaluated))
    per_micro = max(e.compute_s + e.blocking_s for e in evaluated) / s.micro_batches
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
    timing = PlanTime(
        compute_s=max(e.compute_s for e in evaluated),
        recompute_s=max(evaluated, key=lambda e: e.compute_s).recompute_s,
        tensor_parallel_s=max(sum((c.time_s for c in e.tensor_parallel), 0.0)
                              for e in evaluated),
        expert_parallel_s=max(sum((c.time_s for c in e.expert_parallel), 0.0)
                              for e in evaluated),
        expert_parallel_exposed_s=max(e.expert_exposed_s for e in evaluated),
        overlap_slowdown_s=max(e.sm_slowdown_s for e in evaluated) + dp_slowdown,
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


def _shard_groups(s: Strategy, device: Links) -> tuple[Group, Group]:
    """The groups ZeRO shards the dense and the expert state over (a node's share of them
    when hybrid)."""
    dense = Group(s.dp * s.cp, s.tp)
    expert = Group(s.expert_dp, s.ep * s.expert_tp)
    if not s.hybrid:
        return dense, expert
    return dense.node_share(device.gpus_per_node), expert.node_share(device.gpus_per_node)


def _saved_sums(facts: ModelFacts, t: int, seq_div: int) -> tuple[float, int]:
    """The model's saved activations of a micro-batch, on one GPU before cp and in all
    (remembered on the model per split: every stage of every layout asks)."""
    return remembered(facts.answers, ("saved sums", t, seq_div), lambda: (
        sum(saved_on_gpu(u, t, seq_div) for u in facts.units),
        sum(u.saved_bytes for u in facts.units) or 1))


def _stage(facts: ModelFacts, s: Strategy, device: Links, units: Sequence[Unit], index: int,
           parts: Sequence[Sequence[Unit]]) -> _Stage:
    t, m, c = s.tp, s.micro_batches, s.cp
    seq_div = t if s.sp else 1
    experts_on_gpu = s.ep * s.expert_tp
    dense = StateBytes()
    expert = StateBytes()
    for u in units:
        dense_u, expert_u = unit_states(u, t, experts_on_gpu)
        dense, expert = dense.plus(dense_u), expert.plus(expert_u)
    shard, expert_shard = _shard_groups(s, device)
    held = _zero(dense, s.zero, shard.size).plus(_zero(expert, s.zero, expert_shard.size))
    # the optimizer's temporaries follow the state this GPU updates (none: on the host)
    temporaries = 0.0 if s.offload else facts.optimizer_temporaries_bytes * _updated_share(
        facts.states, held)
    host = 0
    if s.offload:
        host = held.master_bytes + held.optimizer_bytes
        held = StateBytes(held.weights_bytes, 0, held.grad_bytes, 0, held.buffer_bytes)
    held_micro_batches = in_flight(s, index)
    blocks = [u for u in units if s.recompute and is_block(u)]
    if s.checkpoint:
        kept = sum(u.input_bytes / seq_div if is_block(u) else saved_on_gpu(u, t, seq_div)
                   for u in units) / c
        recompute = max((saved_on_gpu(u, t, seq_div) for u in units if is_block(u)),
                        default=0.0) / c
        activations = kept * held_micro_batches + recompute
    else:
        freed = [recomputed_share(s, u)[1] for u in blocks]
        kept = sum(saved_on_gpu(u, t, seq_div) for u in units) - sum(freed)
        # one block's recomputed set lives again while that block's backward runs
        activations = (kept * held_micro_batches + max(freed, default=0.0)) / c
    saved_split, total_saved = _saved_sums(facts, t, seq_div)
    transient = facts.transient_bytes * (saved_split / c) / total_saved
    full_grads = facts.states.grad_bytes or 1
    grads_at_peak = facts.gradients_at_peak_bytes * held.grad_bytes / full_grads
    gathered = 0
    if s.zero == 3 and shard.size > 1:
        unsharded = [unit_state(u, t, experts_on_gpu) for u in units]
        weights = sorted((u.weights_bytes for u in unsharded), reverse=True)
        gathered = (sum(weights[:ZERO3_UNITS_GATHERED])
                    + max((u.grad_bytes for u in unsharded), default=0))
    buckets = DDP_BUCKETS_IN_FLIGHT * DDP_BUCKET_BYTES if s.zero < 3 and s.dp * c > 1 else 0
    mine = (on_gpu([m for u in units for m in u.matrices], t, experts_on_gpu) if s.powersgd
            else [])    # only PowerSGD reads the matrices
    buckets += round(_compression_buffers(s, facts, units, held, gathered, shard, device, mine))
    persistent = held.weights_bytes + held.master_bytes + held.optimizer_bytes + held.buffer_bytes
    working = max(activations + transient + grads_at_peak, held.grad_bytes + temporaries)
    peak = persistent + working + gathered + buckets
    memory = PlanMemory(
        stage=index, weights_bytes=held.weights_bytes, gradients_bytes=held.grad_bytes,
        master_bytes=held.master_bytes, optimizer_bytes=held.optimizer_bytes,
        buffers_bytes=held.buffer_bytes, activations_bytes=round(activations),
        temporaries_bytes=round(max(working - activations - grads_at_peak, 0.0)),
        gathered_bytes=gathered, communication_bytes=buckets, peak_bytes=round(peak),
        host_bytes=host,
    )
    forward = sum(phase_s(s, u, "forward") for u in units)
    backward = sum(phase_s(s, u, "backward") for u in units)
    if s.checkpoint:
        recompute_s = sum(phase_s(s, u, "forward") for u in units if is_block(u))
    else:
        recompute_s = sum(recomputed_share(s, u)[0] for u in blocks)
    ring, ring_exposed = ring_attention(s, device, units)
    experts = expert_parallel(s, device, units, facts.tokens, facts.routing)
    gradients = data_parallel(s, device, dense, expert, shard, expert_shard,
                              facts.grad_element_bytes, mine)
    uncompressed = (data_parallel(_uncompressed(s), device, dense, expert, shard, expert_shard)
                    if s.compresses else gradients)
    nxt = parts[index + 1][0] if index + 1 < len(parts) and parts[index + 1] else None
    exposed = _expert_exposed_s(s, sum(c.time_s for c in experts), m * (forward + recompute_s),
                                m * backward, index)
    return _Stage(
        memory=memory, compute_s=m * (forward + backward + recompute_s),
        backward_s=m * backward, recompute_s=m * recompute_s,
        tensor_parallel=tensor_parallel(s, device, units),
        expert_parallel=experts,
        expert_exposed_s=exposed,
        sm_slowdown_s=(sm_slowdown_s(experts, exposed, device)
                       + sm_slowdown_s(ring, ring_exposed, device)),
        context_parallel=ring, ring_exposed_s=ring_exposed,
        data_parallel=gradients,
        compression_s=(powersgd_flops(mine, s.powersgd) / facts.peak_flops
                       if s.powersgd and facts.peak_flops > 0 else 0.0),
        uncompressed=tuple(uncompressed),
        boundary_bytes=round(nxt.input_bytes / seq_div / c) if nxt is not None else 0,
    )


def _uncompressed(s: Strategy) -> Strategy:
    return replace(s, gradq=None, powersgd=0, zeropp=False)


def _compression_buffers(s: Strategy, facts: ModelFacts, units: Sequence[Unit],
                         held: StateBytes, gathered: float, shard: Group, device: Links,
                         mine: Sequence[Matrix]) -> float:
    """What compression keeps beside the transfers on one GPU: the quantized copy of one
    unit's gradients (gradq); the error-feedback copy of the gradients and the factors
    (PowerSGD); the node-sharded secondary copy of the weights and the int8 gather buffers
    (ZeRO++)."""
    element = facts.grad_element_bytes
    experts_on_gpu = s.ep * s.expert_tp
    if s.gradq:
        largest = max((unit_state(u, s.tp, experts_on_gpu).grad_bytes for u in units),
                      default=0)
        return quantized_bytes(largest, element, 8)
    if s.powersgd:
        return held.grad_bytes + powersgd_bytes(mine, held.grad_bytes, element, s.powersgd)
    if s.zeropp:
        node = shard.per_node(device.gpus_per_node)
        weights = sum(unit_state(u, s.tp, experts_on_gpu).weights_bytes for u in units)
        return weights / node + quantized_bytes(gathered, element, 8)
    return 0.0


def _expert_exposed_s(s: Strategy, all_to_all_s: float, forward_s: float,
                      backward_s: float, stage: int = 0) -> float:
    """The expert all-to-alls' seconds on the critical path of `stage` (all micro-batches).
    With ``a2a-overlap`` (Megatron-core's combined 1F1B) a steady-state forward's transfers
    run beside another micro-batch's backward compute and the backward's beside a forward;
    the forwards of the warm-up, which has no backward to pair with, and as many backwards of
    the cool-down run alone: one micro-batch without a pipeline, and on stage i of an
    interleaved one the ``2(p − i − 1) + (v − 1)p + 1`` chunks it warms up (`in_flight`)."""
    if not s.a2a_overlap:
        return all_to_all_s
    forward_passes = 4 if s.checkpoint else 2
    to_forward = all_to_all_s * forward_passes / (forward_passes + 2)
    steady = (max(0.0, to_forward - backward_s)
              + max(0.0, all_to_all_s - to_forward - forward_s))
    alone = in_flight(s, stage) / s.micro_batches
    return steady * (1 - alone) + all_to_all_s * alone


def _zero(state: StateBytes, stage: int, n: int) -> StateBytes:
    """`state` of one GPU under ZeRO `stage` over `n` data-parallel GPUs."""
    return scaled(state, weights_bytes=n if stage >= 3 else 1,
                   grad_bytes=n if stage >= 2 else 1,
                   master_bytes=n if stage >= 1 else 1, optimizer_bytes=n if stage >= 1 else 1)


def _updated_share(full: StateBytes, held: StateBytes) -> float:
    """The share of the model's optimizer update one GPU runs: of the optimizer state and
    master weights it holds (its stage's layers, 1/t of split ones, 1/(ep·etp) of the
    experts, a ZeRO shard), or of the weights for an optimizer with neither."""
    full_state = full.master_bytes + full.optimizer_bytes
    if full_state:
        return (held.master_bytes + held.optimizer_bytes) / full_state
    return held.weights_bytes / full.weights_bytes if full.weights_bytes else 0.0


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
