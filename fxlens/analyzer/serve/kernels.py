"""A serving step as fused kernels whose work is affine in the batch and the context, timed on a
device by the roofline at any (batch, context) without another capture.

Per kernel of a prefill or decode graph, FLOPs and bytes are sums of terms constant, linear in
the batch `b` (activations, the K/V slot each sequence writes), linear in the context `L` (a
mask over the cache) and in `b·L` (attention over the cache, the cache read): bilinear in
(b, L). Four captures at (b₁, L₁), (b₂, L₁), (b₁, L₂), (b₂, L₂) give every coefficient
exactly (`fit`); a prefill, at one prompt length, is linear in `b` and takes two. The graphs
of the captures must be the same kernel for kernel (the same ops on other shapes), which
`fit` checks.

Time of one step, as the roofline's (`fxlens.analyzer.time.roofline`): per kernel
``max(FLOPs / achievable FLOP/s at its dtype and kernel class, bytes / achievable bandwidth)``,
summed; each kernel `weight` times (a decoder layer's kernels count once per layer, captured
once: `fxlens.analyzer.capture.hf_decode.with_layers`). No host time: engines replay a decode
step as one CUDA graph, and a prefill's kernels are long enough to hide their launches; but
each kernel starts only once the one before it has drained, a fixed gap per kernel that is
the device's (`DeviceSpec.graph_launch_s`: 1.3 µs measured on an H100; a 70B decode step on
two GPUs runs some 900 kernels).

Routed experts (`Routing`): a MoE layer's grouped GEMM reads, as captured, every expert's
weights (its c₀ bytes). A step reads only the experts some of its tokens route to: with T
tokens each picking k of E experts uniformly, an expert is missed by a token with probability
1 − k/E, so the expected share read is ``1 − (1 − k/E)^T`` (T = the batch for a decode step,
batch × prompt for a prefill). NB: uniform routing; real routers are skewed, which reads fewer
distinct experts at small T. The experts' FLOPs are already per routed token (the grouped
GEMM's rows).

Attention data parallelism (`DataParallel`): each of r GPUs runs the attention and dense
kernels on its own requests; the step waits for the busiest, which holds ⌈b/r⌉ of a batch
of b requests (a lone request runs whole on one GPU); an in-flight batcher's steady state,
a mean over steps (a fractional b), spreads as b/r, at least min(b, 1), in those kernels'
batch terms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from fxlens.analyzer.time.roofline import Device


@dataclass(frozen=True)
class Kernel:
    """One fused kernel of a captured step: what it runs on and its work at that point."""

    target: str
    module: str
    key: str            # the dtype figure of the device it runs at (`roofline.DTYPE_KEYS`)
    kernel: str         # its kernel class (`DeviceSpec.kernel_efficiency`), "" for the default
    flops: float
    bytes: float
    weight: float = 1.0
    node: int = -1      # its first node in the captured graph


@dataclass(frozen=True)
class Point:
    """The kernels of one capture at `batch` sequences and `context` cached tokens."""

    batch: int
    context: int
    kernels: tuple[Kernel, ...]


class ShapeError(ValueError):
    """The captures are not the same graph on other shapes."""


@dataclass(frozen=True)
class Routing:
    """Routed experts: `experts` per MoE layer, `top_k` picked by each token; `rows` the
    kernels whose c₀ bytes are expert weights; `prefill`: a sequence brings its whole
    context as tokens (else one token: a decode step)."""

    experts: int
    top_k: int
    rows: tuple[int, ...]
    prefill: bool = False

    def share(self, tokens: torch.Tensor) -> torch.Tensor:
        """Expected share of the experts some of `tokens` routes to (uniform routing)."""
        return 1.0 - (1.0 - self.top_k / self.experts) ** tokens.clamp(min=0.0)

    def tokens(self, batch: float, contexts: torch.Tensor) -> torch.Tensor:
        return batch * contexts if self.prefill else torch.full_like(contexts, batch)


@dataclass(frozen=True)
class DataParallel:
    """`rows`: the kernels each of `ranks` GPUs runs on its own share of the step's batch."""

    ranks: int
    rows: tuple[int, ...]

    def batch_of_rank(self, batch: float) -> float:
        """The busiest rank's share of `batch` (the module docstring)."""
        if float(batch).is_integer():
            return float(math.ceil(batch / self.ranks))
        return max(batch / self.ranks, min(batch, 1.0))


