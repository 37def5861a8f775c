"""One sanitising function per output format: control characters, bidi overrides and lone
surrogates from user text are made visible, never emitted raw; each format's own escaping
still applies on top."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from fxlens.reports.escape import (
    _visible_strings,
    dot_escape,
    html_escape,
    json_script,
    markdown_escape,
    terminal_escape,
    visible,
)
from fxlens.reports.terminal import plain, render_table
from fxlens.reports.view import Column, Table

HOSTILE = ("a\x1b]0;title\x07b\x1b[2J\x1b]52;c;ZXZpbA==\x07\u202eevil\u2066\x00\x7f\x9b"
           "\u200b\ud800\u2028[bold]x[/]")
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069"
                 r"\ud800-\udfff]")


def test_visible_writes_python_escapes() -> None:
    assert visible("a\x1bb") == "a\\x1bb"
    assert visible("\u202e") == "\\u202e"
    assert visible("\U000e0041") == "\\U000e0041"          # a tag character: invisible text
    assert visible("plain, émoji ✓, 1 µs, a\u00a0b") == "plain, émoji ✓, 1 µs, a\u00a0b"
    assert visible("a\nb\tc") == "a\\x0ab\\x09c"
    assert visible("a\nb", keep="\n") == "a\nb"


@pytest.mark.parametrize("escape", [terminal_escape, dot_escape, html_escape, markdown_escape])
def test_no_format_emits_a_control_character(escape: object) -> None:
    out = escape(HOSTILE)  # type: ignore[operator]
    assert not RAW.search(out), repr(out)
    assert "x1b" in out and "u202e" in out
    out.encode("utf-8")     # no lone surrogate left: every writer can encode it


def test_terminal_keeps_newlines_only_where_asked() -> None:
    assert terminal_escape("a\nb") == "a\\x0ab"
    assert terminal_escape("a\nb", newlines=True) == "a\nb"


def test_dot_and_markdown_keep_their_own_escaping() -> None:
    assert dot_escape('a"b\\c&d\ne\x1b') == 'a\\"b\\\\c&amp;d\\ne\\\\x1b'
    assert markdown_escape("a|b\x1b") == "a\\|b\\\\x1b"
    assert html_escape("<a>\x1b") == "&lt;a&gt;\\x1b"


def test_json_script_sanitises_every_string_and_drops_non_finite_numbers() -> None:
    text = json_script({"k\x1b": ["v\u202e", float("nan"), 1.5], "</script>": 1})
    data = json.loads(text)
    assert data == {"k\\x1b": ["v\\u202e", None, 1.5], "</script>": 1}
    assert "<" not in text and "\x1b" not in text


@pytest.mark.parametrize("value", [
    "x\x1by", "cr\r", "bs\b", "ff\f", "del\x7f", "c1\x85", "\u2028", "\u202e", "\ud800",
    "back\\\\slash b", "line\nnext\ttab", "nbsp\u00a0", "ok <script>&", float("nan"),
    float("-inf"), ("tuple", 1.5), "ü and 漢字",
])
def test_json_script_takes_its_fast_path_only_where_nothing_changes(value: object) -> None:
    """A report without hidden characters skips the walk over every string; the text is
    the walk's, for each kind of character that the walk changes or keeps."""
    data = {"key": [value], f"k {value}" if isinstance(value, str) else "k": 1}
    walked = json.dumps(_visible_strings(data), sort_keys=True, separators=(",", ":"),
                        allow_nan=False, ensure_ascii=False)
    expected = walked.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    assert json_script(data) == expected


def test_terminal_tables_never_read_markup_or_drive_the_terminal() -> None:
    table = Table.of(f"title {HOSTILE}", [Column(f"col {HOSTILE}")], [[HOSTILE]],
                     caption=HOSTILE)
    console = Console(file=io.StringIO(), width=400, color_system=None)
    console.print(render_table(table))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert not RAW.search(out.replace("\n", "")), repr(out)
    assert "[bold]x[/]" in out
    assert plain("[/]\x1b").plain == "[/]\\x1b"
