"""Argument helpers shared by the subcommands: the parser class, choices, value types.

The choices of ``--method``, ``--precision``, ``--optimizer`` and ``--show`` are repeated here
rather than imported from the capture chain, the pipeline and the views, so that building a
parser (``--help``, a bad option) never imports torch; `tests/test_hostile.py` pins them to
the engine's own.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from fxlens.analyzer.core.graph import is_module_name

METHODS = ("export", "make_fx", "record")       # fxlens.analyzer.capture.chain.METHODS
PRECISIONS = ("fp32", "bf16", "amp-bf16", "amp-fp16", "autocast-bf16", "autocast-fp16",
              "fp8")                                          # fxlens.pipeline.PRECISIONS
SERVE_ONLY = ("w8a16", "w4a16", "fp8-dense")    # fxlens.rules.serving.SERVE_ONLY (--serve)
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adafactor", "adam8bit",   # …OPTIMIZERS
              "adamw-bf16")
LOSS_DTYPES = ("fp32", "logits")     # fxlens.rules.training.LOSS_DTYPES
ATTENTION_KERNELS = ("cudnn", "flash2")     # fxlens.rules.hardware.ATTENTION_KERNELS
LORA_BASES = ("nf4", "fp8")          # fxlens.checks.LORA_BASES
VIEWS = ("summary", "modules", "top-ops", "memory", "training", "checkpoint", "kv-cache",
         "roofline", "validation", "fusion", "quant", "plan", "prune",
         "serve")   # …reports.views.VIEW_KEYS


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line on stderr (no usage block), with the
    user's text made visible, and exit code 2."""

    def error(self, message: str) -> NoReturn:
        from fxlens.cli.console import EXIT_ERROR, error_line

        error_line(f"{self.prog}: {message} (see {self.prog} --help)")
        sys.exit(EXIT_ERROR)


def key_value(item: str) -> tuple[str, str]:
    """``--set KEY=VALUE`` → (KEY, VALUE)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
    return key.strip(), value.strip()


def _whole_number(text: str, minimum: int, rule: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{rule}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer ≥ 1 (sizes, counts): 0 or less is refused before any work starts."""
    return _whole_number(text, 1, "must be at least 1")


def non_negative_int(text: str) -> int:
    """An integer ≥ 0 (table depths and row counts)."""
    return _whole_number(text, 0, "must be 0 or more")


def count(text: str) -> int:
    """A count ≥ 1 written as an integer or in scientific notation (``1e12``, ``2.5e9``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number like 1e12, got {text!r}") from None
    if not 1 <= value < float("inf") or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {text!r}")
    return int(value)


def batch_sizes(text: str) -> tuple[int, ...]:
    """``8`` or ``1,8,32``: batch sizes ≥ 1, in the order given, without repeats."""
    sizes = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 8 or 1,8,32, got {text!r}")
    return tuple(dict.fromkeys(sizes))


def layer_names(text: str) -> tuple[str, ...]:
    """``q_proj,v_proj`` or ``mlp.down_proj``: module names (dotted Python identifiers), in
    the order given, no repeats."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    bad = next((name for name in names if not is_module_name(name)), None)
    if not names or bad is not None:
        raise argparse.ArgumentTypeError(
            f"expected layer names like q_proj,v_proj, got {bad or text!r}")
    return tuple(dict.fromkeys(names))


def seconds(text: str) -> float:
    """A time: ``50ms``, ``0.05s``, ``0.05`` (seconds), ``500us``; above 0."""
    units = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
    body = text.strip().lower()
    unit = next((u for u in ("us", "µs", "ms", "s") if body.endswith(u)), "")
    try:
        value = float(body.removesuffix(unit)) * units.get(unit, 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a time like 50ms, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a time above 0, got {text!r}")
    return value


def percent(text: str) -> float:
    """A share written in percent, ``1`` or ``1%``, as a fraction (0.01); 0 up to 100."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage like 1 or 0.5%, got {text!r}"
                                         ) from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, got {text!r}")
    return value / 100


def non_negative_float(text: str) -> float:
    """A finite number ≥ 0 (prices)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number ≥ 0, got {text!r}")
    return value


def add_loading_options(parser: Any, overrides: bool = True, batch_list: bool = False) -> None:
    """How a model target is loaded: ``--entry``, ``--set`` (with `overrides`), ``--batch``,
    ``--seq-len``, ``--image-size`` — one spelling for every subcommand that loads a model.
    `batch_list`: ``--batch`` takes ``1,8,32`` too (a tuple; ``analyze --serve``'s curve)."""
    parser.add_argument("--entry", help="factory function in the model file (default: build)")
    if overrides:
        parser.add_argument("--set", dest="overrides", action="append", default=[],
                            type=key_value, metavar="KEY=VALUE",
                            help="override a config field of an hf: preset")
    if batch_list:
        parser.add_argument("--batch", type=batch_sizes, metavar="N[,N…]",
                            help="batch size of the example inputs; with --serve, the batches "
                                 "to estimate (1,8,32,64)")
    else:
        parser.add_argument("--batch", type=positive_int,
                            help="batch size of the example inputs")
    parser.add_argument("--seq-len", type=positive_int,
                        help="sequence length of the example inputs")
    parser.add_argument("--image-size", type=positive_int,
                        help="image side of the example inputs")
