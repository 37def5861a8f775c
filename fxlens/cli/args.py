"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse


def key_value(item: str) -> tuple[str, str]:
    """``--set KEY=VALUE`` → (KEY, VALUE)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
    return key.strip(), value.strip()
