"""Coded rules: rules with a stable code (``FUS001``, ``QNT002``) whose docstring is the only
text users are shown, and the definition sites every kind of rule names in its errors.

Part of the rule-facing API (with `fxlens.analyzer.core.costs` and the rooms' ``types``
modules). A family (fusion, quantization risk) registers its handlers here through its own
decorator (`fxlens.analyzer.fusion.types.fusion_rule`, `fxlens.analyzer.quant.types.risk_rule`);
this module owns what every family shares: the code, the parsed docstring, the definition site,
one code per rule across all families (a duplicate is refused naming both sites), and the order
a family's rules apply in (ascending ``priority``, then registration order).

A handler's docstring, as `inspect.cleandoc` leaves it::

    What it finds, on one line (the title).

    Why it matters: one or more paragraphs.

    Fix: how to fix it; may run over several lines, which are joined with single spaces.
    Fix (conv): an alternative fix a match can pick by naming its variant ("conv").

The ``Fix:`` lines close the docstring; a rule without a title or a plain ``Fix:`` line is
refused when it registers.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fxlens.analyzer.core.errors import DuplicateRuleError, RuleError

H = TypeVar("H", bound=Callable[..., Any])

CODE = re.compile(r"[A-Z]{2,8}\d{3,4}")
_FIX = re.compile(r"Fix(?: \(([\w-]+)\))?:\s*(.*)")


def definition_site(fn: Callable[..., Any]) -> str:
    """``file:line (qualname)`` of a function, for errors that name where a rule was defined."""
    try:
        file = inspect.getsourcefile(fn) or "?"
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))
    return f"{file}:{line} ({fn.__qualname__})"


def caller_module(depth: int = 1) -> str:
    """The module whose code called the function that calls this, `depth` frames up: the
    module that declares a rule, even from inside a helper function of that module."""
    return str(sys._getframe(depth + 1).f_globals.get("__name__", ""))


def duplicate(what: str, first_site: str, second_site: str) -> DuplicateRuleError:
    """The error for a key registered twice: ``{what}: {first site} and {second site}``."""
    return DuplicateRuleError(f"{what}: {first_site} and {second_site}")


@dataclass(frozen=True)
class RuleDoc:
    """A handler's docstring, parsed (see the module docstring)."""

    title: str                     # what it finds
    why: str                       # why it matters (paragraphs joined with single spaces)
    fixes: Mapping[str, str]       # variant ("" for the plain ``Fix:``) → how to fix it
    text: str                      # the whole docstring, cleaned, as `analyze explain` shows it

    @classmethod
    def parse(cls, doc: str | None) -> RuleDoc:
        text = inspect.cleandoc(doc or "")
        lines = text.splitlines()
        first_fix = next((i for i, line in enumerate(lines) if _FIX.match(line)), len(lines))
        paragraphs = [" ".join(p.split("\n")) for p in
                      "\n".join(lines[:first_fix]).strip().split("\n\n") if p.strip()]
        fixes: dict[str, list[str]] = {}
        variant = ""
        for line in lines[first_fix:]:
            found = _FIX.match(line)
            if found:
                variant = found.group(1) or ""
                fixes[variant] = [found.group(2)]
            elif line.strip():
                fixes[variant].append(line.strip())
        return cls(title=paragraphs[0] if paragraphs else "", why=" ".join(paragraphs[1:]),
                   fixes={k: " ".join(v) for k, v in fixes.items()}, text=text)

    def fix(self, variant: str = "") -> str:
        """The fix text of `variant` (the plain ``Fix:`` line for ""); a missing variant is a
        `RuleError` naming the ones there are."""
        try:
            return self.fixes[variant]
        except KeyError:
            raise RuleError(f"no 'Fix ({variant}):' line in the rule's docstring "
                            f"(has: {', '.join(map(repr, self.fixes)) or 'none'})") from None


@dataclass(frozen=True)
class CodedRule(Generic[H]):
    """One registered coded rule."""

    family: str                    # "fusion", "risk": which engine runs the handler
    code: str
    handler: H
    site: str                      # where the handler is defined (file:line (qualname))
    module: str                    # the module that registered it (rule packs are selected by it)
    doc: RuleDoc
    priority: int = 0              # lower applies first within the family

    @property
    def title(self) -> str:
        return self.doc.title


class CodedRules:
    """Every coded rule by code, across families; codes are unique across families so that a
    code alone names a rule (`analyze explain FUS002`)."""

    def __init__(self, rules: Iterable[CodedRule[Any]] = ()) -> None:
        self._by_code: dict[str, CodedRule[Any]] = {}
        for rule in rules:
            self.add(rule)

    def add(self, rule: CodedRule[Any]) -> None:
        """Register `rule`; a code taken (by any family), a malformed code or a docstring without
        a title or a ``Fix:`` line is a `RuleError` (a duplicate names both sites)."""
        if rule.code in self._by_code:
            raise duplicate(f"{rule.family} rule {rule.code} registered twice",
                            self._by_code[rule.code].site, rule.site)
        if not CODE.fullmatch(rule.code):
            raise RuleError(f"{rule.family} rule code {rule.code!r} ({rule.site}) is not "
                            "letters then digits, like FUS001")
        if not rule.doc.title or "" not in rule.doc.fixes:
            raise RuleError(f"{rule.family} rule {rule.code} ({rule.site}) needs a docstring "
                            "with a title line and a 'Fix:' line (fxlens.analyzer.core.coded)")
        self._by_code[rule.code] = rule

    def select(self, keep: Callable[[CodedRule[Any]], bool]) -> CodedRules:
        """A new set with the rules `keep` accepts, in registration order."""
        return CodedRules(r for r in self._by_code.values() if keep(r))

    def get(self, code: str) -> CodedRule[Any] | None:
        return self._by_code.get(code)

    def of(self, family: str) -> tuple[CodedRule[Any], ...]:
        """The rules of `family` in the order they apply: by priority, then as registered."""
        return tuple(sorted((r for r in self._by_code.values() if r.family == family),
                            key=lambda r: r.priority))

    def __iter__(self) -> Iterator[CodedRule[Any]]:
        """Every rule, by code."""
        return iter(sorted(self._by_code.values(), key=lambda r: r.code))

    def __len__(self) -> int:
        return len(self._by_code)


def coded_rule(family: str, code: str, handler: H, module: str, priority: int = 0
               ) -> CodedRule[H]:
    """A `CodedRule` for `handler`, its docstring parsed and its site found."""
    return CodedRule(family, code, handler, definition_site(handler), module,
                     RuleDoc.parse(handler.__doc__), priority)
