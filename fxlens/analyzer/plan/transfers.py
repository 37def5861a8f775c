"""The transfers of one layout, per GPU and per step (`Collective` rows), ring formulas as
nccl-tests states them: all-reduce of S bytes over n GPUs moves ``2(n−1)/n · S``,
reduce-scatter, all-gather and all-to-all ``(n−1)/n · S``, a point-to-point send S, each after
the call's fixed latency (`collective_s`: the device's base latency plus a hop per ring step,
2(n−1) for an all-reduce, n−1 for the others, one for a send; `fxlens.rules.links`) and at the
link bandwidth of the group: NVLink inside one node; across nodes, a ring collective whose group
has k GPUs in each node runs k rings over k NICs (one per GPU), so its bandwidth is k × a GPU's
NIC, at most NVLink's; an all-to-all sends the rows for other nodes through each GPU's own NIC
and the rest over NVLink.

Rank order (Megatron-core's): tp innermost, then cp, then dp, pp outermost; for the expert
layers the same GPUs of a stage as etp innermost, then ep, then expert dp.

- Tensor parallel: one all-reduce of each pair's output in the forward and one of its input
  gradient in the backward (with sequence parallel a reduce-scatter and an all-gather, the
  same bytes), again in a recompute; payloads hold this GPU's tokens (÷ cp). Exposed, unless
  ``tp-overlap`` (`tensor_parallel_exposed_s`).
- Context parallel: `fxlens.analyzer.plan.context_parallel` (ring sends, head all-to-alls or
  K/V all-gathers, as ``cp_comm=`` says).
- Expert parallel: an all-to-all to the experts and one back, forward and backward (and in a
  recompute), of the token rows this GPU routes: each token once per chosen expert
  (``dispatch=alltoall``), or, as DeepEP sends them (``dispatch=deepep``, the default across
  nodes), once per node holding any of its experts over the GPU's NIC and once per GPU holding
  one over NVLink; a token's k experts of E over n holders fall on
  ``n·(1 − C(E − E/n, k)/C(E, k))`` distinct holders with balanced routing
  (`fxlens.analyzer.plan.routing`, which also counts group-limited routing and a benchmark's
  block gate): 2.7 remote nodes of 3 instead of 6 expert copies for Qwen3-235B (k = 8 of
  128) at ep = 32 over four nodes.
  DeepEP's kernels run on `DEEPEP_SMS` = 20 multiprocessors (Megatron-core's
  ``moe_deepep_num_sms`` default; the DeepSeek-V3 report's 20 of 132 SMs for its all-to-alls).
  HybridEP (``dispatch=hybridep``, Megatron-core's other ``flex`` backend, which NVIDIA's
  Blackwell recipes use) sends the same rows the same way — once per NVLink domain holding an
  expert, then over NVLink — on `HYBRIDEP_SMS` = 16 (``moe_hybridep_num_sms``'s default: "in
  pure NVL scenarios, 16 SMs can generally achieve good bandwidth").
- Data parallel over the GPUs holding the same weights (dp · cp for the dense part, the expert
  data-parallel group for experts): DDP all-reduces the gradients once per step; ZeRO-1/2
  reduce-scatter them and all-gather the updated weights; ZeRO-3 gathers the weights in the
  forward and again in the backward and reduce-scatters the gradients for every micro-batch;
  hybrid sharding does that inside a node and all-reduces the shards across nodes. Compressed
  (``gradq``, ``powersgd``, ``zeropp``): the payloads `fxlens.analyzer.plan.compression`
  gives.
- Pipeline: each micro-batch's boundary activation forward and its gradient backward.

A transfer hidden behind compute still holds SMs: NCCL runs a collective on the device's
`collective_sms` (16 on a DGX: one CTA per channel, never shared with compute kernels,
NVIDIA/nccl#689), DeepEP and HybridEP on their `ROUTING_SMS`, so the compute beside it
runs on the rest (`sm_slowdown_s`); its memory traffic competing with the compute's is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fxlens.analyzer.core.sections import Collective
from fxlens.analyzer.memory.training_state import StateBytes
from fxlens.analyzer.plan.compression import Matrix, powersgd_bytes, quantized_bytes
from fxlens.analyzer.plan.routing import ExpertRouting, distinct_holders
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import Unit

DEEPEP_CAUSE = "expert routing (DeepEP)"
DEEPEP_SMS = 20
HYBRIDEP_CAUSE = "expert routing (HybridEP)"
HYBRIDEP_SMS = 16
# the SMs a routing library's kernels hold, by the cause its transfers carry
ROUTING_SMS = {DEEPEP_CAUSE: DEEPEP_SMS, HYBRIDEP_CAUSE: HYBRIDEP_SMS}


class Links(Protocol):
    """What a layout reads of a device (`fxlens.rules.hardware.DeviceSpec` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def usable_bytes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def multiprocessors(self) -> int: ...
    @property
    def collective_sms(self) -> int: ...
    @property
    def framework_launch_s(self) -> float: ...

    def link_bytes_per_s(self, within_node: bool) -> float: ...

    def collective_latency_s(self, steps_inside: int, steps_across: int = 0) -> float: ...


@dataclass(frozen=True)
class Group:
    """A communication group: `size` GPUs spaced `stride` apart in the rank order."""

    size: int
    stride: int

    def within_node(self, gpus_per_node: int) -> bool:
        return self.size * self.stride <= gpus_per_node

    def per_node(self, gpus_per_node: int) -> int:
        """The group's GPUs in each node it spans: a group laid out evenly over nodes holds
        the same number of its GPUs in each, the largest divisor of its size that a node's
        `gpus_per_node // stride` slots hold (64 of a 128-GPU group in each 72-GPU NVLink
        domain of GB200 NVL72 racks, as such jobs leave the rest of a rack idle)."""
        room = max(1, gpus_per_node // max(self.stride, 1))
        if self.size <= room:
            return self.size
        return max(d for d in range(1, room + 1) if self.size % d == 0)

    def node_share(self, gpus_per_node: int) -> Group:
        """The part of the group inside one node."""
        return Group(self.per_node(gpus_per_node), self.stride)


def ring_steps(kind: str, n: int) -> int:
    """Steps of one call over n GPUs: 2(n − 1) for an all-reduce, n − 1 for a reduce-scatter,
    all-gather or all-to-all, one for a point-to-point send; 0 for a group of one."""
    if n <= 1:
        return 0
    return 2 * (n - 1) if kind == "all-reduce" else 1 if kind == "p2p" else n - 1


def collective_s(kind: str, payload: float, n: int, bandwidth: float,
                 latency_s: float = 0.0) -> float:
    """One call of `kind` moving `payload` bytes over n GPUs: its fixed latency, then its ring
    bytes (``2(n−1)/n`` of the payload for an all-reduce, ``(n−1)/n`` for the others, all of
    it for a send) at `bandwidth`. The one way every collective here is timed."""
    if n <= 1:
        return 0.0
    share = 2 * (n - 1) / n if kind == "all-reduce" else 1.0 if kind == "p2p" else (n - 1) / n
    return latency_s + share * payload / bandwidth


def all_reduce_s(payload: float, n: int, bandwidth: float, latency_s: float = 0.0) -> float:
    return collective_s("all-reduce", payload, n, bandwidth, latency_s)


def one_way_s(payload: float, n: int, bandwidth: float, latency_s: float = 0.0) -> float:
    """Reduce-scatter, all-gather or all-to-all of `payload` bytes over n GPUs."""
    return collective_s("all-to-all", payload, n, bandwidth, latency_s)


def latency_s(kind: str, group: Group, device: Links) -> float:
    """The fixed seconds of one call over `group`: NCCL's model counts the ring's steps
    between nodes at the network's hop (2 per node for an all-reduce, one per node boundary
    for the others) and the rest at the node's links' hop."""
    steps = ring_steps(kind, group.size)
    if group.within_node(device.gpus_per_node):
        return device.collective_latency_s(steps)
    nodes = group.size // _members(group, device)
    across = min(steps, 2 * nodes if kind == "all-reduce" else 1 if kind == "p2p" else nodes - 1)
    return device.collective_latency_s(steps - across, across)


def _members(group: Group, device: Links) -> int:
    """GPUs of the group sharing a node."""
    return group.per_node(device.gpus_per_node)


def collective(kind: str, cause: str, group: Group, payload: float, calls: int,
               device: Links, overlapped: bool) -> Collective:
    inside = group.within_node(device.gpus_per_node)
    nvlink = device.link_bytes_per_s(True)
    nic = device.link_bytes_per_s(False)
    # GPUs of the group sharing a node: a ring across nodes crosses each node boundary once
    # per ring, and NCCL runs one ring per NIC, so a node's k members move the bytes over k
    # NICs (nccl-tests' bus bandwidth across DGX nodes nears NVLink's with k = 8).
    members = _members(group, device)
    latency = latency_s(kind, group, device)
    if kind == "p2p":
        each = collective_s(kind, payload, 2, nvlink if inside else nic, latency)
    elif kind == "all-to-all" and not inside:
        # each GPU sends its rows for other nodes through its own NIC, the rest over NVLink
        each = latency + max(payload * (group.size - members) / group.size / nic,
                             payload * (members - 1) / group.size / nvlink)
    else:
        each = collective_s(kind, payload, group.size,
                            nvlink if inside else min(nvlink, members * nic), latency)
    return Collective(kind=kind, cause=cause, group=group.size, across_nodes=not inside,
                      bytes=round(payload), calls=calls, time_s=each * calls,
                      overlapped=overlapped)


def tensor_parallel(s: Strategy, device: Links, units: Sequence[Unit]) -> list[Collective]:
    """The row GEMMs' all-reduces over tp (reduce-scatter + all-gather under sp), and a MoE
    layer's experts' over etp where they are split by it (`Strategy.expert_tp` > 1; with
    whole experts, etp = 1, the tokens reach them by the all-to-all instead)."""
    dense = (sum(u.tp_reduces for u in units), sum(u.tp_reduce_bytes for u in units))
    experts = (sum(u.etp_reduces for u in units), sum(u.etp_reduce_bytes for u in units))
    found = _activation_reduces(s, device, "tp activations", s.tp, *dense)
    return found + _activation_reduces(s, device, "etp expert outputs", s.expert_tp, *experts)


def _activation_reduces(s: Strategy, device: Links, cause: str, ways: int, reduces: int,
                        summed: int) -> list[Collective]:
    if ways == 1 or not reduces or s.tp == 1:
        return []
    payload = summed / reduces / s.cp
    passes = 3 if s.checkpoint else 2          # forward, backward, and the recompute
    calls = reduces * passes * s.micro_batches
    group = Group(ways, 1)
    if s.sp:
        return [collective(kind, f"{cause} (sp)", group, payload, calls, device, s.tp_overlap)
                for kind in ("reduce-scatter", "all-gather")]
    return [collective("all-reduce", cause, group, payload, calls, device, s.tp_overlap)]


def expert_parallel(s: Strategy, device: Links, units: Sequence[Unit], tokens: int,
                    routing: ExpertRouting) -> list[Collective]:
    """The dispatch and combine all-to-alls of one stage, every micro-batch (`tokens`: the
    captured micro-batch's; `routing`: a MoE layer's experts and router groups)."""
    routed = sum(u.routed_bytes for u in units)
    if s.ep == 1 or not routed:
        return []
    passes = expert_passes(s)
    group = Group(s.ep, s.expert_tp)
    payload = routed / (s.tp * s.cp)           # this GPU's tokens, once per chosen expert
    chosen = experts_per_token(units, tokens)
    inside = group.within_node(device.gpus_per_node)
    dispatch = dispatcher(s, device, units, tokens, routing)
    if dispatch == "alltoall":
        return [collective("all-to-all", "expert routing", group, payload,
                           passes * s.micro_batches, device, s.a2a_overlap)]
    # DeepEP, HybridEP: each token once to every node holding one of its experts (over this
    # GPU's NIC), then once to every GPU holding one (NVLink; the forwarding inside included)
    members = _members(group, device)
    nodes = group.size // members
    token_bytes = payload / chosen
    pattern = s.routing or "balanced"
    per_gpu = token_bytes * distinct_holders(routing, chosen, group.size, pattern)
    across = token_bytes * distinct_holders(routing, chosen, nodes, pattern) * (nodes - 1) / nodes
    each = latency_s("all-to-all", group, device) + max(
        across / device.link_bytes_per_s(False) if nodes > 1 else 0.0,
        per_gpu * (group.size - 1) / group.size / device.link_bytes_per_s(True))
    cause = HYBRIDEP_CAUSE if dispatch == "hybridep" else DEEPEP_CAUSE
    return [Collective(kind="all-to-all", cause=cause, group=group.size,
                       across_nodes=not inside, bytes=round(per_gpu),
                       calls=passes * s.micro_batches, time_s=each * passes * s.micro_batches,
                       overlapped=s.a2a_overlap)]


def expert_passes(s: Strategy) -> int:
    """A MoE layer's all-to-alls per micro-batch: to the experts and back, forward and
    backward, and again in a recomputed forward (not under ``ckpt=ops``, whose policy saves
    the all-to-alls' outputs)."""
    return 6 if s.checkpoint else 4


def dispatcher(s: Strategy, device: Links, units: Sequence[Unit], tokens: int,
               routing: ExpertRouting) -> str:
    """The dispatcher a stage's expert all-to-alls run: the layout's ``dispatch=``, else
    ``alltoall`` inside a node and ``deepep`` across nodes; ``alltoall`` wherever a token's
    copies cannot be told apart (its experts per token unknown, fewer experts than ranks)."""
    inside = Group(s.ep, s.expert_tp).within_node(device.gpus_per_node)
    if experts_per_token(units, tokens) < 1 or routing.experts < s.ep:
        return "alltoall"
    return s.dispatch or ("alltoall" if inside else "deepep")


def experts_per_token(units: Sequence[Unit], tokens: int) -> float:
    """Experts a token is sent to: the MoE layers' routed rows over the rows their routers
    score, or over the captured micro-batch's `tokens` where no router was found (0: not
    known)."""
    moe = [u for u in units if u.routed_rows]
    if moe and all(u.router_rows for u in moe):
        return sum(u.routed_rows for u in moe) / sum(u.router_rows for u in moe)
    return sum(u.routed_rows for u in moe) / (len(moe) * tokens) if moe and tokens else 0.0


def sm_slowdown_s(collectives: Sequence[Collective], exposed_s: float, device: Links,
                  total_s: float | None = None) -> float:
    """Seconds the compute beside hidden transfers loses: a transfer's kernels hold their SMs
    while they run (a routing library's `ROUTING_SMS`, an NCCL collective the device's
    `collective_sms`), so compute overlapping t seconds of them finishes ``t · SMs held / SMs``
    later (0 where a count is unknown). `exposed_s` of the transfers' `total_s` (their own
    seconds unless given) are not hidden."""
    total = sum(c.time_s for c in collectives) if total_s is None else total_s
    hidden_share = 1 - exposed_s / total if total > 0 else 0.0
    if device.multiprocessors <= 0 or hidden_share <= 0:
        return 0.0
    held = sum(c.time_s * ROUTING_SMS.get(c.cause, device.collective_sms) for c in collectives)
    return held * hidden_share / device.multiprocessors


def data_parallel(s: Strategy, device: Links, dense: StateBytes, expert: StateBytes,
                  shard: Group, expert_shard: Group, element_bytes: float = 2.0,
                  matrices: Sequence[Matrix] = ()) -> list[Collective]:
    """The gradient and ZeRO collectives of one stage (`dense`, `expert`: its state on this
    GPU before ZeRO; `matrices`: its gradient matrices on this GPU, for PowerSGD), compressed
    as the strategy asks (`fxlens.analyzer.plan.compression`)."""
    out: list[Collective] = []
    for label, state, group, inner, kinds in (
            ("", dense, Group(s.dp * s.cp, s.tp), shard, ("split", "whole")),
            ("expert ", expert, Group(s.expert_dp, s.ep * s.expert_tp), expert_shard,
             ("expert",))):
        if group.size <= 1 or not state.grad_bytes:
            continue
        grads: float = state.grad_bytes
        weights: float = state.weights_bytes
        tag = _compression_tag(s)
        if s.zero == 0:
            if s.powersgd:
                mine = [m for m in matrices if m.kind in kinds]
                grads = powersgd_bytes(mine, grads, element_bytes, s.powersgd)
            elif s.gradq:
                grads = quantized_bytes(grads, element_bytes, 8)
            out.append(collective("all-reduce", f"{label}gradients (DDP{tag})", group, grads,
                                  1, device, True))
        elif s.zero in (1, 2):
            if s.gradq:
                grads = quantized_bytes(grads, element_bytes, 8)
            out.append(collective("reduce-scatter", f"{label}gradients (ZeRO-{s.zero}{tag})",
                                  group, grads, 1, device, True))
            # the updated weights are the trainable ones in their working dtype: the
            # gradients' size (an fp8 run's cached fp8 copies are cast again, not gathered)
            out.append(collective("all-gather", f"{label}updated weights (ZeRO-{s.zero})",
                                  group, state.grad_bytes, 1, device, True))
        else:
            out += _zero3(s, device, label, group, inner, grads, weights, element_bytes)
    return out


def _compression_tag(s: Strategy) -> str:
    if s.powersgd:
        return f", PowerSGD rank {s.powersgd}"
    return f", {s.gradq}" if s.gradq else ""


def _zero3(s: Strategy, device: Links, label: str, group: Group, inner: Group, grads: float,
           weights: float, element_bytes: float) -> list[Collective]:
    """ZeRO-3: the weights gathered in the forward and again in the backward, the gradients
    reduce-scattered, every micro-batch (ZeRO++: int8 forward gathers, backward gathers
    inside the node, int4 gradients); under a pipeline once per step, as PyTorch's pipeline
    schedules drive FSDP2 (`zero3_pipelined`); hybrid: the shards all-reduced across nodes."""
    m = s.micro_batches
    if s.zeropp:
        node = inner.node_share(device.gpus_per_node)
        out = [collective("all-gather", f"{label}weights, forward (ZeRO++ int8)", inner,
                          quantized_bytes(weights, element_bytes, 8), m, device, True),
               collective("all-gather", f"{label}weights, backward (ZeRO++ node copy)", node,
                          weights, m, device, True),
               collective("reduce-scatter", f"{label}gradients (ZeRO++ int4)", inner,
                          quantized_bytes(grads, element_bytes, 4), m, device, True)]
    else:
        grads = quantized_bytes(grads, element_bytes, 8) if s.gradq else grads
        gathers, reduces = (1, 1) if zero3_pipelined(s) else (2 * m, m)
        if zero3_pipelined(s) and not s.gradq:     # accumulated, then reduced, in float32
            grads = grads * PIPELINED_GRAD_BYTES / element_bytes
        out = [collective("all-gather", f"{label}weights (ZeRO-3)", inner, weights, gathers,
                          device, True),
               collective("reduce-scatter", f"{label}gradients (ZeRO-3{_compression_tag(s)})",
                          inner, grads, reduces, device, True)]
    replicas = group.size // inner.size
    if replicas > 1:
        out.append(collective("all-reduce", f"{label}gradient shards (hybrid)",
                              Group(replicas, inner.stride * inner.size), grads / inner.size,
                              1, device, True))
    return out


def tensor_parallel_exposed_s(s: Strategy, transfer_s: float, gemm_s: float) -> float:
    """Of the tensor-parallel collectives' `transfer_s`, what the GEMMs on split features
    (`gemm_s`, the same micro-batches) do not hide. With ``tp-overlap`` a GEMM runs in tp
    chunks, each chunk's transfer beside the next chunk's product (Megatron-core's
    userbuffers, PyTorch's async TP): one chunk's transfer waits, the rest hides up to the
    GEMMs' length. Without it all of it is exposed."""
    if not s.tp_overlap:
        return transfer_s
    return max(0.0, transfer_s - gemm_s) + transfer_s / s.tp


PIPELINED_GRAD_BYTES = 4   # float32: the reduce dtype FSDP2 accumulates unsharded gradients in


def zero3_pipelined(s: Strategy) -> bool:
    """Whether ZeRO-3 runs under a pipeline as PyTorch's pipeline schedules drive FSDP2
    (torchtitan, NeMo Automodel): each stage's weights stay gathered from its first forward to
    its last backward (``reshard_after_forward=False``) and its gradients accumulate unsharded
    until the last micro-batch's backward, which reduce-scatters them once (no gradient sync or
    resharding before: ``torch.distributed.pipelining``'s ``backward_maybe_with_nosync``). An
    unsharded gradient kept for accumulation is upcast to the reduce dtype
    (``FSDPParam.to_accumulated_grad_if_needed``), float32 in both recipes
    (`PIPELINED_GRAD_BYTES`)."""
    return s.zero == 3 and s.pp > 1 and not s.zeropp


def pipeline_transfer(s: Strategy, device: Links, boundary_bytes: float) -> Collective | None:
    if s.pp == 1:
        return None
    group = Group(2, s.tp * s.cp * s.dp)
    # Each micro-batch: the activation forward, its gradient backward.
    return collective("p2p", "stage boundary", group, boundary_bytes, 2 * s.micro_batches,
                      device, False)
