"""Escaping and sanitising, one function per output format. Every string that comes from user
code or from a report file (module paths and types, op names, source lines, model names,
report keys, exception texts) goes through one of these before it is written to a terminal,
DOT, SVG (through DOT), HTML, an inline ``<script>`` block or Markdown.

All of them first make invisible and control characters *visible* (`visible`): C0/C1 control
characters (ESC, BEL, CR, backspace…), DEL, Unicode format characters (bidi overrides and
isolates, zero-width characters), line and paragraph separators and lone surrogates become
their Python escape (``\\x1b``, ``\\u202e``), so a crafted name can neither drive a terminal
(clear the screen, set the title, write the clipboard with OSC 52, colour a fake verdict),
reorder what a reader sees, nor make graph.svg ill-formed XML. ``\\n`` and ``\\t`` are kept
where the format has a meaning for them, and each format says which.

- `terminal_escape`: text for a terminal; the CLI wraps it in `rich.text.Text`, never in a
  markup string, so ``[bold]`` or ``[/]`` in user text print as themselves.
- `dot_escape`: the inside of a double-quoted DOT string. Graphviz also expands ``&name;``
  entities and ``\\N``-style escapes in labels, so ``&`` and ``\\`` are escaped as well.
- `html_escape`: HTML text and attribute values (quotes included).
- `json_script`: JSON placed inside ``<script type="application/json">``; every string is made
  visible, every ``<`` (hence ``</script>`` and ``<!--``), ``>`` and ``&`` becomes a ``\\u``
  escape, which `JSON.parse` reads back unchanged.
- `markdown_escape`: one table cell or inline text of GitHub-flavoured Markdown.

NB: a name that already holds the four characters ``\\x1b`` reads the same as one holding ESC;
the point is that the byte never reaches the output, not a reversible encoding.
"""

from __future__ import annotations

import html
import json
import math
import re
import unicodedata
from typing import Any

__all__ = ["dot_escape", "html_escape", "json_script", "markdown_escape", "terminal_escape",
           "visible"]

# Invisible or terminal-driving: control, format (bidi, zero-width), surrogate, separators.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def visible(text: object, keep: str = "") -> str:
    """`text` with every control, format, surrogate and separator character (except those in
    `keep`) written as its Python escape: ESC → ``\\x1b``, RLO → ``\\u202e``."""
    text = str(text)
    if text.isprintable():      # the fast path: no character to look at
        return text
    return "".join(ch if ch in keep or ch.isprintable()
                   or unicodedata.category(ch) not in _HIDDEN_CATEGORIES else _escaped(ch)
                   for ch in text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal_escape(text: object, newlines: bool = False) -> str:
    """Text for a terminal: nothing that drives it. `newlines`: keep ``\\n`` (a multi-line
    table cell); otherwise it shows as ``\\n``, so an error or note stays one line."""
    return visible(text, "\n" if newlines else "")


def dot_escape(text: object) -> str:
    """Text for a double-quoted DOT string: ``a"b\\c&d`` → ``a\\"b\\\\c&amp;d``."""
    return (visible(text, "\n").replace("\\", "\\\\").replace("&", "&amp;")
            .replace('"', '\\"').replace("\n", "\\n"))


def html_escape(text: object) -> str:
    """Text for HTML content or a quoted attribute: ``<&>"'`` are escaped."""
    return html.escape(visible(text, "\n\t"), quote=True)


def json_script(data: Any) -> str:
    """`data` as JSON that is safe inside a ``<script type="application/json">`` element.

    One C-speed dump, scanned for anything `visible` would change; only a report holding
    such a string (or a non-finite number) pays the Python walk over its every string.
    Characters outside ASCII stay as they are: the page is UTF-8."""
    text = _dumps(data)
    if text is None or not text.isprintable() or _CONTROL_IN_JSON.search(text):
        text = _dumps(_visible_strings(data))
        assert text is not None, "the walk leaves no non-finite number"
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _dumps(data: Any) -> str | None:
    """`data` as compact JSON with sorted keys; None if it holds a non-finite number."""
    try:
        return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False,
                          ensure_ascii=False)
    except ValueError:
        return None


# What json.dumps writes for a control character `visible` would change (\n and \t are kept);
# an escaped backslash before b, f or r matches too, which only costs the slow path.
_CONTROL_IN_JSON = re.compile(r"\\(?:u00[01][0-9a-fA-F]|u007[fF]|[bfr])")


def _visible_strings(data: Any) -> Any:
    """Every string (keys too) of a JSON-like value made `visible`; a non-finite float, which
    `JSON.parse` cannot read, as null; the rest as it is."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, str):
        return visible(data, "\n\t")
    if isinstance(data, dict):
        return {(visible(k, "\n\t") if isinstance(k, str) else k): _visible_strings(v)
                for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_visible_strings(v) for v in data]
    return data


_MARKDOWN_SPECIAL = "\\`*_[]|~"  # enough for inline text; `.` and `-` only matter at a line start


def markdown_escape(text: object) -> str:
    """Inline Markdown text (a table cell): markup characters backslash-escaped, ``<``/``&``
    as entities so a PR comment never renders HTML from a module name, newlines as spaces."""
    out = visible(text, "\n").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out = "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in out)
    return out.replace("\n", " ")
