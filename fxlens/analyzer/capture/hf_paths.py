"""`eager_code_paths()`: `transformers` model code takes the path its eager run takes, also while
we trace it.

Why: model files ask whether they are being exported or compiled
(``is_torchdynamo_exporting()``, ``is_torchdynamo_compiling()``) and then run another
algorithm. Qwen3-Next's gated DeltaNet reference (Qwen3.5, OLMo-hybrid alike; what runs
where `fxlens.analyzer.capture.hf_gdn`'s kernel op does not, a chunk continued from a cache's
state) solves its chunk's triangular system with ``torch.linalg.solve_triangular`` in eager,
but under ``torch.export`` inverts it by a loop of forward substitution and multiplies by the
inverse: two more batched GEMMs per chunk, +44 % of the layer's matmul FLOPs that the eager
run never performs. Encoder-
decoders (mBART, M2M-100, Switch) build an ``attention_mask`` of ones in eager and skip it
when compiling; Mamba-style scans switch to ``associative_scan`` when compiling but not
exporting.

While a model is captured (`fxlens.analyzer.capture.as_eager.libraries_as_eager`), both
questions answer False in every loaded ``transformers.models.*.modeling_*`` module that asks
them: the code a user's eager forward runs is the code we count. Nothing else is touched:
`transformers.masking_utils` keeps its own answers (its value-reading decisions are answered
as eager in `fxlens.analyzer.capture.hf_masks`), and a model file of the user's own is not a
library's. Where the eager path cannot be traced by one method (a data-dependent branch), the
capture chain's next method takes it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from fxlens.analyzer.capture.replaced import module_attributes

QUESTIONS = ("is_torchdynamo_exporting", "is_torchdynamo_compiling")
MODEL_MODULES = "transformers.models."


def _as_eager() -> bool:
    """Not exporting, not compiling: as the model's eager run answers."""
    return False


def _answers(module: ModuleType) -> dict[str, Any] | None:
    asked = {q: _as_eager for q in QUESTIONS if callable(getattr(module, q, None))}
    return asked or None


def model_modules() -> list[str]:
    """The loaded transformers model files (``transformers.models.<family>.modeling_*``)."""
    return [name for name in list(sys.modules)
            if name.startswith(MODEL_MODULES) and ".modeling_" in name]


@contextlib.contextmanager
def in_model_modules(replacements: Callable[[ModuleType], Mapping[str, Any] | None]
                     ) -> Iterator[None]:
    """For the duration, the attributes `replacements(module)` names in every loaded
    transformers model file hold its values (`module_attributes`)."""
    with contextlib.ExitStack() as stack:
        for name in model_modules():
            stack.enter_context(module_attributes(name, replacements))
        yield


def eager_code_paths() -> contextlib.AbstractContextManager[None]:
    return in_model_modules(_answers)
