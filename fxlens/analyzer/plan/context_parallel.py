"""Context parallelism's transfers: the sequence split over cp GPUs, each attention layer
exchanging what its GPUs need of the others' tokens, as Megatron-core's ``cp_comm_type``
(Transformer Engine's context-parallel attention) names the three ways (``cp_comm=``):

- ``p2p`` (the default; ring attention): per layer, each GPU passes its K/V chunk (1/cp of
  the sequence, its tp share of the heads, un-repeated under grouped-query attention) round
  the ring cp − 1 times in the forward; the backward passes the K/V and their gradients,
  twice the bytes. Each send overlaps the attention of the chunk pair before it; only what the
  attention does not cover is exposed.
- ``a2a`` (DeepSpeed-Ulysses): an all-to-all turns the sequence-split Q, K and V into
  head-split ones over the whole sequence before the attention, and one turns the output back
  after it; the backward moves their gradients the same way. Each moves (cp − 1)/cp of this
  GPU's share and waits for the attention, so all of it is exposed. A layer's heads (its tp
  share) must divide among the cp GPUs.
- ``allgather``: K and V all-gathered over the cp GPUs before the attention, their
  gradients reduce-scattered after its backward; exposed.

A recomputed forward (``ckpt``) exchanges again; the payloads hold this GPU's tp share. The
attention's work is 1/cp per GPU either way (causal load balancing under ``p2p``, whole
sequences on 1/cp of the heads under ``a2a``).
"""

from __future__ import annotations

from collections.abc import Sequence

from fxlens.analyzer.core.sections import Collective
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import Unit
from fxlens.analyzer.plan.transfers import Group, Links, collective, latency_s


def context_parallel(s: Strategy, device: Links, units: Sequence[Unit]
                     ) -> tuple[list[Collective], float]:
    """The stage's context-parallel transfers (all micro-batches) and the seconds of them the
    attention does not hide."""
    layers = [u for u in units if u.attention.kv_bytes]
    if s.cp == 1 or not layers:
        return [], 0.0
    if s.cp_comm == "a2a":
        return _exposed(_head_exchanges(s, device, layers))
    if s.cp_comm == "allgather":
        return _exposed(_kv_gathers(s, device, layers))
    return _ring(s, device, layers)


def _ring(s: Strategy, device: Links, layers: Sequence[Unit]
          ) -> tuple[list[Collective], float]:
    group = Group(s.cp, s.tp)
    bandwidth = device.link_bytes_per_s(group.within_node(device.gpus_per_node))
    send_s = latency_s("p2p", group, device)         # each send's fixed latency
    steps = s.cp - 1
    forward_passes = 2 if s.checkpoint else 1
    exposed = 0.0
    chunk_total = 0.0
    for u in layers:
        chunk = u.attention.kv_bytes / (s.tp * s.cp)
        chunk_total += chunk
        per_step_fwd = u.attention.forward_s / (s.tp * s.cp) / s.cp
        per_step_bwd = u.attention.backward_s / (s.tp * s.cp) / s.cp
        exposed += steps * (forward_passes * max(0.0, send_s + chunk / bandwidth - per_step_fwd)
                            + max(0.0, 2 * (send_s + chunk / bandwidth) - per_step_bwd))
    chunk = chunk_total / len(layers)
    calls = steps * len(layers) * (forward_passes + 2) * s.micro_batches
    ring = collective("p2p", "ring attention K/V (cp)", group, chunk, calls, device, True)
    return [ring], exposed * s.micro_batches


def _head_exchanges(s: Strategy, device: Links, layers: Sequence[Unit]) -> list[Collective]:
    """Two all-to-alls per layer and pass (Q, K and V in; the output back), forward, backward
    and a recomputed forward; each call's payload this GPU's share of them."""
    passes = (2 if s.checkpoint else 1) + 1
    moved = sum(u.attention.q_bytes + u.attention.kv_bytes + u.attention.out_bytes
                for u in layers) / (s.tp * s.cp)
    calls = 2 * len(layers) * passes * s.micro_batches
    return [collective("all-to-all", "Q, K, V and output heads (cp=a2a)", Group(s.cp, s.tp),
                       moved / (2 * len(layers)), calls, device, False)]


def _kv_gathers(s: Strategy, device: Links, layers: Sequence[Unit]) -> list[Collective]:
    """Per layer, the whole sequence's K/V of this GPU's heads gathered in each forward, their
    gradients reduce-scattered in the backward."""
    group, m = Group(s.cp, s.tp), s.micro_batches
    kv = sum(u.attention.kv_bytes for u in layers) / s.tp / len(layers)
    forward_passes = 2 if s.checkpoint else 1
    return [collective("all-gather", "K/V (cp=allgather)", group, kv,
                       len(layers) * forward_passes * m, device, False),
            collective("reduce-scatter", "K/V gradients (cp=allgather)", group, kv,
                       len(layers) * m, device, False)]


def _exposed(collectives: list[Collective]) -> tuple[list[Collective], float]:
    return collectives, sum(c.time_s for c in collectives)
