"""`eager_mask_decisions()`: `transformers` decides whether to hand SDPA a mask as its eager run
does, also while we trace it.

Why: `transformers.masking_utils` skips building a causal mask when SDPA's ``is_causal=True``
says the same (no padding, as many queries as keys, or one query), so its eager run calls a
kernel that computes only the lower triangle. But it asks first whether it is being traced
(``torch.export``, fake tensors, fx proxies: ``is_tracing``), and if so always materialises the
mask, since a traced graph must not bake in a decision read from the padding's values. A
capture on fake tensors would then record an explicit mask, and an explicit mask runs a kernel
that computes every score (`fxlens.rules.attention`): llama-3-8b at 8,192 tokens would count
12.7 % more forward FLOPs than its eager run performs, and hold a B·H·T·T mask it never makes.

While a model is captured (every capture method, the training step, the eager memory
simulation), the three decisions that read values are answered as the eager run answers them,
from the values where the tensors hold them (a real rerun) and otherwise under the analysis's
standing assumptions, the ones `fxlens.rules.masks` makes too: a padding ``attention_mask``
holds no padding (a tokenizer's unpadded batch), and positions count up by one along each row
(one sequence per row, not packed):

- `find_packed_sequence_indices`: no packed sequences (None);
- `_ignore_causal_mask_sdpa`: skipped, unless a local (sliding-window) size is reached by the
  keys or a static cache's offset is a tensor, when there is one query, as many queries as
  keys, or (no padding mask at all) an empty cache;
- `_ignore_bidirectional_mask_sdpa`: skipped unless a local size is reached by the keys.

A model that materialises its mask in eager too (Falcon always does, to add ALiBi to it; a
custom ``or``/``and`` mask function; a sliding window the keys reach) keeps its mask: these
answers do not skip it. Where `transformers` is not loaded or no longer has these functions,
nothing is replaced and the graph keeps whatever the trace built (its masks then count
dense, and the attention notes say so).
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from fxlens.analyzer.capture.replaced import module_attributes

DECISIONS = ("find_packed_sequence_indices", "_ignore_causal_mask_sdpa",
             "_ignore_bidirectional_mask_sdpa")


def _traced(tensor: torch.Tensor) -> bool:
    """Whether `tensor` holds no values to read: fake, meta, an fx proxy, or under export."""
    if torch.compiler.is_exporting() or not isinstance(tensor, torch.Tensor):
        return True
    return isinstance(tensor, FakeTensor) or tensor.is_meta


def _unpadded(padding_mask: torch.Tensor | None) -> bool:
    """No position of `padding_mask` is padding: by its values where it holds them, else by
    the standing assumption."""
    return padding_mask is None or _traced(padding_mask) or bool(padding_mask.all())


def packed_sequences(position_ids: torch.Tensor) -> torch.Tensor | None:
    """Eager `transformers`' sequence index per token when rows pack several sequences (None:
    one sequence per row, assumed where the positions hold no values)."""
    if _traced(position_ids):
        return None
    diff = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1)
    packed = (diff != 1).cumsum(-1)
    return None if bool((packed[:, -1] == 0).all()) else packed


def skips_causal_mask(padding_mask: torch.Tensor | None, q_length: int, kv_length: int,
                      q_offset: Any, kv_offset: Any, local_attention_size: int | None = None
                      ) -> bool:
    """Eager `transformers`' answer to "can SDPA's is_causal replace the causal mask?"."""
    if isinstance(q_offset, torch.Tensor):
        return False
    if local_attention_size is not None and kv_length >= local_attention_size:
        return False
    if (q_length == 1 or kv_length == q_length) and _unpadded(padding_mask):
        return True
    return q_offset == 0 and padding_mask is None


def skips_bidirectional_mask(padding_mask: torch.Tensor | None, kv_length: int,
                             local_attention_size: int | None = None) -> bool:
    """Eager `transformers`' answer to "can a bidirectional mask be left out?"."""
    return (_unpadded(padding_mask)
            and (local_attention_size is None or kv_length < local_attention_size))


def eager_mask_decisions() -> contextlib.AbstractContextManager[None]:
    """For the duration, `transformers.masking_utils` decides as its eager run does (only if
    transformers is loaded already: a model that does not use it is not made to)."""
    def answers(masking: ModuleType) -> dict[str, Any] | None:
        if not all(hasattr(masking, name) for name in DECISIONS):
            return None
        return dict(zip(DECISIONS, (packed_sequences, skips_causal_mask,
                                    skips_bidirectional_mask), strict=True))

    return module_attributes("transformers.masking_utils", answers)
