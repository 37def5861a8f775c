"""One layout's memory per GPU, transfers and step time, from a model's `ModelFacts`.

Memory per GPU (the fullest pipeline stage). Parameters split over tp (Megatron pairs,
vocab-parallel embedding and head) are divided by t, expert parameters by t·ep, then ZeRO
partitions over the data-parallel group (experts over dp/ep): stage 1 the optimizer state and
master weights, stage 2 also the gradients, stage 3 also the weights (Rajbhandari et al. 2020:
DDP 16Ψ, ZeRO-1 4Ψ + 12Ψ/N_d, ZeRO-2 2Ψ + 14Ψ/N_d, ZeRO-3 16Ψ/N_d under AMP + Adam), plus under
ZeRO-3 what FSDP holds unsharded: the weights of two units (the one computing and the one
prefetched) and one unit's gradients (the reduce-scatter's input).
Activations: what the units of a stage save, on 1/t of the features inside tensor-parallel
pairs and everywhere with sequence parallel (Korthikanti et al. 2022); with checkpointing only
each block's input, plus one block's saved set while it is recomputed; a 1F1B pipeline keeps
``min(m, p − i)`` micro-batches in flight on stage i. The peak is then taken like the single-
GPU step's (`fxlens.analyzer.memory.training_step`): persistent state + the larger of the
forward/backward working set and the optimizer phase; on one GPU the two agree.

Transfers (per GPU, ring algorithms as nccl-tests states them): all-reduce of S bytes over n
GPUs moves ``2(n−1)/n · S``, reduce-scatter, all-gather and all-to-all ``(n−1)/n · S``, a
point-to-point send S, each at the link bandwidth of the group: inside one node when the
group's GPUs are (groups are laid out tp innermost, then dp with ep inside it, pp outermost).
DDP all-reduces the gradients once per step (after accumulation); ZeRO-1/2 reduce-scatter them
and all-gather the updated weights; ZeRO-3 gathers the weights in the forward and again in the
backward and reduce-scatters the gradients for every micro-batch; hybrid sharding does that
inside a node and all-reduces the shards across nodes. Tensor parallel: one all-reduce of each
pair's output in the forward and one of its input gradient in the backward (with sequence
parallel a reduce-scatter and an all-gather, the same bytes), again in a recompute.
Expert parallel: an all-to-all to the experts and one back, in the forward and the backward.

Time: a micro-batch costs each stage its roofline time (split work over t) plus its tensor-
and expert-parallel transfers (on the critical path: not overlapped) and a stage-to-stage
transfer; a 1F1B pipeline takes ``(m + (p − 1)/v)`` micro-batch times, the bubble being
``(p − 1)/v`` of them. Gradient and ZeRO traffic overlaps the compute it can run beside — the
last micro-batch's backward for DDP and ZeRO-1/2, every micro-batch's compute for ZeRO-3 — and
only the excess is exposed. The optimizer step scales with the state a GPU holds.
NB: latency, congestion, NCCL's tree algorithms, and compute slowed by concurrent
communication are not modelled: treat step times as lower bounds and rank layouts with them.
NB: interleaved stages (v > 1) shrink the bubble here, but the extra activations their
schedule keeps in flight on the first stage (Narayanan et al. 2021) are not added.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from fxlens.analyzer.core.sections import Collective, PlanLayout, PlanMemory, PlanRun, PlanTime
from fxlens.analyzer.memory.training_state import StateBytes
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import ModelFacts, Unit

DDP_BUCKET_BYTES = 25 * 2**20     # torch DDP's default bucket_cap_mb
DDP_BUCKETS_IN_FLIGHT = 2
ZERO3_UNITS_GATHERED = 2          # the unit computing and the one prefetched
HOST_LINK_BYTES_PER_S = 25e9      # PCIe Gen4 x16 achievable, for offloaded optimizer state
HOST_OPTIMIZER_BYTES_PER_S = 50e9  # a CPU Adam streaming the states (DeepSpeed's CPUAdam)


class Links(Protocol):
    """What `estimate` reads of a device (`fxlens.rules.hardware.DeviceSpec` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...

    def link_bytes_per_s(self, within_node: bool) -> float: ...


@dataclass(frozen=True)
class Group:
    """A communication group: `size` GPUs spaced `stride` apart in the rank order."""

    size: int
    stride: int

    def within_node(self, gpus_per_node: int) -> bool:
        return self.size * self.stride <= gpus_per_node


def all_reduce_s(payload: float, n: int, bandwidth: float) -> float:
    return 2 * (n - 1) / n * payload / bandwidth if n > 1 else 0.0


def one_way_s(payload: float, n: int, bandwidth: float) -> float:
    """Reduce-scatter, all-gather or all-to-all of `payload` bytes over n GPUs."""
    return (n - 1) / n * payload / bandwidth if n > 1 else 0.0


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


def _scaled(state: StateBytes, **divisors: float) -> StateBytes:
    return StateBytes(**{f.name: math.ceil(getattr(state, f.name) / divisors.get(f.name, 1))
                         for f in fields(StateBytes)})


def _is_block(unit: Unit) -> bool:
    return unit.name not in ("pre", "post")


@dataclass(frozen=True)
class _Stage:
    memory: PlanMemory
    compute_s: float                # one micro-batch, forward + backward (+ recompute)
    backward_s: float
    tensor_parallel: list[Collective]
    expert_parallel: list[Collective]
    data_parallel: list[Collective]
    boundary_bytes: int             # activation sent to the next stage per micro-batch


def estimate(facts: ModelFacts, strategy: Strategy, device: Links,
             tokens: int | None = None, price_per_gpu_hour: float | None = None) -> PlanLayout:
    """`strategy` on `device` for the model of `facts` (see the module docstring)."""
    s = strategy
    parts = stages(facts.units, facts.blocks, s.pp)
    evaluated = [_stage(facts, s, device, units, i, parts) for i, units in enumerate(parts)]
    worst = max(evaluated, key=lambda e: e.memory.peak_bytes)
    p2p = _pipeline_transfer(s, device, evaluated)
    per_micro = max(e.compute_s + sum(c.time_s for c in e.tensor_parallel + e.expert_parallel)
                    for e in evaluated) / s.micro_batches
    per_micro += (p2p.time_s / s.micro_batches) if p2p else 0.0
    bubble = (s.pp - 1) / s.v * per_micro
    busiest = max(evaluated, key=lambda e: sum(c.time_s for c in e.data_parallel))
    dp_s = sum(c.time_s for c in busiest.data_parallel)
    window = busiest.compute_s if s.zero == 3 else busiest.backward_s / s.micro_batches
    exposed = max(0.0, dp_s - window)
    optimizer = _optimizer_s(facts, s, worst.memory)
    step = s.micro_batches * per_micro + bubble + exposed + optimizer
    samples = facts.samples * s.micro_batches * s.dp
    step_tokens = facts.tokens * s.micro_batches * s.dp
    model_flops = facts.flops * s.micro_batches * s.dp
    timing = PlanTime(
        compute_s=max(e.compute_s for e in evaluated),
        tensor_parallel_s=max(sum((c.time_s for c in e.tensor_parallel), 0.0)
                              for e in evaluated),
        expert_parallel_s=max(sum((c.time_s for c in e.expert_parallel), 0.0)
                              for e in evaluated),
        pipeline_s=p2p.time_s if p2p else 0.0, bubble_s=bubble, data_parallel_s=dp_s,
        data_parallel_exposed_s=exposed, optimizer_s=optimizer, step_s=step,
        samples_per_step=samples, tokens_per_step=step_tokens,
        tokens_per_s=step_tokens / step if step > 0 else 0.0,
        mfu=model_flops / (step * s.gpus * facts.peak_flops)
        if step > 0 and facts.peak_flops > 0 else 0.0,
    )
    collectives = tuple(worst.tensor_parallel + worst.expert_parallel + busiest.data_parallel
                        + ([p2p] if p2p else []))
    headroom = device.memory_bytes - worst.memory.peak_bytes
    return PlanLayout(
        strategy=s.label, gpus=s.gpus, nodes=math.ceil(s.gpus / device.gpus_per_node),
        dp=s.dp, tp=s.tp, pp=s.pp, ep=s.ep, zero=s.zero, micro_batches=s.micro_batches,
        memory=worst.memory, collectives=collectives, time=timing, fits=headroom >= 0,
        headroom_bytes=headroom, run=_run(step, step_tokens, s.gpus, tokens, price_per_gpu_hour),
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


def _shard_group(s: Strategy, device: Links) -> Group:
    """The data-parallel group ZeRO shards over (a node's share of it when hybrid)."""
    if s.hybrid:
        return Group(min(s.dp, max(1, device.gpus_per_node // s.tp)), s.tp)
    return Group(s.dp, s.tp)


def _stage(facts: ModelFacts, s: Strategy, device: Links, units: Sequence[Unit], index: int,
           parts: Sequence[Sequence[Unit]]) -> _Stage:
    t, m = s.tp, s.micro_batches
    seq_div = t if s.sp else 1
    dense = StateBytes()
    expert = StateBytes()
    for u in units:
        dense = dense.plus(_scaled(u.states_split, **_all(t))).plus(u.states_whole)
        expert = expert.plus(_scaled(u.states_expert, **_all(t * s.ep)))   # ZeRO: other groups
    shard = _shard_group(s, device)
    expert_shard = max(1, shard.size // s.ep)
    held = _zero(dense, s.zero, shard.size).plus(_zero(expert, s.zero, expert_shard))
    host = 0
    if s.offload:
        host = held.master_bytes + held.optimizer_bytes
        held = StateBytes(held.weights_bytes, 0, held.grad_bytes, 0, held.buffer_bytes)
    in_flight = min(m, s.pp - index)
    if s.checkpoint:
        kept = sum(u.input_bytes / seq_div if _is_block(u) else _saved_on_gpu(u, t, seq_div)
                   for u in units)
        recompute = max((_saved_on_gpu(u, t, seq_div) for u in units if _is_block(u)),
                        default=0.0)
        activations = kept * in_flight + recompute
    else:
        activations = sum(_saved_on_gpu(u, t, seq_div) for u in units) * in_flight
    total_saved = sum(u.saved_bytes for u in facts.units) or 1
    all_saved_split = sum(_saved_on_gpu(u, t, seq_div) for u in facts.units)
    transient = facts.transient_bytes * all_saved_split / total_saved
    full_grads = facts.states.grad_bytes or 1
    grads_at_peak = facts.gradients_at_peak_bytes * held.grad_bytes / full_grads
    optimizer_shard = shard.size if s.zero >= 1 else 1
    temporaries = facts.optimizer_temporaries_bytes / (t * optimizer_shard)
    gathered = 0
    if s.zero == 3 and shard.size > 1:
        unsharded = [_unit_state(u, t, s.ep) for u in units]
        weights = sorted((u.weights_bytes for u in unsharded), reverse=True)
        gathered = (sum(weights[:ZERO3_UNITS_GATHERED])
                    + max((u.grad_bytes for u in unsharded), default=0))
    buckets = DDP_BUCKETS_IN_FLIGHT * DDP_BUCKET_BYTES if s.zero < 3 and s.dp > 1 else 0
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
    forward = sum(u.forward_split_s / t + u.forward_whole_s / (seq_div if _is_block(u) else 1)
                  for u in units)
    backward = sum(u.backward_split_s / t + u.backward_whole_s / (seq_div if _is_block(u) else 1)
                   for u in units)
    recompute_s = sum(u.forward_split_s / t + u.forward_whole_s / seq_div
                      for u in units if _is_block(u)) if s.checkpoint else 0.0
    compute = m * (forward + backward + recompute_s)
    nxt = parts[index + 1][0] if index + 1 < len(parts) and parts[index + 1] else None
    return _Stage(
        memory=memory, compute_s=compute, backward_s=m * backward,
        tensor_parallel=_tensor_parallel(s, device, units),
        expert_parallel=_expert_parallel(s, device, units),
        data_parallel=_data_parallel(s, device, dense, expert, shard),
        boundary_bytes=round(nxt.input_bytes / seq_div) if nxt is not None else 0,
    )


def _saved_on_gpu(unit: Unit, t: int, seq_div: int) -> float:
    """One micro-batch's saved activations of `unit` on one GPU: the split part over t, the
    rest over t only with sequence parallel (`seq_div`)."""
    return unit.saved_split_bytes / t + unit.saved_whole_bytes / seq_div


def _unit_state(unit: Unit, t: int, ep: int) -> StateBytes:
    """One unit's state on one GPU before ZeRO: split over t, experts over t·ep."""
    return (_scaled(unit.states_split, **_all(t)).plus(unit.states_whole)
            .plus(_scaled(unit.states_expert, **_all(t * ep))))


def _all(divisor: float) -> dict[str, float]:
    return {f.name: divisor for f in fields(StateBytes)}


def _zero(state: StateBytes, stage: int, n: int) -> StateBytes:
    """`state` of one GPU under ZeRO `stage` over `n` data-parallel GPUs."""
    return _scaled(state, weights_bytes=n if stage >= 3 else 1,
                   grad_bytes=n if stage >= 2 else 1,
                   master_bytes=n if stage >= 1 else 1, optimizer_bytes=n if stage >= 1 else 1)


def _collective(kind: str, cause: str, group: Group, payload: float, calls: int,
                device: Links, overlapped: bool) -> Collective:
    inside = group.within_node(device.gpus_per_node)
    bandwidth = device.link_bytes_per_s(inside)
    if kind == "all-reduce":
        each = all_reduce_s(payload, group.size, bandwidth)
    elif kind == "p2p":
        each = payload / bandwidth
    else:
        each = one_way_s(payload, group.size, bandwidth)
    return Collective(kind=kind, cause=cause, group=group.size, across_nodes=not inside,
                      bytes=round(payload), calls=calls, time_s=each * calls,
                      overlapped=overlapped)


def _tensor_parallel(s: Strategy, device: Links, units: Sequence[Unit]) -> list[Collective]:
    if s.tp == 1:
        return []
    reduces = sum(u.tp_reduces for u in units)
    if not reduces:
        return []
    payload = sum(u.tp_reduce_bytes for u in units) / reduces
    passes = 3 if s.checkpoint else 2          # forward, backward, and the recompute
    calls = reduces * passes * s.micro_batches
    group = Group(s.tp, 1)
    if s.sp:
        return [_collective(kind, "tp activations (sp)", group,
                            payload, calls, device, False)
                for kind in ("reduce-scatter", "all-gather")]
    return [_collective("all-reduce", "tp activations", group, payload, calls,
                        device, False)]


def _expert_parallel(s: Strategy, device: Links, units: Sequence[Unit]) -> list[Collective]:
    routed = sum(u.routed_bytes for u in units)
    if s.ep == 1 or not routed:
        return []
    passes = 6 if s.checkpoint else 4          # to the experts and back, forward and backward
    return [_collective("all-to-all", "expert routing", Group(s.ep, s.tp),
                        routed, passes * s.micro_batches, device, False)]


def _data_parallel(s: Strategy, device: Links, dense: StateBytes, expert: StateBytes,
                   shard: Group) -> list[Collective]:
    out: list[Collective] = []
    for label, state, size in (("", dense, s.dp), ("expert ", expert, s.dp // s.ep)):
        if size <= 1 or not state.grad_bytes:
            continue
        group = Group(size, s.tp * (s.ep if label else 1))
        grads, weights = state.grad_bytes, state.weights_bytes
        if s.zero == 0:
            out.append(_collective("all-reduce", f"{label}gradients (DDP)", group, grads, 1,
                                   device, True))
        elif s.zero in (1, 2):
            out.append(_collective("reduce-scatter", f"{label}gradients (ZeRO-{s.zero})", group,
                                   grads, 1, device, True))
            out.append(_collective("all-gather", f"{label}updated weights (ZeRO-{s.zero})",
                                   group, weights, 1, device, True))
        else:
            inner = Group(min(shard.size, size), group.stride)
            m = s.micro_batches
            out.append(_collective("all-gather", f"{label}weights (ZeRO-3)", inner, weights,
                                   2 * m, device, True))
            out.append(_collective("reduce-scatter", f"{label}gradients (ZeRO-3)", inner, grads,
                                   m, device, True))
            replicas = size // inner.size
            if replicas > 1:
                out.append(_collective("all-reduce", f"{label}gradient shards (hybrid)",
                                       Group(replicas, group.stride * inner.size),
                                       grads / inner.size, 1, device, True))
    return out


def _pipeline_transfer(s: Strategy, device: Links, evaluated: Sequence[_Stage]
                       ) -> Collective | None:
    if s.pp == 1:
        return None
    payload = max(e.boundary_bytes for e in evaluated)
    group = Group(2, s.tp * s.dp)
    # Each micro-batch: the activation forward, its gradient backward.
    return _collective("p2p", "stage boundary", group, payload,
                       2 * s.micro_batches, device, False)


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