@dataclass(frozen=True)
class AffineStep:
    """Per kernel, FLOPs and bytes as ``c₀ + c_b·b + c_L·L + c_bL·b·L`` (rows of `flops`
    and `bytes`: [c₀, c_b, c_L, c_bL]); the `routing` rows' c₀ read as routed experts';
    `windows`: per kernel, the most cached tokens it reads (a sliding-window layer's: L is
    ``min(L, window)`` for it; inf for the others; None: every kernel reads the whole L);
    `data_parallel`: the kernels run on one rank's share of the batch (None: all of it)."""

    kernels: tuple[Kernel, ...]
    flops: torch.Tensor          # (kernels, 4) float64
    bytes: torch.Tensor          # (kernels, 4) float64
    weights: torch.Tensor        # (kernels,)
    routing: Routing | None = None
    windows: torch.Tensor | None = None     # (kernels,) float64
    data_parallel: DataParallel | None = None

    def work(self, batch: float, context: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(FLOPs, bytes) per kernel at one point."""
        flops, moved = self.works(batch, [context])
        return flops[:, 0], moved[:, 0]

    def works(self, batch: float, contexts: Sequence[float]) -> tuple[torch.Tensor,
                                                                      torch.Tensor]:
        """(FLOPs, bytes), each (kernels, contexts), at `batch` and each of `contexts`."""
        ctx = torch.tensor(list(contexts), dtype=torch.float64)
        unread = self.unread(batch, ctx)
        seen = (ctx[None, :] if self.windows is None                   # (kernels | 1, contexts)
                else torch.minimum(ctx[None, :], self.windows[:, None]))
        b = self.batches(batch)[:, None]                                  # (kernels, 1)

        def at(c: torch.Tensor) -> torch.Tensor:
            return (c[:, 0:1] + c[:, 1:2] * b) + (c[:, 2:3] + c[:, 3:4] * b) * seen
        return at(self.flops), at(self.bytes) - unread

    def batches(self, batch: float) -> torch.Tensor:
        """(kernels,): the batch each kernel runs at on one GPU (`data_parallel`'s rows at one
        rank's share)."""
        out = torch.full((len(self.kernels),), float(batch), dtype=torch.float64)
        if self.data_parallel is not None and self.data_parallel.rows:
            out[list(self.data_parallel.rows)] = self.data_parallel.batch_of_rank(batch)
        return out

    def unread(self, batch: float, contexts: torch.Tensor) -> torch.Tensor:
        """(kernels, contexts): the c₀ bytes of experts no token of the step routes to."""
        missed = torch.zeros(len(self.kernels), len(contexts), dtype=torch.float64)
        if self.routing is not None and self.routing.rows:
            rows = list(self.routing.rows)
            share = self.routing.share(self.routing.tokens(batch, contexts))
            missed[rows] = self.bytes[rows, 0:1] * (1.0 - share)[None, :]
        return missed

    def weights_read(self, tokens: float) -> torch.Tensor:
        """Per kernel, the c₀ bytes (weights) a step of `tokens` tokens reads: every routed
        expert row only for the experts those tokens route to."""
        read = self.bytes[:, 0].clone()
        if self.routing is not None and self.routing.rows:
            rows = list(self.routing.rows)
            read[rows] *= self.routing.share(torch.tensor(float(tokens), dtype=torch.float64))
        return read

    def tokens(self, batch: float, context: float) -> float:
        """Tokens a step at (batch, context) runs: batch × context for a prefill, the batch
        for a decode step."""
        prefill = self.routing is not None and self.routing.prefill
        return batch * context if prefill else batch

    def times_s(self, device: Device, batch: float, contexts: Sequence[float]) -> torch.Tensor:
        """Seconds of one step at `batch` for each of `contexts` (summed over kernels)."""
        flops, moved = self.works(batch, contexts)                    # (kernels, contexts)
        return (roofline_s(device, self.kernels, flops, moved) * self.weights[:, None]).sum(0)

    def totals(self, batch: float, context: float) -> tuple[float, float]:
        """(FLOPs, bytes) of the whole step, kernels weighted."""
        flops, moved = self.work(batch, context)
        return float(flops @ self.weights), float(moved @ self.weights)


def roofline_s(device: Device, kernels: Sequence[Kernel], flops: torch.Tensor,
               moved: torch.Tensor) -> torch.Tensor:
    """Per kernel (rows) and point (columns): max(FLOPs / achievable FLOP/s at its dtype and
    kernel class, bytes / achievable bandwidth), plus the device's gap at a kernel boundary
    (`graph_launch_s`) for a kernel with work; unweighted."""
    rates = torch.tensor([device.achievable_flops(k.key, k.kernel) for k in kernels],
                         dtype=torch.float64).reshape(-1, *([1] * (flops.dim() - 1)))
    compute = torch.where(rates > 0, flops / rates.clamp(min=1e-30), 0.0)
    work = torch.maximum(compute, moved / device.achievable_bandwidth)
    return work + device.graph_launch_s * ((flops > 0) | (moved > 0))


def fit(points: Sequence[Point]) -> AffineStep:
    """The affine step through 2 captures (one context: linear in the batch) or 4 (two
    batches × two contexts: bilinear)."""
    first = points[0].kernels
    for point in points[1:]:
        if [(k.target, k.module) for k in point.kernels] != [(k.target, k.module)
                                                            for k in first]:
            raise ShapeError(f"the graph at batch {point.batch}, context {point.context} is "
                             f"not the one at batch {points[0].batch}, context "
                             f"{points[0].context}")
    batches = sorted({p.batch for p in points})
    contexts = sorted({p.context for p in points})
    if len(batches) != 2 or len(points) != 2 * len(contexts) or len(contexts) > 2:
        raise ValueError("fit takes 2 batches at 1 or 2 contexts")
    at = {(p.batch, p.context): p.kernels for p in points}
    return AffineStep(first, _coefficients(at, batches, contexts, "flops"),
                      _coefficients(at, batches, contexts, "bytes"),
                      torch.tensor([k.weight for k in first], dtype=torch.float64))


def _coefficients(at: Mapping[tuple[int, int], tuple[Kernel, ...]], batches: Sequence[int],
                  contexts: Sequence[int], field: str) -> torch.Tensor:
    def value(b: int, c: int) -> torch.Tensor:
        return torch.tensor([float(getattr(k, field)) for k in at[(b, c)]],
                            dtype=torch.float64)

    (b1, b2), c1 = batches, contexts[0]
    slope_b = (value(b2, c1) - value(b1, c1)) / (b2 - b1)
    if len(contexts) == 1:
        zero = torch.zeros_like(slope_b)
        return torch.stack([value(b1, c1) - slope_b * b1, slope_b, zero, zero], dim=1)
    c2 = contexts[1]
    slope_b2 = (value(b2, c2) - value(b1, c2)) / (b2 - b1)
    cross = (slope_b2 - slope_b) / (c2 - c1)                  # c_bL
    slope_c = (value(b1, c2) - value(b1, c1)) / (c2 - c1) - cross * b1      # c_L
    const = value(b1, c1) - slope_b * b1 - slope_c * c1
    slope_b_only = slope_b - cross * c1                        # c_b
    return torch.stack([const, slope_b_only, slope_c, cross], dim=1)
