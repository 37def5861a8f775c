"""One layout's memory per GPU, stage by stage, from a model's `ModelFacts`.

Parameters split over tp (Megatron pairs, vocab-parallel embedding and head) are divided by t,
expert parameters by ep · etp, then ZeRO partitions over the GPUs holding the same weights
(dp · cp; experts over their expert data-parallel group): stage 1 (Megatron's distributed
optimizer) the optimizer state and master weights, stage 2 also the gradients, stage 3 also
the weights (Rajbhandari et al. 2020: DDP 16Ψ, ZeRO-1 4Ψ + 12Ψ/N_d, ZeRO-2 2Ψ + 14Ψ/N_d,
ZeRO-3 16Ψ/N_d under AMP + Adam), plus under ZeRO-3 what FSDP holds unsharded: the weights of
two units (the one computing and the one prefetched) and one unit's gradients (the
reduce-scatter's input); under a pipeline, as PyTorch's pipeline schedules run FSDP2, the
whole stage's weights and gradients (`fxlens.analyzer.plan.transfers.zero3_pipelined`).
Activations: what the units of a stage save, on this GPU's 1/cp of the tokens, on 1/t of the
features inside tensor-parallel pairs and everywhere with sequence parallel (Korthikanti et
al. 2022); with full recompute only each block's input, plus one block's saved set while it
is recomputed. Beside them the working tensors (the forward's temporaries, the backward's
activation gradients) and the gradients, as the one-GPU step holds them at its peak and where
its working tensors peak (`PeakBreakdown.moments`; a MoE captured with all its experts peaks at
the end of its backward, every expert's gradient live, which a GPU holding 1/ep of them does
not), the larger; under Megatron-core's all-to-all dispatcher also the copies of a layer's
routed rows it stages (`_staging`). A 1F1B pipeline keeps ``min(m, p − i)`` micro-batches in
flight on stage i; interleaved (v > 1), Megatron-core's schedule warms up
``2(p − i − 1) + (v − 1)p`` model chunks, so stage i holds ``min(2(p − i − 1) + (v − 1)p + 1,
m·v)`` chunks of 1/v of its layers each (on the first stage ≈ p(1 + 1/v), more than the p of
plain 1F1B). The peak is then taken like the single-GPU step's
(`fxlens.analyzer.memory.training_step`): persistent state + the larger of the
forward/backward working set and the optimizer phase; on one GPU the two agree.

Memory is asked alone (`peak_bytes`) where only "does it fit" matters — ``ckpt=auto``'s
choice and a search's layouts that do not fit — and the sums a stage reads are remembered on
the model per pipeline split and degrees. Of stages alike only the first is asked
(`distinct_stages`): a DeepSeek-V3 pipeline of 16 stages has four kinds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.sections import PlanMemory
from fxlens.analyzer.memory.training_state import StateBytes
from fxlens.analyzer.plan.compression import Matrix, on_gpu, powersgd_bytes, quantized_bytes
from fxlens.analyzer.plan.pipeline_layout import SLOTS, by_rank, resolved
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.plan.transfers import (
    PIPELINED_GRAD_BYTES,
    Group,
    Links,
    dispatcher,
    zero3_pipelined,
)
from fxlens.analyzer.plan.types import remembered
from fxlens.analyzer.plan.unit_share import (
    degrees,
    is_block,
    recomputed_bytes,
    saved_on_gpu,
    scaled,
    unit_state,
    unit_states,
)

DDP_BUCKET_BYTES = 25 * 2**20     # torch DDP's default bucket_cap_mb
DDP_BUCKETS_IN_FLIGHT = 2
ZERO3_UNITS_GATHERED = 2          # the unit computing and the one prefetched
ALLTOALL_STAGING = 2              # routed-row copies the all-to-all dispatcher adds (`_staging`)


def stages(units: Sequence[Unit], blocks: int, pp: int,
           layout: tuple[str, ...] | None = None) -> list[list[Unit]]:
    """Units per pipeline stage: blocks in contiguous runs as even as possible (the first
    ``blocks % pp`` stages one more), what runs before them on the first, after on the last;
    with a `layout` (`fxlens.analyzer.plan.pipeline_layout`), where it puts them."""
    block_units = [u for u in units if u.name not in ("pre", "post")]
    pre = [u for u in units if u.name == "pre"]
    post = [u for u in units if u.name == "post"]
    if pp == 1:
        return [list(units)]
    if layout is not None:
        return _laid_out(pre, block_units, post, layout, pp)
    base, extra = divmod(blocks, pp)
    out, start = [], 0
    for i in range(pp):
        size = base + (1 if i < extra else 0)
        out.append(block_units[start:start + size])
        start += size
    out[0] = pre + out[0]
    out[-1] = out[-1] + post
    return out


def _laid_out(pre: list[Unit], blocks: list[Unit], post: list[Unit], layout: tuple[str, ...],
              pp: int) -> list[list[Unit]]:
    """Each rank's units as `layout` places them: its chunks (virtual stages r, r + pp, …)
    in turn, ``e`` the units before the blocks, each ``t`` the next block in layer order,
    ``l`` the units after them (``m`` with it: the MTP depths are in that unit)."""
    if sum(symbols.count("t") for symbols in layout) != len(blocks):
        raise ValueError(f"the layout places {sum(s.count('t') for s in layout)} blocks, the "
                         f"model has {len(blocks)} (`layout_problems` says so first)")
    order = iter(blocks)
    chunks: list[list[Unit]] = []
    for symbols in layout:
        chunk: list[Unit] = []
        for symbol in symbols:
            chunk += pre if symbol == "e" else post if symbol == "l" else (
                [next(order)] if symbol == "t" else [])
        chunks.append(chunk)
    return [[u for chunk in held for u in chunk] for held in by_rank(chunks, pp)]


def split_key(s: Strategy) -> tuple[int, str | None, int]:
    """What a stage's units depend on: pp, the layout and, for ``layout=slots``, v (the key
    of remembered sums)."""
    return s.pp, s.layout, s.v if s.layout == SLOTS else 1


def model_stages(facts: ModelFacts, s: Strategy) -> list[list[Unit]]:
    """`stages` of the model's units under `s` (remembered on the model per pp and layout)."""
    return remembered(facts.answers, ("stages", *split_key(s)), lambda: stages(
        facts.units, facts.blocks, s.pp, resolved(s.layout, facts.blocks, s.pp, s.v)))


