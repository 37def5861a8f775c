"""The small types the capture room shares with `fxlens.rules` (autocast's op policies).

Only types live here, so rules can import them without importing the engine. The recording
that uses them is `fxlens.analyzer.capture.autocast`; the tables are in
`fxlens.rules.autocast`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class Cast(str, Enum):
    """What autocast does to one op's floating-point tensor arguments (PyTorch's
    ``CastPolicy`` in ``aten/src/ATen/autocast_mode.h``)."""

    LOWER = "lower"             # lower_precision_fp: cast to the autocast dtype
    FP32 = "fp32"               # fp32 (and fp32_append_dtype): cast to float32
    FP32_DTYPE = "fp32-dtype"   # fp32_set_opt_dtype: an unset ``dtype`` argument → float32
    PROMOTE = "promote"         # cast to the widest floating dtype among the arguments


@dataclass(frozen=True)
class Autocast:
    """A training step recorded under ``torch.autocast`` on CPU in `dtype` ("bfloat16",
    "float16"), with `casts` (aten op name, e.g. ``"layer_norm"`` or
    ``"pow.Tensor_Scalar"`` → its cast) applied where CPU autocast has no policy of its own
    for the op, so the recording follows another device's op lists (CUDA's)."""

    dtype: str
    casts: Mapping[str, Cast] = field(default_factory=dict)
    source: str = ""            # whose op lists `casts` completes CPU's with
