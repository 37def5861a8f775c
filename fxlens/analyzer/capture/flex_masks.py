"""`broadcast_block_masks()`: FlexAttention block masks built by broadcasting while we trace,
so the graph builds them from positions with plain aten ops.

Why: `torch.nn.attention.flex_attention.create_block_mask` evaluates the user's ``mask_mod(b,
h, q_idx, kv_idx)`` over the whole (B, H, Q_LEN, KV_LEN) grid by nesting `torch.vmap` four
times. Traced, vmap leaves its own bookkeeping calls in the graph (``_add_batch_dim``,
``_remove_batch_dim``), which are no aten ops: the captured graph loses the chain from the
positions to the block counts, and the FlexAttention cost rule, which reads those counts
(`fxlens.rules.flex_attention`), could not compute them. The same grid is what broadcasting
gives: ``b``, ``h``, ``q_idx`` and ``kv_idx`` as ``arange``s along their own dims, the
``mask_mod`` applied once, the result expanded to (B, H, Q_LEN, KV_LEN). The block counts it
leads to are the same values; only the few ops that build the mask differ from an eager run's
(vmap's batching runs the same elementwise ops).

While a model is captured, `create_mask` (which `create_block_mask` calls) builds its grid so.
A ``mask_mod`` or ``score_mod`` that does not broadcast (Python control flow on a value,
``.item()``) falls back to the vmapped original, whose block counts then count dense.

Also for the duration, FlexAttention's refusal of inputs that require grad on a CPU device
(its CPU kernel has no backward) is lifted: the capture runs on fake CPU tensors for a GPU's
run, and an inference capture sees the weights' ``requires_grad``; and an eager call runs its
higher-order op directly (torch's debug switch) instead of wrapping it in `torch.compile`,
which our dispatch modes (fake tensors, the block fingerprints) cannot follow.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from fxlens.analyzer.capture.replaced import module_attributes

FLEX_MODULE = "torch.nn.attention.flex_attention"


def _broadcast_create_mask(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def create_mask(mod_fn: Callable[..., torch.Tensor], B: int | None, H: int | None,
                    Q_LEN: int, KV_LEN: int, device: Any = None) -> torch.Tensor:
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

        flex = sys.modules[FLEX_MODULE]
        batch, heads = B or 1, H or 1
        where = device if device is not None else "cpu"
        b = torch.arange(batch, device=where).view(batch, 1, 1, 1)
        h = torch.arange(heads, device=where).view(1, heads, 1, 1)
        q = torch.arange(Q_LEN, device=where).view(1, 1, Q_LEN, 1)
        kv = torch.arange(KV_LEN, device=where).view(1, 1, 1, KV_LEN)
        try:
            with TransformGetItemToIndex():
                if flex._get_mod_type(mod_fn) is flex._ModificationType.SCORE_MOD:
                    scores = mod_fn(torch.zeros(batch, heads, Q_LEN, KV_LEN, device=where),
                                    b, h, q, kv)
                    return torch.where(torch.isneginf(scores), False, True)
                allowed = mod_fn(b, h, q, kv)
            return allowed.expand(batch, heads, Q_LEN, KV_LEN)
        except Exception:   # a function that does not broadcast: vmap it, as torch does
            return original(mod_fn, B, H, Q_LEN, KV_LEN, device)

    return create_mask


def _any_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """The capture is of a GPU's run: CPU's missing FlexAttention backward is not refused."""


def broadcast_block_masks() -> contextlib.AbstractContextManager[None]:
    """For the duration, FlexAttention's `create_mask` broadcasts instead of vmapping, and
    weights that require grad may reach it on (fake) CPU tensors (only if FlexAttention is
    loaded already: a model that does not use it is not made to)."""
    def replacements(flex: ModuleType) -> dict[str, Any] | None:
        create_mask = getattr(flex, "create_mask", None)
        if create_mask is None or not all(hasattr(flex, name) for name in (
                "_validate_device", "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG")):
            return None
        return {"create_mask": _broadcast_create_mask(create_mask),
                "_validate_device": _any_device,
                "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG": True}

    return module_attributes(FLEX_MODULE, replacements)


def traced_score_mod(function: Callable[..., torch.Tensor]) -> torch.fx.GraphModule | None:
    """A FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` given as a Python function
    (as an eager or recorded call passes it), traced on zero-dim examples into the graph of
    the ops it runs per score, as torch.export records it; None if it cannot be traced."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes():
            examples = (torch.zeros(()), *(torch.zeros((), dtype=torch.int) for _ in range(4)))
            return make_fx(function)(*examples)
    except Exception:   # a score_mod reading other buffers, or untraceable: no ops counted
        return None


def as_exported(op: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A higher-order op's arguments as torch.export records them: FlexAttention's score_mod,
    when a call passes it as a Python function, traced to its graph (`traced_score_mod`)."""
    if op == "flex_attention" and len(args) > 3 and callable(args[3]) \
            and not isinstance(args[3], torch.fx.GraphModule):
        return (*args[:3], traced_score_mod(args[3]), *args[4:])
    return args