def in_flight(s: Strategy, stage: int) -> float:
    """Micro-batches of a stage's activations held at once on `stage` (see the docstring)."""
    if s.v == 1:
        return min(s.micro_batches, s.pp - stage)
    chunks = 2 * (s.pp - stage - 1) + (s.v - 1) * s.pp + 1
    return min(chunks, s.micro_batches * s.v) / s.v


@dataclass(frozen=True)
class StageMemory:
    """A stage's memory on one GPU and the state it was summed from (the transfers read it)."""

    memory: PlanMemory
    dense: StateBytes           # the stage's dense state on one GPU before ZeRO
    expert: StateBytes          # its experts' state on one GPU before ZeRO
    shard: Group                # the GPUs ZeRO shards the dense state over
    expert_shard: Group         # and the experts' state
    matrices: list[Matrix]      # this GPU's gradient matrices (PowerSGD only)


def peak_bytes(facts: ModelFacts, s: Strategy, device: Links) -> int:
    """The fullest stage's peak on one GPU under `s`."""
    return max(stage_memory(facts, s, device, i).memory.peak_bytes
               for i, _ in distinct_stages(facts, s))


def distinct_stages(facts: ModelFacts, s: Strategy) -> list[tuple[int, list[Unit]]]:
    """The stages that can be a layout's fullest or slowest, with their index: of a run of
    stages holding units alike (`ModelFacts.twin`) and sending to a stage that starts alike,
    the first, which keeps the most micro-batches in flight and so holds the most and
    exposes the most of its transfers (remembered per pp and layout)."""
    def work() -> list[tuple[int, list[Unit]]]:
        parts = model_stages(facts, s)
        seen: set[tuple[str, ...]] = set()
        first = []
        for i, units in enumerate(parts):
            after = parts[i + 1][:1] if i + 1 < len(parts) else []
            alike = tuple(facts.twin(u).name for u in [*units, *after]) + (str(len(units)),)
            if alike not in seen:
                seen.add(alike)
                first.append((i, units))
        return first
    return remembered(facts.answers, ("distinct stages", *split_key(s)), work)


