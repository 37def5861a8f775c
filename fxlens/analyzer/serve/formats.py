"""A captured serving step at the number formats an engine serves it in.

The captures run in the model's own dtype (bf16 or fp16). Serving in FP8 stores the chosen
GEMMs' weights in one byte and runs them at the FP8 peak; a weight-only format (w8a16, w4a16)
stores them packed with their group scales and runs them at 16 bits; a KV cache in FP8 or
int8 is read at its width. Both are exact edits of the affine step (`kernels.AffineStep`): a
linear kernel's batch- and context-independent bytes (c₀) are its weight (a MoE layer's
grouped GEMM's: its experts'), so they scale by the weight's new width; an attention
kernel's context terms (c_L, c_bL) are the cache it reads, so they scale by the cache's.
Which kernels are which comes from the rules (`fxlens.rules.serving`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from fxlens.analyzer.serve.kernels import AffineStep, Kernel


@dataclass(frozen=True)
class Formats:
    """`weight_key`: the device figure the reduced GEMMs run at (None: as captured);
    `weight_scale` and `cache_scale`: new bytes over captured bytes."""

    weight_key: str | None = None
    weight_scale: float = 1.0
    cache_scale: float = 1.0


def served_at(step: AffineStep, formats: Formats, reduced: Callable[[Kernel], bool],
              reads_cache: Callable[[Kernel], bool]) -> AffineStep:
    """`step` with `reduced` kernels' weights and `reads_cache` kernels' cache reads at
    `formats`."""
    moved = step.bytes.clone()
    kernels = []
    for row, kernel in enumerate(step.kernels):
        if reduced(kernel):
            moved[row, 0] *= formats.weight_scale
            if formats.weight_key is not None:
                kernel = replace(kernel, key=formats.weight_key)
        if reads_cache(kernel):
            moved[row, 2:] *= formats.cache_scale
        kernels.append(kernel)
    return replace(step, kernels=tuple(kernels), bytes=moved)


def scale_of(new_bytes: float, captured_bytes: float) -> float:
    return new_bytes / captured_bytes if captured_bytes else 1.0



