"""`libraries_as_eager()`: every library decision the capture makes as a GPU's eager run does,
in one context for every place that runs a model on fake tensors (the capture methods, the
training step, the eager memory simulation): `transformers`' mask decisions
(`fxlens.analyzer.capture.hf_masks`) and code paths (`fxlens.analyzer.capture.hf_paths`), and
FlexAttention's block masks and eager call (`fxlens.analyzer.capture.flex_masks`), and
Mamba-1's selective scan, Mamba-2's chunked scan and the chunked gated delta rules as the
kernels a GPU run calls (`fxlens.analyzer.capture.hf_selective_scan`, `hf_ssd`, `hf_gdn`), and
Llama 4's MoE layer as the routed experts a GPU run computes
(`fxlens.analyzer.capture.hf_llama4_moe`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fxlens.analyzer.capture.flex_masks import broadcast_block_masks
from fxlens.analyzer.capture.hf_gdn import fused_delta_rules
from fxlens.analyzer.capture.hf_llama4_moe import routed_llama4_experts
from fxlens.analyzer.capture.hf_masks import eager_mask_decisions
from fxlens.analyzer.capture.hf_paths import eager_code_paths
from fxlens.analyzer.capture.hf_selective_scan import fused_selective_scans
from fxlens.analyzer.capture.hf_ssd import fused_ssd_scans


@contextlib.contextmanager
def libraries_as_eager() -> Iterator[None]:
    with (eager_mask_decisions(), eager_code_paths(), broadcast_block_masks(),
          fused_selective_scans(), fused_ssd_scans(), fused_delta_rules(),
          routed_llama4_experts()):
        yield
