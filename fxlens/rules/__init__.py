"""All op knowledge: cost formulas by op family, one small module per family, and the coded
fusion and quantization-risk rules.

`load_rules()` is the registry every analysis uses: the built-in families plus every
third-party rule pack installed under the ``fxlens.rules`` entry-point group. It is built once
per process (cached) and frozen; to add rules for one run, extend ``load_rules().copy()``.

How rules get in (one mechanism for built-ins and packs alike): the public decorators
(``@cost_rule``, ``@alias_rule``, `declare_free`, ``@fusion_rule``, ``@risk_rule``) only
*declare* a rule, into the pending list `fxlens.analyzer.core.costs.DECLARED`, tagged with the
module that declared it; `build_rules` imports the modules and copies the declarations of
``fxlens.rules`` and of each pack into a fresh registry. A pack is the module its entry point
names (``my_pack = "my_pack.rules"``): its rules are those declared by that module and its
submodules, with the same decorators and the same refusal of duplicates (a pack cannot
replace a built-in rule; it registers ops and codes of its own). Nothing a pack declares
reaches a registry built without it, and no registry anyone holds changes when a pack loads.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Iterable
from importlib.metadata import entry_points

from fxlens.analyzer.core.costs import DECLARED, CostRegistry
from fxlens.analyzer.core.errors import RuleError

log = logging.getLogger(__name__)

FAMILIES = (
    "views", "matmul", "conv", "attention", "flex_attention", "rnn", "pointwise", "reduction",
    "norm", "indexing", "pooling", "data_movement", "fft", "linalg", "selective_scan", "ssd",
    "gdn", "nf4",
)
CODED = ("fusion", "attention_findings", "quant")   # the coded rules (FUS***, QNT***)


def build_rules(packs: Iterable[str] = ()) -> CostRegistry:
    """A new registry: the built-in families plus the rules declared by the pack modules
    `packs` (imported here) and their submodules."""
    for name in (*FAMILIES, *CODED):
        importlib.import_module(f"fxlens.rules.{name}")
    roots = (__name__, *packs)
    for pack in packs:
        importlib.import_module(pack)
    return DECLARED.select(lambda module: any(module == root or module.startswith(root + ".")
                                              for root in roots))


@functools.cache
def load_rules() -> CostRegistry:
    """The built-in families and every installed rule pack, built once and frozen."""
    packs = []
    for ep in entry_points(group="fxlens.rules"):
        log.info("loading rule pack %s", ep.value)
        try:
            ep.load()
        except ImportError as error:
            raise RuleError(f"rule pack {ep.name} ({ep.value}) failed to import: {error}; "
                            "uninstall it or fix its dependencies") from error
        packs.append(ep.module)
    return build_rules(packs).freeze()
