"""Escaping, one function per output format. Every string that comes from user code (module
paths and types, op names, source lines, model names) goes through one of these before it is
written into DOT, HTML, an inline ``<script>`` block or Markdown.

- `dot_escape`: the inside of a double-quoted DOT string. Graphviz also expands ``&name;``
  entities and ``\\N``-style escapes in labels, so ``&`` and ``\\`` are escaped as well.
- `html_escape`: HTML text and attribute values (quotes included).
- `json_script`: JSON placed inside ``<script type="application/json">``; every ``<`` (hence
  ``</script>`` and ``<!--``), ``>`` and ``&`` becomes a ``\\u`` escape, which `JSON.parse`
  reads back unchanged.
- `markdown_escape`: one table cell or inline text of GitHub-flavoured Markdown.
"""

from __future__ import annotations

import html
import json
from typing import Any

__all__ = ["dot_escape", "html_escape", "json_script", "markdown_escape"]


def dot_escape(text: str) -> str:
    """Text for a double-quoted DOT string: ``a"b\\c&d`` → ``a\\"b\\\\c&amp;d``."""
    return (str(text).replace("\\", "\\\\").replace("&", "&amp;").replace('"', '\\"')
            .replace("\r", "").replace("\n", "\\n"))


def html_escape(text: object) -> str:
    """Text for HTML content or a quoted attribute: ``<&>"'`` are escaped."""
    return html.escape(str(text), quote=True)


def json_script(data: Any) -> str:
    """`data` as JSON that is safe inside a ``<script type="application/json">`` element."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_MARKDOWN_SPECIAL = "\\`*_[]|~"  # enough for inline text; `.` and `-` only matter at a line start


def markdown_escape(text: object) -> str:
    """Inline Markdown text (a table cell): markup characters backslash-escaped, ``<``/``&``
    as entities so a PR comment never renders HTML from a module name, newlines as spaces."""
    out = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out = "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in out)
    return out.replace("\r", "").replace("\n", " ")
