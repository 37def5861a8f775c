"""Argument helpers shared by the subcommands: the parser class, choices, value types.

The choices of ``--method``, ``--precision`` and ``--optimizer`` are repeated here rather than
imported from the capture chain and the pipeline, so that building a parser (``--help``, a bad
option) never imports torch; `tests/cli/test_conventions.py` pins them to the engine's own.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

METHODS = ("export", "make_fx", "record")       # fxlens.analyzer.capture.chain.METHODS
PRECISIONS = ("fp32", "bf16", "amp-bf16", "amp-fp16", "fp8")      # fxlens.pipeline.PRECISIONS
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adafactor", "adam8bit")  # …OPTIMIZERS


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


def positive_int(text: str) -> int:
    """An integer ≥ 1 (sizes, counts): 0 or less is refused before any work starts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value
