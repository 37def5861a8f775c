"""One engine step that runs decode tokens and prefill tokens together, as an in-flight
batcher does (TensorRT-LLM's scheduler, vLLM's chunked prefill): the kernels of the decode
step at its batch and context and those of the prefill at its share of prompts, with the
weights each pair of GEMMs shares read once.

A linear layer (or a MoE layer's experts) in such a step is one GEMM over the decode tokens
and the prompt tokens together: FLOPs add, activations add, and the weights are read once —
the routed experts' share for all the step's tokens together (`kernels.Routing`). Every other
kernel (attention over each request's own cache or prompt, norms, elementwise) runs on its
own tokens, so the two steps' kernels are timed apart and summed. The row-parallel
all-reduces under tensor parallelism are one call per output for all the step's tokens: the
payloads add, the latency counts once.

Which kernels share weights is matched once (`shared_rows`): the same op on the same module
in the decode and the prefill graph, among the kernels the caller says read weights.
NB: a chunk of a prompt that follows earlier chunks also reads their K/V; counted as the
whole prompt's causal attention spread over its chunks (the same FLOPs, not that re-read).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fxlens.analyzer.serve.kernels import AffineStep, Kernel, roofline_s
from fxlens.analyzer.serve.steps import Steps
from fxlens.analyzer.time.roofline import Device


def shared_rows(decode: AffineStep, prefill: AffineStep, reads_weights: Callable[[Kernel], bool]
                ) -> tuple[tuple[int, int], ...]:
    """(decode row, prefill row) of each kernel pair reading the same weights."""
    rows = {(k.target, k.module): j for j, k in enumerate(prefill.kernels) if reads_weights(k)}
    return tuple((i, rows[(k.target, k.module)]) for i, k in enumerate(decode.kernels)
                 if reads_weights(k) and (k.target, k.module) in rows)


def mixed_s(steps: Steps, device: Device, decodes: float, context: float, prompts: float,
            prompt: int) -> float:
    """Seconds of one step running `decodes` decode tokens (one per sequence, at mean
    `context`) and the prefill of `prompts` prompts of `prompt` tokens (a fraction: a chunk)."""
    dec, pre = steps.decode, steps.prefill
    dec_flops, dec_bytes = (t[:, 0] for t in dec.works(decodes, [context]))
    pre_flops, pre_bytes = (t[:, 0] for t in pre.works(prompts, [prompt]))
    # a step without decode (or prompt) tokens runs none of that step's kernels
    alone_dec = roofline_s(device, dec.kernels, dec_flops, dec_bytes) * dec.weights * (
        decodes > 0)
    alone_pre = roofline_s(device, pre.kernels, pre_flops, pre_bytes) * pre.weights * (
        prompts > 0)
    total = float(alone_dec.sum() + alone_pre.sum())
    if steps.shared and decodes > 0 and prompts > 0:
        i, j = (list(rows) for rows in zip(*steps.shared, strict=True))
        tokens = dec.tokens(decodes, context) + pre.tokens(prompts, prompt)
        flops = dec_flops[i] + pre_flops[j]
        moved = (dec_bytes[i] - dec.weights_read(dec.tokens(decodes, context))[i]
                 + pre_bytes[j] - pre.weights_read(pre.tokens(prompts, prompt))[j]
                 + dec.weights_read(tokens)[i])                   # the weights read once
        merged = roofline_s(device, [dec.kernels[r] for r in i], flops, moved) * dec.weights[i]
        total += float(merged.sum() - alone_dec[i].sum() - alone_pre[j].sum())
    return total + _reduces_s(steps, decodes, context, prompts, prompt)


def _reduces_s(steps: Steps, decodes: float, context: float, prompts: float,
               prompt: int) -> float:
    """The step's all-reduces: one call per row-parallel output for all its tokens."""
    dec, pre = steps.decode_reduce, steps.prefill_reduce
    if steps.tp <= 1 or dec is None or pre is None or decodes + prompts <= 0:
        return 0.0
    payload_dec = dec.works(decodes, [context])[1][:, 0] * (decodes > 0)
    payload_pre = pre.works(prompts, [prompt])[1][:, 0] * (prompts > 0)
    by_module = dict(zip((k.module for k in pre.kernels), payload_pre.tolist(), strict=True))
    payloads = payload_dec + torch.tensor([by_module.get(k.module, 0.0) for k in dec.kernels],
                                          dtype=torch.float64)
    return float((steps.calls_s(payloads) * dec.weights).sum())
