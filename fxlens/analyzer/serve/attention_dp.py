"""Attention data parallelism with expert parallelism over the same GPUs — how MoE models are
served at scale (TensorRT-LLM's ``enable_attention_dp`` with ``--ep``, SGLang's
``--enable-dp-attention``, vLLM's data-parallel attention with ``--enable-expert-parallel``).

Over r GPUs of a node:
- every kernel but the routed experts' (embeddings, attention and its projections, norms,
  dense and shared-expert MLPs, the LM head) runs on each GPU over its own requests, with
  the weights whole on every GPU: its batch terms at one rank's share of the batch
  (`kernels.DataParallel`), its weights read in full;
- the routed experts are split r ways (each GPU holds E/r of them) and see every rank's
  tokens: a GPU's share of their FLOPs and of the expert weights the step's tokens touch is
  1/r of the whole batch's;
- each MoE layer gathers every rank's tokens to the experts and scatters their outputs back
  (TensorRT-LLM's all-gather and reduce-scatter around the MoE): a ring all-gather plus a
  ring reduce-scatter of the batch's hidden states move what a ring all-reduce of them moves,
  ``2(r−1)/r`` of ``tokens × hidden × bytes``, timed as one (`exchange_step`);
- each GPU holds its own requests' KV cache (an MLA latent is not copied r ways as under
  tensor parallelism), so r GPUs hold r times one GPU's requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from fxlens.analyzer.serve.kernels import AffineStep, DataParallel, Kernel
from fxlens.analyzer.serve.steps import sharded


def attention_data_parallel(step: AffineStep, experts: Sequence[bool], ranks: int
                            ) -> AffineStep:
    """`step` on one of `ranks` GPUs: the `experts` kernels' work ÷ ranks over the whole batch,
    every other kernel on one rank's share of it."""
    ways = [ranks if expert else 1 for expert in experts]
    split = sharded(step, ways, ways)
    rows = tuple(row for row, expert in enumerate(experts) if not expert)
    return replace(split, data_parallel=DataParallel(ranks, rows))


def exchange_step(module: str, token_bytes: float, moe_layers: float, prefill: bool
                  ) -> AffineStep:
    """The per-MoE-layer exchange of a step's hidden states, `token_bytes` a token, as one
    all-reduce-sized call per layer (`moe_layers` calls): a decode step's tokens are its batch,
    a prefill's the batch × its prompt (the context axis)."""
    coefficients = [0.0, 0.0, 0.0, token_bytes] if prefill else [0.0, token_bytes, 0.0, 0.0]
    return AffineStep(
        (Kernel("all-gather + reduce-scatter", module, "", "", 0.0, 0.0, moe_layers),),
        torch.zeros(1, 4, dtype=torch.float64),
        torch.tensor([coefficients], dtype=torch.float64),
        torch.tensor([moe_layers], dtype=torch.float64))
