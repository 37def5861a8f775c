"""`fused_attention_kernels()`: attention recorded as the fused kernel a GPU runs, where the
composite on CPU would take its math path: calls with dropout, and calls whose values have
another head dimension than their queries and keys (multi-head latent attention).

While a training step is recorded, `F.scaled_dot_product_attention` with ``dropout_p > 0`` is
sent to ``aten._scaled_dot_product_flash_attention_for_cpu`` (the same dropout_p, is_causal,
attn_mask and scale; its first output is the result), instead of the backend the composite
would choose. A `TorchFunctionMode` catches the call however the model imported it.

Why: PyTorch's CPU backend selection never takes its fused flash kernel with dropout, so the
composite falls back to the math path: scores, ``_safe_softmax``, a dropout mask, ``mul``…,
which *saves* the B×H×T×T fp32 probabilities and the dropout mask for the backward. On a GPU
the flash and memory-efficient kernels draw dropout in-kernel from a Philox seed and save only
the output and the logsumexp (B×H×T). Measured on an H200: a GPT-2 step (batch 8, 1024
tokens, amp-bf16, AdamW) peaks at 8.8 GiB; recorded on the math path we predicted 20.4 GiB
(≈ 400 MB of probabilities per layer). Every model that trains with attention dropout (GPT-2,
BERT, ViT, T5, Whisper…) was overstated alike. The fused op and its backward are costed by
`fxlens.rules.attention`: the same GEMMs, but a causal call counts only the scores computed
where the math path's masked square counted all (GPT-2's forward at 1024 tokens: 7 % fewer
FLOPs; at 128 tokens 1 %), as for attention without dropout.

Values with their own head dimension (DeepSeek-V2/V3's MLA: queries and keys of 192, values
of 128): CPU's flash kernel needs one head dimension, so the composite takes the math path,
materialising the B×H×T×T scores in fp32 — in DeepSeek-V3 at 4,096 tokens 85 % of a dense
layer's forward time, where a GPU runs cuDNN's or the memory-efficient kernel, both of which
take a separate value head dimension. Such calls (dropout or not, otherwise as CPU's flash
kernel would take them) are recorded as ``aten._scaled_dot_product_efficient_attention``
(the mask passed as its additive bias), costed by the same rules.

Left as the composite runs them:
- ``dropout_p == 0`` with one head dimension: the composite already takes the fused kernel
  where it can.
- grouped-query calls (``enable_gqa`` with fewer key/value heads than query heads): whether a
  GPU fuses them depends on the dtype (the CUDA flash kernel takes them, in fp16/bf16 only;
  the memory-efficient kernel, which fp32 needs, does not, and falls back to math), so no one
  answer is right; they keep the math path, an overstatement in half precision.
- any call CPU's fused kernel would refuse without the dropout (`cpu_flash_takes`: the checks
  of ``use_flash_attention_cpp`` in PyTorch's ``sdp_utils_cpp``). They are checked here, not
  left to an exception: the fake kernel takes calls the real one refuses (3-D inputs, a mask
  of any shape).
- real tensors (the rerun a data-dependent model forces): CPU's real kernel refuses dropout.
A call that fails on the fused op all the same is run as written: the capture never fails here.

Under CPU autocast (`fxlens.analyzer.capture.autocast`) the call's floating inputs are cast to
autocast's dtype first, as autocast casts the composite's (it is on the lower-precision list
of CPU and CUDA); the fused op is on neither.

Limitation: the graph is that of a GPU run. A model trained on a CPU really takes the math
path, so the pipeline turns this off when the analysis targets a CPU device.
NB: dropout's own work (drawing the mask in-kernel) is not counted, on either path.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import is_fake
from torch.overrides import TorchFunctionMode

log = logging.getLogger(__name__)

aten = torch.ops.aten

CPU_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@contextmanager
def fused_attention_kernels(enabled: bool = True) -> Iterator[None]:
    """While open, attention with dropout or a separate value head dimension on fake tensors
    runs a fused kernel (see the module docstring); a no-op when not `enabled`."""
    if not enabled:
        yield
        return
    with _FusedDropout():
        yield


class _FusedDropout(TorchFunctionMode):
    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            args, kwargs = autocast_args(args, kwargs)
            try:
                out = _fused(*args, **kwargs)
            except TypeError:    # arguments not as SDPA takes them: it says what is wrong
                out = None
            if out is not None:
                return out
        return func(*args, **kwargs)


def autocast_args(args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The floating tensors in autocast's dtype while CPU autocast is on, as autocast casts
    the composite's (on its lower-precision list); the fused op it may become is on none, so
    the cast is made here, before either runs (the composite then finds nothing to cast)."""
    if not torch.is_autocast_enabled("cpu"):
        return args, kwargs
    dtype = torch.get_autocast_dtype("cpu")

    def cast(t: torch.Tensor) -> torch.Tensor:
        eligible = t.is_floating_point() and t.dtype != torch.float64 and t.device.type == "cpu"
        return t.to(dtype) if eligible else t

    return pytree.tree_map_only(torch.Tensor, cast, (args, kwargs))


