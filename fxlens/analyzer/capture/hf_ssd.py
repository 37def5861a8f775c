"""`fused_ssd_scans()`: `transformers`' Mamba-2 chunked scan (SSD) captured as the fused kernel
that a GPU run calls.

Every Mamba-2 mixer in `transformers` (Mamba-2, Nemotron-H, Bamba, Granite-MoE-hybrid, Zamba2,
Falcon-H1) calls its file's ``mamba2_chunk_scan``: `mamba_ssm`'s ``mamba_chunk_scan_combined``
where that package is installed (every GPU training setup: `transformers` warns that the
fallback is "much slower"), else a reference in plain PyTorch that materialises what the kernel
keeps on chip: per chunk of Q tokens the Q × Q decay mask and scores of every head
(``segment_sum``, ``G``, ``M``), B and C repeated per head, and the states in float32, all saved
for the backward. At Nemotron-3 Nano's 8,192 tokens each of those (B and C repeated to 64
heads, the decay mask, the scores and their masked product) is 256 MiB per Mamba layer and
sequence, where the kernel saves its inputs, output and a 2 MiB cumulative decay.

While a model is captured (`fxlens.analyzer.capture.as_eager.libraries_as_eager`), each loaded
``transformers.models.*.modeling_*`` file's ``mamba2_chunk_scan`` runs as one op,
``fxlens_ssd::chunk_scan`` (out, dA_cumsum, final state), with its backward
``fxlens_ssd::chunk_scan_backward``, saving what `mamba_ssm`'s ``MambaChunkScanCombinedFn``
saves: the output, x, dt, the cumulative decay (B × H × chunks × Q, float32), A, B, C, D and
dt_bias. Their costs are `fxlens.rules.ssd`'s. A call the kernel path does not cover (a
cache's state to start from, packed sequences, no D or dt_bias) keeps the reference; a
prefill that fills a cache takes the op's final state. On real tensors (a rerun a
data-dependent model forces) the forward computes the reference's values a chunk at a time,
holding what the kernel holds, and the backward the reference's gradients.
"""

from __future__ import annotations

import contextlib
import math
from types import ModuleType
from typing import Any

import torch

from fxlens.analyzer.capture.hf_paths import in_model_modules
from fxlens.analyzer.capture.kernel_ops import LibraryFunction, reference_gradients

# the function every Mamba-2 model file defines, and the file the others copy
SCAN = LibraryFunction("mamba2_chunk_scan", "transformers.models.mamba2.modeling_mamba2")


def _chunks(length: int, chunk_size: int) -> int:
    return math.ceil(length / chunk_size)


def _scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
          C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int,
          dt_softplus: bool, dt_min: float, dt_max: float) -> torch.Tensor:
    out = SCAN.reference()(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
                       dt_softplus=dt_softplus, dt_limit=(dt_min, dt_max))
    return out.to(x.dtype)