def stage_memory(facts: ModelFacts, s: Strategy, device: Links, index: int) -> StageMemory:
    """Pipeline stage `index` on one GPU (see the module docstring); the sums it reads are
    remembered per pp and index, so its units are always `model_stages`'s."""
    units = model_stages(facts, s)[index]
    t, c = s.tp, s.cp
    experts_on_gpu = s.ep * s.expert_tp
    dense, expert = _stage_states(facts, s, units, index)
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
    if s.checkpoint or s.checkpoint_ops:
        kept, recompute = _checkpointed(facts, s, units, index)
        one = kept / c            # what one micro-batch keeps, freed as its backward runs
        activations = one * held_micro_batches + recompute / c
    else:
        saved, freed_sum, freed_max = _selective(facts, s, units, index)
        one = (saved - freed_sum) / c
        # one block's recomputed set lives again while that block's backward runs
        activations = one * held_micro_batches + freed_max / c
    fwd_bwd, grads_at_peak = _forward_backward(facts, s, held, activations, one)
    fwd_bwd += _staging(facts, s, device, units)
    gathered = 0
    if s.zero == 3 and shard.size > 1:
        unsharded = [unit_state(u, t, experts_on_gpu) for u in units]
        weights = sorted((u.weights_bytes for u in unsharded), reverse=True)
        if zero3_pipelined(s):     # the stage's weights and float32 gradients whole
            grads = sum(u.grad_bytes for u in unsharded)
            gathered = round(sum(weights)
                             + grads * PIPELINED_GRAD_BYTES / facts.grad_element_bytes)
        else:
            gathered = (sum(weights[:ZERO3_UNITS_GATHERED])
                        + max((u.grad_bytes for u in unsharded), default=0))
    buckets = DDP_BUCKETS_IN_FLIGHT * DDP_BUCKET_BYTES if s.zero < 3 and s.dp * c > 1 else 0
    mine = (on_gpu([m for u in units for m in u.matrices], t, experts_on_gpu) if s.powersgd
            else [])    # only PowerSGD reads the matrices
    buckets += round(_compression_buffers(s, facts, units, held, gathered, shard, device, mine))
    persistent = held.weights_bytes + held.master_bytes + held.optimizer_bytes + held.buffer_bytes
    working = max(fwd_bwd, held.grad_bytes + temporaries)
    peak = persistent + working + gathered + buckets
    memory = PlanMemory(
        stage=index, weights_bytes=held.weights_bytes, gradients_bytes=held.grad_bytes,
        master_bytes=held.master_bytes, optimizer_bytes=held.optimizer_bytes,
        buffers_bytes=held.buffer_bytes, activations_bytes=round(activations),
        temporaries_bytes=round(max(working - activations - grads_at_peak, 0.0)),
        gathered_bytes=gathered, communication_bytes=buckets, peak_bytes=round(peak),
        host_bytes=host,
    )
    return StageMemory(memory, dense, expert, shard, expert_shard, mine)


def _forward_backward(facts: ModelFacts, s: Strategy, held: StateBytes, activations: float,
                      one: float) -> tuple[float, float]:
    """The stage's forward/backward peak on one GPU and the gradients it holds then: the
    one-GPU step's live set at each of its `ModelFacts.moments`, each part at this GPU's
    share — the saved set as the stage holds it (`activations`, less what one micro-batch's
    backward had freed by then: `one` × the share the capture had freed), the working tensors
    split like the saved set (those shaped like an expert weight by the experts it holds),
    the gradients as this GPU holds them."""
    seq_div = s.tp if s.sp else 1
    saved_split, total_saved = _saved_sums(facts, s.tp, seq_div)
    working_share = saved_split / s.cp / total_saved
    expert_share = 1 / (s.ep * s.expert_tp)
    grad_share = held.grad_bytes / (facts.states.grad_bytes or 1)
    best = (activations, 0.0)       # the last forward's end: every saved set in flight
    for moment in facts.moments:
        freed = one * max(1 - moment.saved_bytes / total_saved, 0.0)
        grads = moment.gradient_bytes * grad_share
        working = (moment.working_bytes * working_share
                   + moment.expert_working_bytes * expert_share)
        best = max(best, (activations - freed + working + grads, grads))
    return best


