"""`fused_delta_rules()`: `transformers`' chunked gated delta rules captured as the fused kernels
that a GPU run calls.

Every gated-DeltaNet mixer in `transformers` (Qwen3-Next, Qwen3.5 and Qwen3.5-MoE, OLMo-hybrid,
Lara-mini, Qwen4-exp) calls its file's ``torch_chunk_gated_delta_rule``, and Kimi Linear's
Kimi Delta Attention (a decay per key channel, not per head) ``chunk_kimi_delta_attention``:
`flash-linear-attention`'s ``chunk_gated_delta_rule`` and ``chunk_kda`` where that package is
installed (every GPU training setup: `transformers` warns that the fallback is slow;
Megatron-core's GatedDeltaNet calls the same kernel, ``megatron/core/ssm/gated_delta_net/
common.py`` @ d98e8a6), else a reference in plain PyTorch that casts q, k, v to float32,
materialises per chunk of 64 tokens the pairwise decays, the triangular system and the
intra-chunk scores of every head (KDA's per key channel too: B × H × chunks × 64 × 64 × K
floats, 2 GiB per layer and 4,096-token sequence at Kimi Linear's sizes, and its triangular
system inverted by a 63-step Python loop), and then walks the chunks in a Python loop, six
small matmuls per chunk, saving float32 copies for the backward that the kernels never keep.
Measured on Qwen3-Next-80B-A3B's training step at one 4,096-token sequence (``analyze --train
--device h100``, 2 cores): 265,744 → 22,600 nodes, 291 → 13 s to analyse (2.7 → 0.5 GB of
RSS), saved activations 87.7 → 55.5 GiB, bytes moved 5.29 → 1.61 TB, the roofline's forward
and backward 2.22 → 0.67 s (1.11 → 0.13 s of it kernel launches); FLOPs +0.6 % (the kernels
recompute in the backward what the reference kept). On Kimi Linear's sizes (transformers'
default config, 5 layers: 4 KDA, 1 MLA) at one 4,096-token sequence: 52,439 → 2,555 nodes,
1,184 → 4 s to analyse, saved activations 64.1 → 9.6 GiB, bytes moved 5.97 → 0.22 TB, the
roofline's forward and backward 2.25 → 0.10 s; FLOPs −1.2 %.

While a model is captured (`fxlens.analyzer.capture.as_eager.libraries_as_eager`), each loaded
``transformers.models.*.modeling_*`` file's rule runs as one op, ``fxlens_gdn::chunk`` (out,
what the backward reads, final state), with its backward ``fxlens_gdn::chunk_backward``,
saving what `flash-linear-attention`'s autograd functions save: q, k, v, the decay g, beta
and A, the solved triangular system (B × T × H × 64, in q's dtype), with KDA also the decayed
Q·Kᵀ scores (as wide again). NB: the per-row L2-norm reciprocals (two B × T × H_k float32
rows, 1/64 of q at head dim 128) are not kept apart; and a plan's host floor counts each op
as one launch, where the library launches about eight kernels forward and eight backward.
Their costs are `fxlens.rules.gdn`'s. A call the kernel path does not cover (a cache's state
to start from, packed sequences) keeps the reference, as a user's CPU run does. On real
tensors (a rerun a data-dependent model forces) the forward computes the reference's values
and the saved systems from them; the backward the reference's gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from fxlens.analyzer.capture.hf_paths import in_model_modules
from fxlens.analyzer.capture.kernel_ops import LibraryFunction, reference_gradients

# The function each gated-delta-rule file calls, and the file whose reference the others copy:
# a decay per head (gated DeltaNet), or per head and key channel (Kimi Delta Attention).
PER_HEAD = LibraryFunction("torch_chunk_gated_delta_rule",
                           "transformers.models.qwen3_next.modeling_qwen3_next")
PER_CHANNEL = LibraryFunction("chunk_kimi_delta_attention",
                              "transformers.models.kimi_linear.modeling_kimi_linear")


def _kind(g: torch.Tensor) -> LibraryFunction:
    """A decay per head, (B, T, H), or per head and key channel, (B, T, H, K)."""
    return PER_CHANNEL if g.dim() == 4 else PER_HEAD


def _rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
          beta: torch.Tensor, chunk_size: int, l2norm: bool, final: bool = False) -> Any:
    out, state = _kind(g).reference()(q, k, v, g, beta, chunk_size=chunk_size,
                                      output_final_state=final, use_qk_l2norm_in_kernel=l2norm)
    return (out, state) if final else out


def _by_chunk(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(B, T, H, …) → (B, H, chunks, chunk, …), the tail padded with zeros, in float32."""
    pad = (chunk_size - x.shape[1] % chunk_size) % chunk_size
    x = x.float().movedim(1, 2)
    x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(*x.shape[:2], -1, chunk_size, *x.shape[3:])


