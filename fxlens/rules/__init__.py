"""All op knowledge: cost formulas by op family, one small module per family.

`load_rules()` imports every family (their decorators fill the default registry) and any
third-party rule pack registered under the ``fxlens.rules`` entry-point group.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

from fxlens.analyzer.core.costs import REGISTRY, CostRegistry

log = logging.getLogger(__name__)

FAMILIES = (
    "views", "matmul", "conv", "attention", "rnn", "pointwise", "reduction", "norm",
    "indexing", "pooling", "data_movement",
)

_loaded = False


def load_rules() -> CostRegistry:
    """The default registry with every built-in family and installed rule pack loaded."""
    global _loaded
    if not _loaded:
        for family in FAMILIES:
            importlib.import_module(f"fxlens.rules.{family}")
        for ep in entry_points(group="fxlens.rules"):
            log.info("loading rule pack %s", ep.value)
            ep.load()
        _loaded = True
    return REGISTRY
