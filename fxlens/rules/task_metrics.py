"""What the numbers a model file's ``evaluate(model)`` returns mean: which way is better, and
how far quantization may move them before the task counts as changed.

A metric is lower-is-better when a word of its name (split at anything not a letter or digit)
names a loss or an error: ``val_loss``, ``perplexity``, ``WER``, ``top1_error``. Everything
else (accuracy, F1, BLEU, AUC) is higher-is-better.
"""

from __future__ import annotations

import re

LOWER_IS_BETTER_WORDS = frozenset({
    "loss", "nll", "perplexity", "ppl", "error", "err", "wer", "cer", "mse", "mae", "rmse",
    "bpc", "bpb", "distance", "latency",
})

# NB: the default tolerance is MLPerf Inference's: a quantized submission must reach 99 % of
# the reference model's accuracy (its "99 %" tier; 99.9 % is the strict one), so a metric may
# move by 1 % of its original value, in the worse direction, before the verdict changes.
TASK_TOLERANCE = 0.01


def lower_is_better(metric: str) -> bool:
    """Whether `metric` (a name ``evaluate()`` returned) improves as it falls."""
    return any(word in LOWER_IS_BETTER_WORDS
               for word in re.split(r"[^a-z0-9]+", metric.lower()) if word)
