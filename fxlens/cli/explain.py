"""``analyze explain [CODE]``: what a rule finds, why it matters and how to fix it.

    analyze explain              every coded rule (FUS***, QNT***) with its one-line title
    analyze explain FUS002       one coded rule: code, family, its whole docstring, where defined
    analyze explain aten.mm      the cost rule of an op (packet or overload): docstring, family

The text shown is the rules' docstrings and nothing else, as ``ruff rule F401`` shows a rule's
page; rule packs' rules are listed with the built-in ones (`fxlens.rules.load_rules`).
Exit codes: 0 shown, 2 unknown code or op (one line on stderr).
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from rich.console import Console
from rich.text import Text

from fxlens.cli.args import Parser
from fxlens.cli.console import EXIT_ERROR, EXIT_OK, err, out
from fxlens.reports.escape import terminal_escape


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="analyze explain",
        description="Explain a fusion or quantization rule by code (FUS002, QNT001), or the "
                    "cost rule of an op (aten.mm); with no argument, list every code.",
    )
    parser.add_argument("code", nargs="?", help="a rule code (FUS002) or an op (aten.mm)")
    return parser


def run(args: argparse.Namespace) -> int:
    from fxlens.api import load_rules

    registry = load_rules()
    if args.code is None:
        _list(registry)
        return EXIT_OK
    rule = registry.coded.get(args.code.upper())
    if rule is not None:
        _coded(rule)
        return EXIT_OK
    key = _op_key(args.code)
    found = registry.find(key)
    if found is None:
        _say(f"error: unknown rule {args.code!r}: neither a rule code (`analyze explain` "
             "lists them) nor an op with a cost rule (aten.mm)", err)
        return EXIT_ERROR
    _op(key, found)
    return EXIT_OK


def _say(text: str, console: Console = out) -> None:
    """Docstrings are plain text: no rich markup ("[[conv, relu]]"), emoji codes or
    re-wrapping; a rule pack's docstring cannot drive the terminal either."""
    console.print(Text(terminal_escape(text, newlines=True)), soft_wrap=True)


def _list(registry: Any) -> None:
    width = max((len(r.code) for r in registry.coded), default=0)
    for rule in registry.coded:
        _say(f"{rule.code:<{width}}  {rule.family:<6}  {rule.title}")


def _coded(rule: Any) -> None:
    _say(f"{rule.code} · {rule.family} rule")
    _say(f"\n{rule.doc.text}\n")
    _say(f"defined at {rule.site}")


def _op(key: str, found: Any) -> None:
    if isinstance(found, str):
        _say(f"{key} · declared free (no FLOPs, no bytes moved)\n\n{found}")
        return
    doc = inspect.getdoc(found.rule) or "(no docstring)"
    _say(f"{key} · cost rule · family {found.family} ({found.module})")
    _say(f"\n{doc}\n")
    _say(f"defined at {found.site}")


def _op_key(text: str) -> str:
    """``torch.ops.aten.mm`` / ``mm`` / ``aten.mm`` → ``aten.mm`` (overloads kept)."""
    text = text.removeprefix("torch.ops.")
    return text if "." in text else f"aten.{text}"
