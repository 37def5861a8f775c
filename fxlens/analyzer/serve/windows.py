"""Sliding-window attention in the serving steps: a layer with a window of W tokens keeps and
reads at most W cached tokens (TensorRT-LLM's cyclic ``max_attention_window``, vLLM's
sliding-window KV manager), and a prompt's token attends to at most the W before it.

The steps are captured with every layer attending to its whole context (the engine attention
of `fxlens.analyzer.capture.hf_decode` has no mask) and two decoder layers, the second
standing for every layer past the first (`fxlens.serve_pass`). Here each kernel of a layer
takes that layer's window:

- a decode step (`windowed_decode`): every kernel whose work grows with the context (the
  attention over the cache, its K/V write) sees ``min(L, W)`` of it
  (`fxlens.analyzer.serve.kernels.AffineStep.windows`); the second layer's such kernels are
  split into one row per distinct window among the layers they stand for, weighted by how
  many of them have it (Gemma-3: five sliding layers to one global);
- a prefill (`windowed_prefill`): fused attention's FLOPs over a prompt of I tokens scale by
  the query–key pairs a window leaves, ``W(W+1)/2 + (I − W)·W`` of causal attention's
  ``I(I+1)/2`` (its bytes, the Q, K, V and output tensors, do not change);
- a sequence's cache (`kv_per_sequence`): a sliding layer holds ``min(I + O, W)`` tokens in
  blocks, a global one all ``I + O``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from fxlens.analyzer.serve.kernels import AffineStep, Kernel

LayerOf = Callable[[str], "int | None"]     # a kernel's module → captured layer (0, 1) or None


def windowed_decode(step: AffineStep, layer_of: LayerOf, windows: Sequence[int | None]
                    ) -> AffineStep:
    """`step` with each context-dependent kernel capped at its layers' window."""
    grows = ((step.flops[:, 2:] != 0) | (step.bytes[:, 2:] != 0)).any(1).tolist()
    rows, weights, caps = _split(step, layer_of, windows, lambda r: bool(grows[r]))
    return replace(step, kernels=tuple(step.kernels[r] for r in rows), flops=step.flops[rows],
                   bytes=step.bytes[rows], weights=torch.tensor(weights, dtype=torch.float64),
                   windows=torch.tensor(caps, dtype=torch.float64))


def windowed_prefill(step: AffineStep, layer_of: LayerOf, windows: Sequence[int | None],
                     prompt: int, attention: Callable[[Kernel], bool]) -> AffineStep:
    """`step` (a prefill of `prompt` tokens) with each sliding layer's `attention` kernel's
    FLOPs scaled to the pairs its window leaves."""
    rows, weights, caps = _split(step, layer_of, windows,
                                 lambda r: attention(step.kernels[r]))
    scale = torch.tensor([window_share(prompt, cap) for cap in caps], dtype=torch.float64)
    return replace(step, kernels=tuple(step.kernels[r] for r in rows),
                   flops=step.flops[rows] * scale[:, None], bytes=step.bytes[rows],
                   weights=torch.tensor(weights, dtype=torch.float64))


def window_share(prompt: int, window: float) -> float:
    """The share of causal attention's query–key pairs over `prompt` tokens a window of
    `window` tokens keeps (1 when the window covers the prompt)."""
    if window >= prompt:
        return 1.0
    kept = window * (window + 1) / 2 + (prompt - window) * window
    return kept / (prompt * (prompt + 1) / 2)


def kv_per_sequence(tokens: int, block: int, per_token: Sequence[tuple[int | None, int]]
                    ) -> int:
    """Bytes of one sequence's cache at `tokens` tokens, in blocks of `block` tokens:
    `per_token` is (window or None, bytes per token) of each group of layers."""
    return sum(math.ceil(min(tokens, window or tokens) / block) * block * size
               for window, size in per_token)


def _split(step: AffineStep, layer_of: LayerOf, windows: Sequence[int | None],
           applies: Callable[[int], bool]) -> tuple[list[int], list[float], list[float]]:
    """(row, weight, window) of each kernel row: a row `applies` to that belongs to the
    second captured layer is one row per distinct window of the layers it stands for."""
    rows: list[int] = []
    weights: list[float] = []
    caps: list[float] = []
    later = Counter(windows[1:])
    for r, kernel in enumerate(step.kernels):
        layer = layer_of(kernel.module) if applies(r) else None
        groups: dict[int | None, float]
        if layer is None or not windows:
            groups = {None: float(step.weights[r])}
        elif layer == 0:
            groups = {windows[0]: float(step.weights[r])}
        else:
            groups = {w: float(n) for w, n in later.items()}
        for window, weight in groups.items():
            rows.append(r)
            weights.append(weight)
            caps.append(math.inf if window is None else float(window))
    return rows, weights, caps
