"""`fused_delta_rules()`: `transformers`' gated DeltaNet chunked scan captured as the fused kernel
that a GPU run calls.

Every gated-DeltaNet mixer in `transformers` (Qwen3-Next, Qwen3.5 and Qwen3.5-MoE, OLMo-hybrid,
Lara-mini, Qwen4-exp) calls its file's ``torch_chunk_gated_delta_rule``: `flash-linear-
attention`'s ``chunk_gated_delta_rule`` where that package is installed (every GPU training
setup: `transformers` warns that the fallback is slow; Megatron-core's GatedDeltaNet calls the
same kernel, ``megatron/core/ssm/gated_delta_net/common.py`` @ d98e8a6), else a
reference in plain PyTorch that casts q, k, v to float32, materialises per chunk of 64 tokens
the pairwise decays, the triangular system and the intra-chunk scores of every head, solves
the system, and then walks the chunks in a Python loop, six small matmuls per chunk. At
Qwen3-Next's 4,096 tokens that is 64 chunks × 36 layers of tiny ops per micro-batch, forward
and backward (111,395 costed ops in the captured step, where the kernels are ~10 per layer),
and float32 copies saved for the backward that the kernel never keeps. Measured on
Qwen3-Next-80B-A3B's training step at one 4,096-token sequence (``analyze --train --device
h100``, 2 cores): 265,744 → 22,600 nodes, 291 → 13 s to analyse (2.7 → 0.5 GB of RSS), saved
activations 87.7 → 55.5 GiB, bytes moved 5.29 → 1.61 TB, the roofline's forward and backward
2.22 → 0.67 s (1.11 → 0.13 s of it kernel launches); FLOPs +0.6 % (the kernels recompute
in the backward what the reference kept).

While a model is captured (`fxlens.analyzer.capture.as_eager.libraries_as_eager`), each loaded
``transformers.models.*.modeling_*`` file's ``torch_chunk_gated_delta_rule`` runs as one op,
``fxlens_gdn::chunk`` (out, A, final state), with its backward ``fxlens_gdn::chunk_backward``,
saving what `flash-linear-attention`'s ``ChunkGatedDeltaRuleFunction`` saves: q, k, v, the
decay g, beta and A, the solved triangular system (B × T × H × 64, in q's dtype). NB: its
per-row L2-norm reciprocals (two B × T × H_k float32 rows, 1/64 of q at head dim 128) are not
kept apart; and a plan's host floor counts each op as one launch, where the library launches
about eight kernels forward and eight backward. Their costs are `fxlens.rules.gdn`'s. A call the kernel path does not cover (a
cache's state to start from, packed sequences) keeps the reference, as a user's CPU run does.
On real tensors (a rerun a data-dependent model forces) the forward computes the reference's
values and A from them; the backward the reference's gradients.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from fxlens.analyzer.capture.hf_paths import in_model_modules

RULE = "torch_chunk_gated_delta_rule"  # the function name every gated-DeltaNet file uses
REFERENCE_MODULE = "transformers.models.qwen3_next.modeling_qwen3_next"
_REFERENCES: dict[str, Callable[..., Any]] = {}


def _reference() -> Callable[..., Any]:
    """`transformers`' plain-PyTorch chunked rule (Qwen3-Next's file; the others copy it)."""
    if "rule" not in _REFERENCES:
        function = getattr(importlib.import_module(REFERENCE_MODULE), RULE)
        _REFERENCES["rule"] = getattr(function, "__wrapped__", function)
    return _REFERENCES["rule"]


def _rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
          beta: torch.Tensor, chunk_size: int, l2norm: bool, final: bool = False) -> Any:
    out, state = _reference()(q, k, v, g, beta, chunk_size=chunk_size,
                              output_final_state=final, use_qk_l2norm_in_kernel=l2norm)
    return (out, state) if final else out


def _solved_system(k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, chunk_size: int,
                   l2norm: bool) -> torch.Tensor:
    """A, per chunk and value head the inverse of (I + strictly lower part of β·K·Kᵀ ⊙
    decay), as the kernel keeps it: (B, T, H, chunk), rows past T dropped."""
    batch, length, k_heads, _ = k.shape
    heads = beta.shape[2]
    keys = k.float().repeat_interleave(heads // k_heads, dim=2)
    if l2norm:
        keys = keys * torch.rsqrt((keys * keys).sum(-1, keepdim=True) + 1e-6)
    pad = (chunk_size - length % chunk_size) % chunk_size
    keys = torch.nn.functional.pad(keys.transpose(1, 2), (0, 0, 0, pad))
    rates = torch.nn.functional.pad(beta.float().transpose(1, 2), (0, pad))
    decay = torch.nn.functional.pad(g.float().transpose(1, 2), (0, pad))
    keys = keys.reshape(batch, heads, -1, chunk_size, keys.shape[-1])
    rates = rates.reshape(batch, heads, -1, chunk_size)
    cumulative = decay.reshape(batch, heads, -1, chunk_size).cumsum(-1)
    gaps = (cumulative[..., :, None] - cumulative[..., None, :]).tril(-1).exp().tril(-1)
    system = (rates[..., None] * keys) @ keys.transpose(-1, -2) * gaps
    eye = torch.eye(chunk_size, dtype=system.dtype, device=system.device)
    solved = torch.linalg.solve_triangular(eye + system, eye.expand_as(system), upper=False,
                                           unitriangular=True)
    return solved.reshape(batch, heads, -1, chunk_size)[:, :, :length].transpose(1, 2)


@torch.library.custom_op("fxlens_gdn::chunk", mutates_args=())
def chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
          beta: torch.Tensor, chunk_size: int, l2norm: bool
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gated delta rule over q and k (B, T, H_k, K), v (B, T, H, V), the log decay g and
    beta (B, T, H) from a zero state: the output (B, T, H, V) in q's dtype, the solved
    system A the backward reads (B, T, H, chunk) and the final state (B, H, K, V) in
    float32, what a cache keeps."""
    with torch.no_grad():
        out, final = _rule(q, k, v, g, beta, chunk_size, l2norm, final=True)
        solved = _solved_system(k, g, beta, chunk_size, l2norm).to(q.dtype)
    return out.to(q.dtype), solved, final.float()