def _fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
           is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False
           ) -> torch.Tensor | None:
    """The call's output from the fused kernel, or None where it is left as it is."""
    if not all(is_fake(t) for t in (query, key, value)):
        return None
    if is_causal and attn_mask is not None:
        return None                     # the composite raises its own error for it
    if _latent_values(query, key, value, attn_mask):
        return _efficient(query, key, value, attn_mask, dropout_p, is_causal, scale)
    if not dropout_p > 0 or not cpu_flash_takes(query, key, value, attn_mask):
        return None
    try:
        mask = additive_mask(attn_mask, query.dtype)
        out, _ = aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale)
    except Exception as error:   # never fail the capture for this
        log.info("attention with dropout left on the composite's path (%s: %s)",
                 type(error).__name__, error)
        return None
    return out


def _latent_values(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attn_mask: torch.Tensor | None) -> bool:
    """Whether CPU's flash kernel would take the call but for the values' head dimension."""
    if value.dim() != 4 or value.shape[-1] == query.shape[-1]:
        return False
    stand_in = value.new_empty(value.shape[:-1] + (query.shape[-1],))
    return cpu_flash_takes(query, key, stand_in, attn_mask)


def _efficient(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attn_mask: torch.Tensor | None, dropout_p: float, is_causal: bool,
               scale: float | None) -> torch.Tensor | None:
    try:
        bias = additive_mask(attn_mask, query.dtype)
        if bias is not None and bias.dim() == 2:
            bias = bias.expand(query.shape[0], query.shape[1], *bias.shape)
        out, *_ = aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, True, dropout_p, is_causal, scale=scale)
    except Exception as error:   # never fail the capture for this
        log.info("attention with its own value head dimension left on the composite's "
                 "path (%s: %s)", type(error).__name__, error)
        return None
    return out


def cpu_flash_takes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None) -> bool:
    """Whether PyTorch's CPU backend choice takes the fused flash kernel for these inputs
    when dropout is 0: ``use_flash_attention_cpp`` (``sdp_utils_cpp``), its GQA case excepted
    (heads must match here). Pinned against ``torch._fused_sdp_choice`` in the tests."""
    qkv = (query, key, value)
    if not torch.backends.cuda.flash_sdp_enabled():
        return False
    if any(t.is_nested or t.dim() != 4 for t in qkv):
        return False
    if len({t.shape[0] for t in qkv}) != 1 or len({t.shape[1] for t in qkv}) != 1:
        return False                    # batch and heads (no GQA)
    if len({t.shape[-1] for t in qkv}) != 1 or query.shape[2] == 0 or key.shape[2] == 0:
        return False                    # head dims, empty sequences
    if any(t.stride(-1) != 1 for t in qkv) or query.dtype not in CPU_FLASH_DTYPES:
        return False
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    return attn_mask is None or _mask_fits(attn_mask, query, key)


def _mask_fits(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> bool:
    """``check_attn_mask_shape``, and a dtype the composite takes."""
    if mask.requires_grad or mask.dim() not in (2, 4):
        return False
    if mask.dtype not in (torch.bool, query.dtype):
        return False
    if mask.shape[-2] not in (query.shape[2], 1) or mask.shape[-1] not in (key.shape[2], 1):
        return False
    return mask.dim() == 2 or (mask.shape[0] in (1, query.shape[0])
                               and mask.shape[1] in (1, query.shape[1]))


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive one the composite hands its kernels (True: attend),
    made by the same ops (``convert_boolean_attn_mask``)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    masked = aten.scalar_tensor.default(-math.inf, dtype=dtype, device=mask.device)
    kept = aten.scalar_tensor.default(0.0, dtype=dtype, layout=torch.strided,
                                      device=mask.device)
    return aten.where.self(mask, kept, masked)
