"""`serve_section`: how a decoder LM serves requests of `input_len` prompt and `output_len`
generated tokens on one device — time to first token, time per output token, latency,
throughput per batch, and how many requests fit at once.

Schedule (static batching: a batch's requests arrive together and finish together):
- the prefill runs the batch's prompts in one pass and gives every request its first token:
  TTFT = prefill(b) (`kernels.AffineStep` of the captured prefill);
- decode step k (k = 1 … O−1) feeds the k-th generated token against a cache of
  I + k − 1 tokens (plus its own slot): TPOT = the mean of those steps, each timed at its own
  context (`AffineStep.times_s`), as vLLM's benchmarks define it ((latency − TTFT)/(O − 1));
- latency = TTFT + Σ decode steps; output tokens/s = b · O / latency.
Each point also has the in-flight (continuous) batcher's steady state with `b` requests kept in
flight, and the section the in-flight batcher's at maximum load (`inflight.steady_state`:
prefills sharing steps with decodes under the engine's ``max_num_tokens`` and
``max_num_seqs``, as many requests as the KV cache holds).

Capacity (paged KV cache, vLLM's scheme): the engine plans with `utilization` of the device
(vLLM's ``gpu_memory_utilization`` default, 0.9); from it the weights and the workspace of one
prompt's prefill are taken, and the rest holds KV blocks of `block_tokens` tokens. A sequence
of I + O tokens holds ⌈(I + O) / block⌉ blocks (the last one's unused tokens are the rounding
waste) in each full-attention layer, ⌈min(I + O, W) / block⌉ in a sliding layer of window W
(`windows.kv_per_sequence`); `max_batch` = ⌊rest / bytes per sequence⌋ — times the GPUs
when each holds its own requests (attention data parallelism, `ServeMemory.replicas`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.sections import Serve, ServeMaxLoad, ServePoint
from fxlens.analyzer.serve.inflight import Engine, steady_state
from fxlens.analyzer.serve.steps import Steps
from fxlens.analyzer.serve.windows import kv_per_sequence
from fxlens.analyzer.time.roofline import Device

# NB: vLLM's default `gpu_memory_utilization` (EngineArgs): the share of the GPU's memory the
# engine plans weights, activations and KV blocks with; the rest is left to the CUDA context,
# NCCL and fragmentation. TensorRT-LLM's default `free_gpu_memory_fraction` is also 0.9 (of
# the memory free after the weights).
UTILIZATION = 0.9
BLOCK_TOKENS = 16          # vLLM's default KV block size


@dataclass(frozen=True)
class ServeRequest:
    input_len: int
    output_len: int
    batches: tuple[int, ...] = ()          # asked; () → powers of two up to max_batch
    tpot_slo_s: float | None = None
    block_tokens: int = BLOCK_TOKENS
    utilization: float = UTILIZATION
    engine: Engine = Engine()


@dataclass(frozen=True)
class ServeMemory:
    """Per GPU. `device_bytes`: the total the driver gives the process (the engine's share,
    `ServeRequest.utilization`, is of this, as vLLM's ``gpu_memory_utilization`` is);
    `context_bytes`: what the process holds outside PyTorch's allocator, inside that share."""

    device_bytes: int
    weights_bytes: int
    workspace_bytes: int
    kv_bytes_per_token: int
    context_bytes: int = 0
    # (window or None, bytes per token) of each group of layers; () : one group, no window
    kv_groups: tuple[tuple[int | None, int], ...] = ()
    # GPUs each holding its own requests' KV cache (attention data parallelism)
    replicas: int = 1

    def kv_by_window(self) -> tuple[tuple[int | None, int], ...]:
        return self.kv_groups or ((None, self.kv_bytes_per_token),)


def serve_section(steps: Steps, device: Device, layers: int, request: ServeRequest,
                  memory: ServeMemory, notes: Sequence[str] = (), weights_format: str = ""
                  ) -> Serve:
    """`memory` is per GPU (weights and KV per token on one GPU of the tensor-parallel
    group); throughput is the group's."""
    i, o = request.input_len, request.output_len
    groups = memory.kv_by_window()
    per_sequence = kv_per_sequence(i + o, request.block_tokens, groups)
    exact = kv_per_sequence(i + o, 1, groups)              # the same tokens, no blocks
    usable = int(memory.device_bytes * request.utilization)
    room = usable - memory.weights_bytes - memory.workspace_bytes - memory.context_bytes
    max_batch = max(room // per_sequence, 0) * memory.replicas if per_sequence else 0
    batches = _batches(request.batches, max_batch)
    curve = tuple(point(steps, device, request, b, max_batch) for b in batches)
    head = _headline(curve, request)
    mid = i + max(o - 2, 0) / 2
    _, decode_bytes = steps.decode.totals(1, mid)
    prefill_flops, _ = steps.prefill.totals(1, i)
    return Serve(
        device=getattr(device, "name", ""), input_len=i, output_len=o, batch=head.batch,
        ttft_s=head.ttft_s, tpot_s=head.tpot_s, latency_s=head.latency_s,
        output_tokens_per_s=head.output_tokens_per_s, max_batch=int(max_batch),
        device_bytes=memory.device_bytes, usable_bytes=usable,
        weights_bytes=memory.weights_bytes, workspace_bytes=memory.workspace_bytes,
        kv_bytes_per_token=memory.kv_bytes_per_token, kv_bytes_per_sequence=per_sequence,
        context_bytes=memory.context_bytes,
        block_tokens=request.block_tokens,
        block_waste_bytes=per_sequence - exact,
        curve=curve, tpot_slo_s=request.tpot_slo_s, layers=layers,
        decode_bytes_per_step=int(decode_bytes), prefill_flops_per_request=prefill_flops,
        notes=tuple(notes), tp=steps.tp, max_load=max_load(steps, device, request, max_batch),
        weights_format=weights_format, attention_dp=memory.replicas > 1,
        kv_window_tokens=min((w for w, _ in groups if w is not None and w < i + o), default=0))


def max_load(steps: Steps, device: Device, request: ServeRequest, max_batch: int
             ) -> ServeMaxLoad | None:
    """The in-flight batcher with as many requests in flight as the KV cache holds (None when
    not one fits)."""
    if max_batch < 1:
        return None
    state = steady_state(steps, device, request.input_len, request.output_len, max_batch,
                         request.engine)
    caps = (request.engine.max_num_tokens, request.engine.max_num_seqs)
    return ServeMaxLoad(state.requests, state.decodes, state.prompt_tokens, state.step_s,
                        state.output_tokens_per_s, state.bound,
                        *(int(cap) if math.isfinite(cap) else None for cap in caps))


def point(steps: Steps, device: Device, request: ServeRequest, batch: int,
          max_batch: int) -> ServePoint:
    """One batch served together (the module docstring's schedule), and kept in flight."""
    i, o = request.input_len, request.output_len
    ttft = steps.prefill_s(device, batch, i)
    contexts = [i + k - 1 for k in range(1, o)]
    decoding = float(steps.decode_s(device, batch, contexts).sum()) if contexts else 0.0
    tpot = decoding / len(contexts) if contexts else 0.0
    latency = ttft + decoding
    inflight = steady_state(steps, device, i, o, batch, request.engine)
    return ServePoint(batch=batch, ttft_s=ttft, tpot_s=tpot, latency_s=latency,
                      output_tokens_per_s=batch * o / latency if latency > 0 else 0.0,
                      fits=batch <= max_batch,
                      inflight_tokens_per_s=inflight.output_tokens_per_s,
                      inflight_tpot_s=inflight.step_s)


def _batches(asked: Sequence[int], max_batch: int) -> list[int]:
    """The asked batches and `max_batch`, else powers of two up to it and it."""
    powers = {2 ** k for k in range(max(max_batch, 1).bit_length())}
    chosen = set(asked) if asked else powers
    if max_batch >= 1:
        chosen.add(max_batch)
    return sorted(chosen)


def _headline(curve: Sequence[ServePoint], request: ServeRequest) -> ServePoint:
    """Under a TPOT target, the fitting batch with most throughput that meets it; else the
    largest asked batch that fits; else the largest that fits (max_batch); else batch 1's."""
    fitting = [p for p in curve if p.fits]
    if request.tpot_slo_s is not None:
        meeting = [p for p in fitting if p.tpot_s <= request.tpot_slo_s]
        if meeting:
            return max(meeting, key=lambda p: p.output_tokens_per_s)
    asked = [p for p in fitting if p.batch in request.batches]
    if asked:
        return asked[-1]
    return fitting[-1] if fitting else curve[0]
