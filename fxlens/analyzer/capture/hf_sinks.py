"""`SINK_ATTENTION`: a `transformers` attention implementation that takes attention sinks as
the fused kernels that train and serve GPT-OSS run them.

GPT-OSS gives each head a learned sink: one more logit in every row of the softmax, whose
probability is dropped (``s_aux``). `transformers` runs it only in its eager implementation
(the B × H × T × T scores and probabilities materialised, then two matmuls); its SDPA path
ignores ``s_aux`` (GPT-OSS declares no SDPA support). The kernels a GPU run uses take the sink
inside the fused kernel: FlashAttention-3's ``s_aux``, cuDNN through Transformer Engine's
``softmax_type="learnable"`` (Megatron's GPT-OSS recipes), FlexAttention's renormalisation by
the log-sum-exp (`transformers`' own ``flex_attention_forward``).

`SINK_ATTENTION` (``"fxlens_sinks"``) is an attention implementation registered with
`transformers` (`register`), with SDPA's masks: a call that carries ``s_aux`` runs as one fused
attention kernel (``aten._scaled_dot_product_flash_attention_for_cpu``, grouped-query heads
taken natively, causal when no mask is passed) followed by the sink's renormalisation from its
log-sum-exp: with ``lse = log Σ exp(s)``, the rows' weights are
``exp(s) / (Σ exp(s) + exp(sink))``, so the output is the kernel's times
``sigmoid(lse − sink)``. The same values as the eager path, and the graph of a fused run: no
score matrix saved, attention FLOPs causal (`fxlens.rules.attention`). A call without ``s_aux``
is `transformers`' own SDPA. The GPT-OSS preset captures with it (`fxlens.analyzer.capture.hf`);
a model built by a user keeps the implementation it chose.

NB: the log-sum-exp leaves the kernel without a gradient (as PyTorch's derivative for it
declares), so the backward's sink term reaches the sink parameter and not the queries and keys:
a few pointwise FLOPs per score row that the GPU kernels' backward computes in-kernel.
A sliding-window layer (the module's ``sliding_window``, GPT-OSS's every other layer) is
recorded on fake tensors as FlashAttention's windowed kernel (``aten._flash_attention_forward``
with ``window_size_left``), counted on its band (`fxlens.rules.attention`); on real tensors
(a rerun a data-dependent model forces) CPU's kernel takes the banded mask, counted dense.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from fxlens.analyzer.capture.fused_attention import additive_mask

aten = torch.ops.aten

SINK_ATTENTION = "fxlens_sinks"


def register() -> None:
    """Register `SINK_ATTENTION` with `transformers` (its attention and mask interfaces)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SINK_ATTENTION, _attention)
    AttentionMaskInterface.register(SINK_ATTENTION, sdpa_mask)


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
               scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any
               ) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sinks = kwargs.pop("s_aux", None)
    if sinks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, is_causal=is_causal,
                                      **kwargs)
    return sink_attention(module, query, key, value, attention_mask, sinks, dropout, scaling,
                          is_causal), None


def sink_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor,
                   dropout: float = 0.0, scale: float | None = None,
                   is_causal: bool | None = None) -> torch.Tensor:
    """Attention with one sink logit per head (`sinks`, shape (H,)) as a fused kernel and its
    renormalisation; (B, H, T, d) in, (B, T, H, d) out as `transformers`' functions return."""
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = getattr(module, "sliding_window", None)
    if causal and isinstance(window, int) and 0 < window < key.shape[2] and all(
            is_fake(t) for t in (query, key, value)):
        return _windowed(query, key, value, sinks, window, dropout, scale)
    causal = causal and mask is None and query.shape[2] > 1
    if mask is not None:
        mask = additive_mask(mask[:, :, :, : key.shape[2]], query.dtype)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout, causal, attn_mask=mask, scale=scale)
    return (out * _kept(lse, sinks).unsqueeze(-1)).to(query.dtype).transpose(1, 2).contiguous()


def _windowed(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              sinks: torch.Tensor, window: int, dropout: float, scale: float | None
              ) -> torch.Tensor:
    """A sliding-window layer as FlashAttention runs it (``window_size_left``: each query sees
    its last `window` keys), on (B, T, H, d): the work of the band, not of the square its
    mask spans. Fake tensors only: the raw kernel is CUDA's."""
    t = query.shape[2]
    out, lse, *_ = aten._flash_attention_forward(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None, None, t,
        key.shape[2], dropout, True, False, scale=scale, window_size_left=window - 1,
        window_size_right=0)
    return (out * _kept(lse, sinks).transpose(1, 2).unsqueeze(-1)).to(query.dtype)


def _kept(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Σ exp(s) / (Σ exp(s) + exp(sink)) per (B, H, T) row, from the kernel's log-sum-exp: the
    share of each row's softmax the sink leaves to the keys."""
    return torch.sigmoid(lse - sinks.view(1, -1, 1).to(lse.dtype))