@chunk.register_fake
def _chunk_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, chunk_size: int, l2norm: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, length, heads, value_dim = v.shape
    out = v.new_empty((batch, length, heads, value_dim), dtype=q.dtype)
    solved = q.new_empty((batch, length, heads, chunk_size))
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

    with torch.enable_grad():
        pullback = torch.func.vjp(rule, *inputs)[1]
        grads = pullback(grad.to(q.dtype))
    return [d.to(t.dtype) for d, t in zip(grads, inputs, strict=True)]


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


def fused_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, chunk_size: int = 64,
               initial_state: torch.Tensor | None = None, output_final_state: bool = False,
               use_qk_l2norm_in_kernel: bool = False, **kwargs: Any) -> Any:
    """``torch_chunk_gated_delta_rule`` as the kernel runs it (see the module docstring)."""
    packed = kwargs.get("cu_seqlens") is not None
    if initial_state is not None or packed or value.shape[2] % key.shape[2]:
        return _REFERENCES.get("original", _reference())(
            query, key, value, g=g, beta=beta, chunk_size=chunk_size,
            initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
    out, _, final = chunk(query, key, value, g, beta, int(chunk_size),
                          bool(use_qk_l2norm_in_kernel))
    return out, (final if output_final_state else None)


def _rules(module: ModuleType) -> dict[str, Any] | None:
    original = getattr(module, RULE, None)
    if not callable(original):
        return None
    if original is not fused_rule:     # the first file replaced hands its reference on
        _REFERENCES.setdefault("rule", getattr(original, "__wrapped__", original))
        _REFERENCES.setdefault("original", original)
    return {RULE: fused_rule}


def fused_delta_rules() -> contextlib.AbstractContextManager[None]:
    return in_model_modules(_rules)