def _scan_by_chunks(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int,
                    dt_softplus: bool, dt_min: float, dt_max: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's values, the cumulative decay per chunk (B, H, chunks, Q; a padded
    tail keeps the chunk's last value, as the kernel's zero-padded steps do) and the final
    state, one chunk at a time, carrying the state from chunk to chunk as the kernel does:
    nothing the size of the sequence is made but the outputs, so a real run holds what the
    kernel holds (no gradients: the op's forward)."""
    dt = dt + dt_bias.to(dt.dtype)
    dt = (torch.nn.functional.softplus(dt) if dt_softplus else dt).clamp(dt_min, dt_max)
    batch, length, heads, head_dim = x.shape
    per_group = heads // B.shape[2]
    state = x.new_zeros((batch, heads, head_dim, B.shape[3]), dtype=torch.float32)
    out = torch.empty_like(x)
    cumulative = x.new_empty((batch, heads, _chunks(length, chunk_size), chunk_size),
                             dtype=torch.float32)
    for start in range(0, length, chunk_size):
        rows = slice(start, min(start + chunk_size, length))
        step = dt[:, rows].float()                                       # (b, q, h)
        xs = x[:, rows].float()
        xd = xs * step[..., None]
        Bs = B[:, rows].float().repeat_interleave(per_group, dim=2)     # (b, q, h, n)
        Cs = C[:, rows].float().repeat_interleave(per_group, dim=2)
        decay = torch.cumsum(step * A.float(), dim=1)                    # (b, q, h)
        cumulative[:, :, start // chunk_size] = decay[:, -1:].permute(0, 2, 1)
        cumulative[:, :, start // chunk_size, :decay.shape[1]] = decay.permute(0, 2, 1)
        gaps = decay[:, :, None, :] - decay[:, None, :, :]               # (b, l, s, h)
        keep = torch.ones(gaps.shape[1:3], dtype=torch.bool, device=x.device).tril()
        mask = torch.exp(gaps.masked_fill(~keep[None, :, :, None], -math.inf))
        scores = torch.einsum("blhn,bshn->blsh", Cs, Bs) * mask
        y = torch.einsum("blsh,bshp->blhp", scores, xd)
        y += torch.einsum("blhn,bhpn->blhp", Cs, state) * torch.exp(decay)[..., None]
        y += D.float()[:, None] * xs
        out[:, rows] = y.to(x.dtype)
        to_end = torch.exp(decay[:, -1:] - decay)                        # (b, q, h)
        state = state * torch.exp(decay[:, -1])[..., None, None] + torch.einsum(
            "bshn,bshp->bhpn", Bs * to_end[..., None], xd)
    return out, cumulative, state


@torch.library.custom_op("fxlens_ssd::chunk_scan", mutates_args=())
def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int,
               dt_softplus: bool, dt_min: float, dt_max: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SSD over x (B, T, H, P) with dt (B, T, H), A (H,), B and C (B, T, G, N), D and dt_bias
    (H,) from a zero state: the output (B, T, H, P) in x's dtype, the cumulative decay the
    backward reads and the final state (B, H, P, N) in float32, what a cache keeps."""
    with torch.no_grad():
        return _scan_by_chunks(x, dt, A, B, C, D, dt_bias, chunk_size, dt_softplus, dt_min,
                               dt_max)


@chunk_scan.register_fake
def _chunk_scan_fake(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                     C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int,
                     dt_softplus: bool, dt_min: float, dt_max: float
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, length, heads, head_dim = x.shape
    decay = x.new_empty((batch, heads, _chunks(length, chunk_size), chunk_size),
                        dtype=torch.float32)
    final = x.new_empty((batch, heads, head_dim, B.shape[3]), dtype=torch.float32)
    return torch.empty_like(x), decay, final


@torch.library.custom_op("fxlens_ssd::chunk_scan_backward", mutates_args=())
def chunk_scan_backward(grad: torch.Tensor, out: torch.Tensor, x: torch.Tensor,
                        dt: torch.Tensor, dA_cumsum: torch.Tensor, A: torch.Tensor,
                        B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
                        dt_bias: torch.Tensor, chunk_size: int, dt_softplus: bool,
                        dt_min: float, dt_max: float) -> list[torch.Tensor]:
    """The gradients of x, dt, A, B, C, D and dt_bias (each in its input's dtype)."""
    inputs = (x, dt, A, B, C, D, dt_bias)

    def scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
        return _scan(x, dt, A, B, C, D, dt_bias, chunk_size, dt_softplus, dt_min, dt_max)

    return reference_gradients(scan, inputs, grad.to(x.dtype))


@chunk_scan_backward.register_fake
def _chunk_scan_backward_fake(grad: torch.Tensor, out: torch.Tensor, x: torch.Tensor,
                              dt: torch.Tensor, dA_cumsum: torch.Tensor, A: torch.Tensor,
                              B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
                              dt_bias: torch.Tensor, chunk_size: int, dt_softplus: bool,
                              dt_min: float, dt_max: float) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in (x, dt, A, B, C, D, dt_bias)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]
                   ) -> None:
    x, dt, A, B, C, D, dt_bias, *settings = inputs
    ctx.save_for_backward(output[0], x, dt, output[1], A, B, C, D, dt_bias)
    ctx.settings = settings


def _backward(ctx: Any, grad: torch.Tensor, _grad_decay: torch.Tensor | None,
              _grad_final: torch.Tensor | None) -> tuple[Any, ...]:
    # NB: the final state is a cache's (inference); no gradient flows back through it
    saved = ctx.saved_tensors
    grads = chunk_scan_backward(grad, *saved, *ctx.settings)
    return (*grads, None, None, None, None)


chunk_scan.register_autograd(_backward, setup_context=_setup_context)


def fused_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, chunk_size: int, D: torch.Tensor | None = None,
               dt_bias: torch.Tensor | None = None, initial_states: torch.Tensor | None = None,
               dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, math.inf),
               return_final_states: bool = False, **kwargs: Any) -> Any:
    """``mamba2_chunk_scan`` as the kernel runs it (see the module docstring)."""
    packed = kwargs.get("seq_idx") is not None or kwargs.get("cu_seqlens") is not None
    if D is None or dt_bias is None or D.dim() != 1 or initial_states is not None or packed:
        return SCAN.reference()(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
                            initial_states=initial_states, dt_softplus=dt_softplus,
                            dt_limit=dt_limit, return_final_states=return_final_states)
    out, _, final = chunk_scan(x, dt, A, B, C, D, dt_bias, chunk_size, dt_softplus,
                               float(dt_limit[0]), float(dt_limit[1]))
    return (out, final) if return_final_states else out


def _scans(module: ModuleType) -> dict[str, Any] | None:
    return SCAN.replacing(module, fused_scan)


def fused_ssd_scans() -> contextlib.AbstractContextManager[None]:
    return in_model_modules(_scans)
