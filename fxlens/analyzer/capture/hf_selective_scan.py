"""`fused_selective_scans()`: `transformers`' Mamba-1 selective scan captured as the fused
kernel that a GPU run calls.

Every Mamba-1 mixer in `transformers` (Mamba, Falcon-Mamba, Jamba, Zamba) calls its file's
``mamba_selective_scan``: `mamba_ssm`'s ``selective_scan_fn`` where that package is installed
(every GPU training setup: `transformers` warns that the fallback is slow), else a reference
in plain PyTorch that materialises the discretised A and B·u for every channel, token and
state (B × D × T × N float32 each: 2 GiB per layer and 4,096-token sequence at Jamba's
8,192 channels and 16 states) and then walks the sequence in a Python loop, one token at a
time: three ops per token, per layer, forward and backward, where the kernel is one launch
that keeps the state on chip. Measured on two Mamba-1 layers at Falcon-Mamba-7B's width
(hidden 4,096, 16 states) and one 2,048-token sequence (``analyze --train --device h100``, 2
cores): 156,202 → 428 nodes, 554 → 4 s to analyse (the machine shared), saved activations
8.45 → 1.08 GiB, bytes moved 35.3 → 0.02 TB, the roofline's forward and backward 13.4 s →
14 ms; FLOPs −27 % (the reference's per-token state ops, counted elementwise, against the
kernel's ten per state element).

While a model is captured (`fxlens.analyzer.capture.as_eager.libraries_as_eager`), each loaded
``transformers.models.*.modeling_*`` file's ``mamba_selective_scan`` runs as one op,
``fxlens_mamba::selective_scan`` (out, chunk states, final state), with its backward
``fxlens_mamba::selective_scan_backward``, saving what `mamba_ssm`'s ``SelectiveScanFn``
saves: u, delta, A, B, C, D, z, the delta bias, the output and the scan's state at the end of
each chunk of 2,048 tokens with the decay that led to it (B × D × chunks × 2N float32). Their
costs are `fxlens.rules.selective_scan`'s. A call the kernel path does not cover (no D, a
gate or bias missing, B and C per group) keeps the reference. On real tensors (a rerun a
data-dependent model forces) the forward runs the recurrence a token at a time, as the
reference does, recording the chunk states; the backward the reference's gradients.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

import torch

from fxlens.analyzer.capture.hf_paths import in_model_modules
from fxlens.analyzer.capture.kernel_ops import LibraryFunction, reference_gradients

# the function every Mamba-1 model file defines, and the file the others copy
SCAN = LibraryFunction("mamba_selective_scan", "transformers.models.mamba.modeling_mamba")
CHUNK = 2048                           # mamba_ssm's kChunkSize: tokens per saved state


def _scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
          C: torch.Tensor, D: torch.Tensor, z: torch.Tensor, delta_bias: torch.Tensor,
          softplus: bool) -> torch.Tensor:
    return SCAN.reference()(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias,
                            delta_softplus=softplus)


def _chunks(length: int) -> int:
    return -(-length // CHUNK)


def _states(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
            delta_bias: torch.Tensor, softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence a token at a time, as the reference runs it: per chunk the decay that
    led to its last state and that state, (B, D, chunks, 2N), and the final state (B, D, N)."""
    step = delta.float() + delta_bias.float()[:, None]
    step = torch.nn.functional.softplus(step) if softplus else step
    batch, channels, length = u.shape
    state = u.new_zeros((batch, channels, A.shape[1]), dtype=torch.float32)
    decay = torch.ones_like(state)
    saved = u.new_empty((batch, channels, _chunks(length), 2 * A.shape[1]), dtype=torch.float32)
    for t in range(length):
        discrete = torch.exp(A.float()[None] * step[:, :, t, None])
        state = discrete * state + step[:, :, t, None] * B[:, None, :, t].float() \
            * u[:, :, t, None].float()
        decay = decay * discrete
        if t % CHUNK == CHUNK - 1 or t == length - 1:
            saved[:, :, t // CHUNK] = torch.cat([decay, state], dim=-1)
            decay = torch.ones_like(state)
    return saved, state


@torch.library.custom_op("fxlens_mamba::selective_scan", mutates_args=())
def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor, z: torch.Tensor, delta_bias: torch.Tensor,
                   softplus: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The selective scan over u, delta and z (B, D, T), A (D, N), B and C (B, N, T), D and
    the delta bias (D,) from a zero state: the gated output (B, D, T) in u's dtype, the chunk
    states the backward reads and the final state (B, D, N), both float32."""
    with torch.no_grad():
        out = _scan(u, delta, A, B, C, D, z, delta_bias, softplus).to(u.dtype)
        saved, final = _states(u, delta, A, B, delta_bias, softplus)
    return out, saved, final


@selective_scan.register_fake
def _selective_scan_fake(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor,
                         B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, z: torch.Tensor,
                         delta_bias: torch.Tensor, softplus: bool
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, channels, length = u.shape
    states = A.shape[1]
    saved = u.new_empty((batch, channels, _chunks(length), 2 * states), dtype=torch.float32)
    final = u.new_empty((batch, channels, states), dtype=torch.float32)
    return torch.empty_like(u), saved, final


@torch.library.custom_op("fxlens_mamba::selective_scan_backward", mutates_args=())
def selective_scan_backward(grad: torch.Tensor, out: torch.Tensor, saved: torch.Tensor,
                            u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor,
                            B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, z: torch.Tensor,
                            delta_bias: torch.Tensor, softplus: bool) -> list[torch.Tensor]:
    """The gradients of u, delta, A, B, C, D, z and the delta bias (each in its input's
    dtype)."""
    inputs = (u, delta, A, B, C, D, z, delta_bias)

    def scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor, z: torch.Tensor, bias: torch.Tensor
             ) -> torch.Tensor:
        return _scan(u, delta, A, B, C, D, z, bias, softplus)

    return reference_gradients(scan, inputs, grad.to(out.dtype))


@selective_scan_backward.register_fake
def _selective_scan_backward_fake(grad: torch.Tensor, out: torch.Tensor, saved: torch.Tensor,
                                  u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor,
                                  B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
                                  z: torch.Tensor, delta_bias: torch.Tensor, softplus: bool
                                  ) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in (u, delta, A, B, C, D, z, delta_bias)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]
                   ) -> None:
    *tensors, softplus = inputs
    ctx.save_for_backward(output[0], output[1], *tensors)
    ctx.softplus = softplus


def _backward(ctx: Any, grad: torch.Tensor, _grad_saved: torch.Tensor | None,
              _grad_final: torch.Tensor | None) -> tuple[Any, ...]:
    # NB: the final state is a cache's (inference); no gradient flows back through it
    grads = selective_scan_backward(grad, *ctx.saved_tensors, ctx.softplus)
    return (*grads, None)


selective_scan.register_autograd(_backward, setup_context=_setup_context)


def fused_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
               delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
               return_last_state: bool = False, **kwargs: Any) -> Any:
    """``mamba_selective_scan`` as the kernel runs it (see the module docstring)."""
    if D is None or z is None or delta_bias is None or B.dim() != 3 or C.dim() != 3:
        return SCAN.original()(
            hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias,
            delta_softplus=delta_softplus, return_last_state=return_last_state, **kwargs)
    out, _, final = selective_scan(hidden_states, dt, A, B, C, D, z, delta_bias,
                                   bool(delta_softplus))
    return (out, final) if return_last_state else out


def _scans(module: ModuleType) -> dict[str, Any] | None:
    return SCAN.replacing(module, fused_scan)


def fused_selective_scans() -> contextlib.AbstractContextManager[None]:
    return in_model_modules(_scans)
