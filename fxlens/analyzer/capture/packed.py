"""Packed sequences (``--packed L``): each sequence of the step is packed from samples of L
tokens, and attention runs within each sample, as fine-tuning recipes run it (NeMo and
Megatron-Bridge's packed SFT in the THD layout with ``cu_seqlens``, FlashAttention's varlen
kernels, Hugging Face's ``DataCollatorWithFlattening``, torchtitan's document masking).

While a training step is recorded on fake tensors, a causal self-attention call of
`F.scaled_dot_product_attention` on (B, H, T, d) with T > L and no explicit mask runs a
varlen kernel instead, on the B·T tokens laid out (B·T, H, d) with ``cu_seqlens`` at every
L tokens of each row (a row's last sample its remainder): ``aten._flash_attention_forward``,
or ``aten._efficient_attention_forward`` where the values have a head dimension of their own
(MLA). The step then computes the samples' causal scores, not the rows': at T = 4,096 and
L = 512 about an eighth of the attention's work. The backward is the varlen kernel's; both
are costed by `fxlens.rules.attention`, every sample at the longest one's length (a row's
remainder counted as a full sample). Everything but attention is per token and unchanged.

Left as they run: a call with a mask (a sliding window, a prefix: the mask decides), a
non-causal one (an encoder's, cross-attention), one on T ≤ L, one on real tensors (no CPU
varlen kernel) and one a varlen kernel refuses. L is one length where a real packed batch
mixes them: L = Σ Lᵢ² / Σ Lᵢ over its samples gives the same number of scores.
NB: the (B, H, T, d) → (B·T, H, d) layout is a copy of the queries, keys and values and one
of the output here, where a THD run holds them so from the projections on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake
from torch.overrides import TorchFunctionMode

from fxlens.analyzer.capture.fused_attention import autocast_args

aten = torch.ops.aten
CAUSAL_TOP_LEFT = 1     # the memory-efficient kernel's custom_mask_type for is_causal


@contextmanager
def packed_attention(sample: int) -> Iterator[None]:
    """While open, causal self-attention on fake tensors runs within samples of `sample`
    tokens (see the module docstring); a no-op for 0."""
    if sample <= 0:
        yield
        return
    with _Packed(sample):
        yield


class _Packed(TorchFunctionMode):
    def __init__(self, sample: int) -> None:
        super().__init__()
        self.sample = sample

    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            cast_args, cast_kwargs = autocast_args(args, kwargs)
            try:
                out = _varlen(self.sample, *cast_args, **cast_kwargs)
            except (TypeError, RuntimeError):   # not a call the varlen kernel takes
                out = None
            if out is not None:
                return out
        return func(*args, **kwargs)


VARLEN = ("aten._flash_attention_forward", "aten._efficient_attention_forward")


def packed_note(targets: Iterable[str], sample: int) -> str:
    """What a step recorded with ``--packed`` says: how many attention calls ran within
    samples (`targets`: the recorded nodes' ops)."""
    calls = sum(t.startswith(VARLEN) for t in targets)
    if not calls:
        return (f"--packed {sample}: no causal self-attention call longer than {sample} "
                "tokens without a mask, so none ran within samples; attention as captured")
    return (f"attention within samples of {sample} tokens (--packed): {calls} varlen "
            f"call{'s' if calls > 1 else ''}")


def sample_starts(rows: int, length: int, sample: int) -> list[int]:
    """The ``cu_seqlens`` of `rows` rows of `length` tokens packed from samples of `sample`:
    every sample's first token, then the total."""
    starts = [r * length + s for r in range(rows) for s in range(0, length, sample)]
    return [*starts, rows * length]


def _varlen(sample: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
            is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False
            ) -> torch.Tensor | None:
    """The call's output from the varlen kernel over its samples, or None where it is left
    (grouped-query keys and values go in with their own head count, as the kernel takes
    them, `enable_gqa` or not)."""
    tensors = (query, key, value)
    if not is_causal or attn_mask is not None or not all(is_fake(t) for t in tensors):
        return None
    if any(t.dim() != 4 for t in tensors):
        return None
    rows, _, length, _ = query.shape
    if key.shape[-2] != length or length <= sample:
        return None
    offsets = torch.tensor(sample_starts(rows, length, sample), dtype=torch.int32,
                           device=query.device)

    def tokens_first(t: torch.Tensor) -> torch.Tensor:      # (B, H, T, d) → (B·T, H, d)
        return t.transpose(1, 2).reshape(rows * length, t.shape[1], t.shape[-1])

    q, k, v = (tokens_first(t) for t in tensors)
    if query.shape[-1] == value.shape[-1]:
        out = aten._flash_attention_forward(q, k, v, offsets, offsets, sample, sample,
                                            dropout_p, True, False, scale=scale)[0]
    else:   # values of their own head dimension (MLA): the memory-efficient varlen kernel
        if scale is not None:   # torch's fake backward of this op refuses a `scale`: the
            q = q * (scale * math.sqrt(query.shape[-1]))   # queries carry it (one multiply)
        out = aten._efficient_attention_forward(
            q[None], k[None], v[None], None, offsets, offsets, sample, sample, dropout_p,
            CAUSAL_TOP_LEFT, True)[0]
    return out.view(rows, length, query.shape[1], value.shape[-1]).transpose(1, 2)
