"""A `transformers` causal LM's loss in the dtype of its logits, for training steps recorded
with ``--loss-dtype logits``.

transformers' causal-LM loss (``ForCausalLMLoss``) casts the logits to float32 before the
cross-entropy: at Qwen3's 151,936-token vocabulary that is 2.3 GiB more per 4,096 tokens, and
its float32 copies are saved for the backward. Trainers that skip the cast (NeMo Automodel's
``MaskedCrossEntropy`` with ``fp32_upcast: false``) hold less, so the recorded step takes
the same loss without it: labels shifted by one, positions labelled ``ignore_index``
skipped, the mean over the labelled tokens (or the sum over ``num_items_in_batch``), the
logits left in their own dtype.

`logits_dtype_loss(module)` sets it on the module for the length of a ``with`` block (through
transformers' ``loss_function`` setter) and puts the model's own back after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

IGNORE_INDEX = -100       # transformers' label for "no loss here"


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                   num_items_in_batch: Any = None, ignore_index: int = IGNORE_INDEX,
                   shift_labels: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
    """transformers' causal-LM loss without the float32 cast of the logits."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()
    flat = logits.reshape(-1, vocab_size)
    target = shift_labels.reshape(-1).to(flat.device)
    if num_items_in_batch is None:
        return F.cross_entropy(flat, target, ignore_index=ignore_index)
    return F.cross_entropy(flat, target, ignore_index=ignore_index,
                           reduction="sum") / num_items_in_batch


def supports(module: nn.Module) -> bool:
    """Whether `module` takes its loss from transformers' ``loss_function``."""
    return isinstance(getattr(type(module), "loss_function", None), property)


@contextlib.contextmanager
def logits_dtype_loss(module: nn.Module) -> Iterator[None]:
    """`module` computing `causal_lm_loss` inside the block; its own loss after."""
    had = "_loss_function" in vars(module)
    previous = vars(module).get("_loss_function")
    module.loss_function = causal_lm_loss  # type: ignore[assignment]  # transformers' setter
    try:
        yield
    finally:
        if had:
            vars(module)["_loss_function"] = previous
        else:
            vars(module).pop("_loss_function", None)
