"""One view per section: typed section → `fxlens.reports.view.View`, in reading order.

`views(report, depth, top)` is what every surface renders: the model (summary, modules, top
ops), then each section the report holds. Adding a section's view: a function here taking the
section (and the report when it needs the module tree), and a line in `VIEWS`.
"""

from __future__ import annotations

from collections.abc import Callable

from fxlens.analyzer.core.report import Report
from fxlens.reports.view import Detail, View
from fxlens.reports.views.checkpoint import checkpoint_view
from fxlens.reports.views.fusion import fusion_view
from fxlens.reports.views.memory import kv_cache_view, memory_view, training_view
from fxlens.reports.views.model import modules_view, ops_view, summary_view
from fxlens.reports.views.plan import plan_view
from fxlens.reports.views.prune import prune_view
from fxlens.reports.views.quant import quant_view
from fxlens.reports.views.serve import serve_view
from fxlens.reports.views.time import roofline_view, validation_view

ViewFn = Callable[[Report, Detail], View | None]

VIEWS: tuple[ViewFn, ...] = (
    summary_view, modules_view, ops_view,
    memory_view, training_view, checkpoint_view, kv_cache_view,
    roofline_view, validation_view,
    fusion_view, quant_view, plan_view, prune_view, serve_view,
)
# Their keys, in the same order (what ``--show`` takes)
VIEW_KEYS = ("summary", "modules", "top-ops", "memory", "training", "checkpoint", "kv-cache",
             "roofline", "validation", "fusion", "quant", "plan", "prune", "serve")


# The section a run asked about, in the order one is picked for the first screen of every
# surface (after the summary): serving, a plan, quantization, the KV cache, a validation, selective
# checkpointing, the training step, the roofline; with none of them, where the FLOPs are
# (modules and top ops).
ASKED = ("serve", "plan", "prune", "quant", "kv-cache", "validation", "checkpoint", "training",
         "roofline")
PLAIN = ("modules", "top-ops")


def first_screen(keys: list[str]) -> tuple[str, ...]:
    """The views a first screen shows beside the summary (see `ASKED`)."""
    asked = next((key for key in ASKED if key in keys), None)
    return (asked,) if asked else PLAIN


def asked_first(keys: list[str]) -> list[str]:
    """`keys` with the one the run asked about (`ASKED`) right after the summary: the page
    and the comment open on the same answer as the terminal."""
    asked = next((key for key in ASKED if key in keys), None)
    if asked is None:
        return keys
    rest = [key for key in keys if key != asked]
    at = rest.index("summary") + 1 if "summary" in rest else 0
    return [*rest[:at], asked, *rest[at:]]


def views(report: Report, detail: Detail | None = None) -> list[View]:
    """Every view the report has something for, in reading order."""
    shown = detail or Detail()
    return [v for v in (make(report, shown) for make in VIEWS) if v is not None]