def _systems(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             chunk_size: int, l2norm: bool) -> torch.Tensor:
    """What the kernels save per chunk, token and head: A, the inverse of (I + the strictly
    lower part of β·K·Kᵀ ⊙ decay), and with a decay per key channel also the decayed scores
    Q·Kᵀ (causal, the diagonal in): (B, T, H, chunk) or (B, T, H, 2·chunk)."""
    heads = beta.shape[2]
    queries, keys = (x.repeat_interleave(heads // x.shape[2], dim=2) for x in (q, k))
    if l2norm:
        queries, keys = (x.float() * torch.rsqrt((x.float() ** 2).sum(-1, keepdim=True) + 1e-6)
                         for x in (queries, keys))
    queries = queries * queries.shape[-1] ** -0.5
    queries, keys = _by_chunk(queries, chunk_size), _by_chunk(keys, chunk_size)
    rates = _by_chunk(beta, chunk_size)
    decay = _by_chunk(g if g.dim() == 4 else g[..., None], chunk_size).cumsum(3)
    gaps = decay[..., :, None, :] - decay[..., None, :, :]            # (…, i, j, K or 1)
    rows = torch.arange(chunk_size, device=q.device)
    below = (rows[:, None] > rows[None, :])[..., None]

    def scored(left: torch.Tensor, strict: torch.Tensor) -> torch.Tensor:
        weights = torch.where(strict, gaps, float("-inf")).exp()
        return torch.einsum("...ik,...jk,...ijk->...ij", left, keys, weights.expand(
            *weights.shape[:-1], keys.shape[-1]))

    eye = torch.eye(chunk_size, device=q.device)
    system = rates[..., None] * scored(keys, below)
    solved = torch.linalg.solve_triangular(eye + system, eye.expand_as(system), upper=False,
                                           unitriangular=True)
    if g.dim() == 4:
        solved = torch.cat([solved, scored(queries, below | torch.eye(
            chunk_size, dtype=torch.bool, device=q.device)[..., None])], dim=-1)
    batch, length = q.shape[:2]
    return solved.reshape(batch, heads, -1, solved.shape[-1])[:, :, :length].transpose(1, 2)


def _saved_width(g: torch.Tensor, chunk_size: int) -> int:
    return 2 * chunk_size if g.dim() == 4 else chunk_size


@torch.library.custom_op("fxlens_gdn::chunk", mutates_args=())
def chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
          beta: torch.Tensor, chunk_size: int, l2norm: bool
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gated delta rule over q and k (B, T, H_k, K), v (B, T, H, V), beta (B, T, H) and
    the log decay g, (B, T, H) or per key channel (B, T, H, K), from a zero state: the
    output (B, T, H, V) in q's dtype, what the backward reads (`_systems`) and the final
    state (B, H, K, V) in float32, what a cache keeps."""
    with torch.no_grad():
        out, final = _rule(q, k, v, g, beta, chunk_size, l2norm, final=True)
        solved = _systems(q, k, g, beta, chunk_size, l2norm).to(q.dtype)
    return out.to(q.dtype), solved, final.float()


@chunk.register_fake
def _chunk_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, chunk_size: int, l2norm: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, length, heads, value_dim = v.shape
    out = v.new_empty((batch, length, heads, value_dim), dtype=q.dtype)
    solved = q.new_empty((batch, length, heads, _saved_width(g, chunk_size)))
    final = q.new_empty((batch, heads, k.shape[3], value_dim), dtype=torch.float32)
    return out, solved, final


@torch.library.custom_op("fxlens_gdn::chunk_backward", mutates_args=())
def chunk_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   g: torch.Tensor, beta: torch.Tensor, solved: torch.Tensor,
                   chunk_size: int, l2norm: bool) -> list[torch.Tensor]:
    """The gradients of q, k, v, g and beta (each in its input's dtype)."""
    inputs = (q, k, v, g, beta)

    def rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> torch.Tensor:
        return _rule(q, k, v, g, beta, chunk_size, l2norm)

    return reference_gradients(rule, inputs, grad.to(q.dtype))


@chunk_backward.register_fake
def _chunk_backward_fake(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         g: torch.Tensor, beta: torch.Tensor, solved: torch.Tensor,
                         chunk_size: int, l2norm: bool) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in (q, k, v, g, beta)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]
                   ) -> None:
    q, k, v, g, beta, *settings = inputs
    ctx.save_for_backward(q, k, v, g, beta, output[1])
    ctx.settings = settings


def _backward(ctx: Any, grad: torch.Tensor, _grad_solved: torch.Tensor | None,
              _grad_final: torch.Tensor | None) -> tuple[Any, ...]:
    # NB: the final state is a cache's (inference); no gradient flows back through it
    grads = chunk_backward(grad, *ctx.saved_tensors, *ctx.settings)
    return (*grads, None, None)


chunk.register_autograd(_backward, setup_context=_setup_context)


def _fused(function: LibraryFunction) -> Callable[..., Any]:
    """The files' `function` as the kernel runs it (see the module docstring)."""

    def fused_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   g: torch.Tensor, beta: torch.Tensor, chunk_size: int = 64,
                   initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                   use_qk_l2norm_in_kernel: bool = False, **kwargs: Any) -> Any:
        packed = kwargs.get("cu_seqlens") is not None
        if initial_state is not None or packed or value.shape[2] % key.shape[2]:
            return function.original()(
                query, key, value, g=g, beta=beta, chunk_size=chunk_size,
                initial_state=initial_state, output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        out, _, final = chunk(query, key, value, g, beta, int(chunk_size),
                              bool(use_qk_l2norm_in_kernel))
        return out, (final if output_final_state else None)

    fused_rule.__name__ = function.name
    return fused_rule


FUSED = {function: _fused(function) for function in (PER_HEAD, PER_CHANNEL)}


def _rules(module: ModuleType) -> dict[str, Any] | None:
    found: dict[str, Any] = {}
    for function, fused in FUSED.items():
        found |= function.replacing(module, fused) or {}
    return found or None


def fused_delta_rules() -> contextlib.AbstractContextManager[None]:
    return in_model_modules(_rules)
