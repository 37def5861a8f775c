"""The data-free Fisher: the diagonal Fisher (`fxlens.analyzer.quant.fisher`) on synthetic inputs
drawn like the model's example inputs, distilled from BatchNorm statistics where the model has
BatchNorms (ZeroQ). No data is read; the labels are sampled from the model's own output.

The output is read as the calibration's ``auto`` rule reads it (`fxlens.analyzer.quant.
calibrated`): logits of a linear head → KL, anything else → output SQNR.

A model that raises on the synthetic inputs (data-dependent shapes, inputs that must be
valid ids beyond the example's own values) is not an error: the section falls back to the
weights-only prior and says why (`SyntheticFisher.failure`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from fxlens.analyzer.quant.calibrated import Inputs, output_model
from fxlens.analyzer.quant.fisher import Fisher, diagonal_fisher, split_examples, synthetic_batches
from fxlens.analyzer.quant.types import QuantKnowledge
from fxlens.analyzer.quant.weights import Layer

log = logging.getLogger(__name__)

MAX_SYNTHETIC_EXAMPLES = 32
# NB: examples × parameters the data-free Fisher may spend (a backward each): 32 examples up to
# 30M parameters, down to 4 for a model of 250M and more; a data-free run stays in seconds.
SYNTHETIC_BUDGET = 10**9


@dataclass(frozen=True)
class SyntheticFisher:
    fisher: Fisher | None
    metric: str            # "kl" or "sqnr": the unit of the scores
    source: str            # how the inputs were made, in words
    failure: str = ""      # why there is no Fisher


def synthetic_fisher(module: nn.Module, layers: Sequence[Layer], example: Inputs,
                     knowledge: QuantKnowledge, score_format: str,
                     on_step: Callable[[str], None] = lambda _: None) -> SyntheticFisher:
    on_step("quantization: Fisher on synthetic inputs")
    try:
        batches, distilled = synthetic_batches(module, example, knowledge.batch_norm_types)
        metric, output = output_model(module, layers, batches[0], knowledge)
        params = sum(p.numel() for p in module.parameters())
        count = max(4, min(MAX_SYNTHETIC_EXAMPLES, SYNTHETIC_BUDGET // max(params, 1)))
        fisher = diagonal_fisher(module, layers, split_examples(batches, count), output,
                                 dict(knowledge.formats), score_format, on_step)
    except Exception as error:   # user code on inputs it never saw: recorded, never fatal
        log.debug("data-free Fisher failed", exc_info=True)
        return SyntheticFisher(None, "sqnr", "", (
            f"data-free Fisher skipped: the model raised {type(error).__name__} on synthetic "
            f"inputs ({str(error)[:120]}); data-free scores are the weights-only prior"))
    source = ("distilled from the BatchNorm running statistics (ZeroQ)" if distilled
              else "drawn like the example inputs (their mean and std; integer inputs "
                   "resampled from the example's own values)")
    if fisher.examples == 0:
        return SyntheticFisher(None, metric, source, "data-free Fisher skipped: no output "
                               "to sample labels from; data-free scores are the weights-only "
                               "prior")
    return SyntheticFisher(fisher, metric, source)
