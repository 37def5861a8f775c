"""What a real eager run's attention calls did: the oracle the zoo and preset tests count
attention against.

`AttentionCalls` intercepts `torch.nn.functional.scaled_dot_product_attention` (however the
model imported it) and notes per call whether its kernel did causal work (``is_causal=True``
and no mask: a kernel handed a mask, even an exactly causal one, computes every score),
whether it was handed a mask a kernel could skip (exactly causal, or a sliding window), and
the FLOPs the call performs by the closed form B·H·scores·(2·d_qk + 2·d_v + 8). The call
itself runs unseen by the dispatch modes, so a `FlopCounterMode` around the run counts
everything but attention.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

SOFTMAX = 1 + 1 + 4 + 1 + 1  # max, subtract, exp, sum, divide


def exactly_causal(mask: torch.Tensor, t_q: int, t_k: int) -> bool:
    """A real mask's values allow exactly the top-left causal scores (bool: True entries;
    float: entries above the lowest finite value, which must all be 0)."""
    mask = mask.expand(*mask.shape[:-2], t_q, t_k)
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    if mask.dtype != torch.bool and not bool((mask[allowed] == 0).all()):
        return False
    return bool((allowed == torch.ones(t_q, t_k, dtype=torch.bool).tril()).all())


def banded(mask: torch.Tensor, t_q: int, t_k: int) -> bool:
    """A real mask's values allow each query exactly its last w keys up to its own position
    (aligned to the last key), for one w narrower than the causal rows: a sliding window."""
    mask = mask.expand(*mask.shape[:-2], t_q, t_k).reshape(-1, t_q, t_k)
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    if mask.dtype != torch.bool and not bool((mask[allowed] == 0).all()):
        return False
    if not bool((allowed == allowed[:1]).all()):
        return False
    offset = t_k - t_q
    window = int(allowed[0].sum(-1).max())
    if window >= t_q + offset:        # no row is cut: causal at most
        return False
    return all(
        allowed[0, i, j].item() == (i + offset - window < j <= i + offset)
        for i in range(t_q) for j in range(t_k))


class AttentionCalls(TorchFunctionMode):
    """Notes each SDPA call's convention and runs it unseen by the dispatch modes (so
    FlopCounterMode counts everything but attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.causal: list[bool] = []          # the kernel skipped the upper triangle
        self.masked_causal: list[bool] = []   # handed an exactly causal or banded mask
        self.flops: list[int] = []            # what each call computed, by the closed form

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k = args[0], args[1]
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        is_causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
        v = args[2] if len(args) > 2 else kwargs["value"]
        causal = bool(is_causal) and mask is None
        self.causal.append(causal)
        self.masked_causal.append(mask is not None and (
            exactly_causal(mask, q.shape[-2], k.shape[-2])
            or banded(mask, q.shape[-2], k.shape[-2])))
        t_q, t_k = q.shape[-2], k.shape[-2]
        scores = sum(min(i + 1, t_k) for i in range(t_q)) if causal else t_q * t_k
        heads = q.numel() // (t_q * q.shape[-1])
        self.flops.append(heads * scores * (2 * q.shape[-1] + 2 * v.shape[-1] + SOFTMAX))
        with _disable_current_modes():
            return func(*args, **kwargs)