def _staging(facts: ModelFacts, s: Strategy, device: Links, units: Sequence[Unit]) -> float:
    """What Megatron-core's all-to-all dispatcher stages beside a MoE layer's own tensors:
    its all-to-all's output and that output sorted by local expert (``MoEAlltoAllToken
    Dispatcher``: permute, ``all_to_all``, ``sort_chunks_by_idxs``, the sort only where a GPU
    holds more than one expert), `ALLTOALL_STAGING` copies of the layer's routed rows on this
    GPU; DeepEP and HybridEP receive them in place."""
    routed = max((u.routed_bytes for u in units), default=0)
    if s.ep == 1 or not routed or dispatcher(s, device, units, facts.tokens,
                                                facts.routing) != "alltoall":
        return 0.0
    copies = ALLTOALL_STAGING if facts.experts > s.ep else ALLTOALL_STAGING - 1
    return copies * routed / (s.tp * s.cp)


def _stage_states(facts: ModelFacts, s: Strategy, units: Sequence[Unit], index: int
                  ) -> tuple[StateBytes, StateBytes]:
    """The stage's dense and expert state on one GPU before ZeRO (remembered on the model
    per pipeline split)."""
    experts_on_gpu = s.ep * s.expert_tp

    def work() -> tuple[StateBytes, StateBytes]:
        dense, expert = StateBytes(), StateBytes()
        for u in units:
            dense_u, expert_u = unit_states(u, s.tp, experts_on_gpu)
            dense, expert = dense.plus(dense_u), expert.plus(expert_u)
        return dense, expert
    return remembered(facts.answers,
                      ("stage states", *split_key(s), index, s.tp, experts_on_gpu), work)


def _checkpointed(facts: ModelFacts, s: Strategy, units: Sequence[Unit], index: int
                  ) -> tuple[float, float]:
    """Under full recompute (or ``ckpt=ops``), one micro-batch's kept bytes on the stage (each
    block's input and what the op policy keeps of it, everything the other units save) and
    the largest block's saved set, before cp."""
    seq_div = s.tp if s.sp else 1

    def block_kept(u: Unit) -> float:
        if not s.checkpoint_ops:
            return u.input_bytes / seq_div
        # the policy also keeps what the expert all-to-alls delivered: the routed rows
        # dispatched to this GPU's experts and combined back
        routed = 2 * u.routed_bytes / s.tp if s.ep > 1 else 0.0
        return (u.input_bytes / seq_div + saved_on_gpu(facts.twin(u).op_policy, s.tp, seq_div)
                + routed)

    def work() -> tuple[float, float]:
        kept = sum(block_kept(u) if is_block(u) else saved_on_gpu(u, s.tp, seq_div)
                   for u in units)
        recompute = max((saved_on_gpu(u, s.tp, seq_div) for u in units if is_block(u)),
                        default=0.0)
        return kept, recompute
    return remembered(facts.answers, ("checkpointed", s.checkpoint_ops, s.ep > 1,
                                      *split_key(s), index, s.tp, seq_div), work)


def _selective(facts: ModelFacts, s: Strategy, units: Sequence[Unit], index: int
               ) -> tuple[float, float, float]:
    """One micro-batch's saved bytes on the stage, what ``ckpt=`` patterns free of them in
    all and in the block freeing most, before cp."""
    seq_div = s.tp if s.sp else 1

    def work() -> tuple[float, float, float]:
        freed = [recomputed_bytes(s, facts.twin(u)) for u in units
                 if s.recompute and is_block(u)]
        return (sum(saved_on_gpu(u, s.tp, seq_div) for u in units), sum(freed),
                max(freed, default=0.0))
    return remembered(facts.answers,
                      ("selective", *split_key(s), index, s.recompute, *degrees(s)), work)


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
