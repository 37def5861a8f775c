"""The one console pair of the CLI (tables to stdout, diagnostics to stderr) and exit codes.

Only `fxlens.cli` prints; every subcommand prints through these two consoles. Neither console
interprets Rich markup or emoji codes: user text (a module name, an exception message, a path)
holding ``[link=…]`` or ``[/]`` prints as itself. Messages go through `say`, `note` and
`error_line`, which also make control characters visible (`terminal_escape`), so an
exception text cannot drive the terminal, and keep each message on one line.

Exit codes — CI reads them, so each means one thing:

    0  ok
    1  a check tripped: a gate (``--fail-on``), or a point of ``analyze sweep`` that failed
       (its row says why); nothing else exits 1
    2  bad input: the model, a report, an option, a path (one line on stderr)
    3  internal error: a bug in fxlens (one line and where to report it; ``--debug`` shows
       the traceback)

A reader that stops reading (``analyze model.py | head``, a pager quit early) closes the pipe:
from then on that stream is silent, the run goes on and exits with its own code, so a gate
piped into ``head`` still fails the job, and nothing is reported as an error. (Rich's own
console raises ``SystemExit(1)`` there, which would read as "a check tripped".)
"""

from __future__ import annotations

import os
import sys
from typing import IO

from rich.console import Console
from rich.text import Text

from fxlens.reports.escape import terminal_escape

EXIT_OK, EXIT_GATE, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 3

BUG_REPORTS = ("please report it to the fxlens maintainers with the command and the output of "
               "the same command under --debug")


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader closed this console's pipe: this stream is silent from now on."""
        self.quiet = True
        _silence(self.file)


def _silence(stream: IO[str]) -> None:
    """Point `stream` at the null device, so that what is still buffered for a closed pipe,
    and everything written later, goes nowhere (the interpreter's last flush included)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):   # not a file (a test's capture): nothing to redirect
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def write_raw(text: str) -> None:
    """`text` as it is on stdout (a report's JSON), silent once the reader closed the pipe."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _silence(sys.stdout)


out = _Console(highlight=False, markup=False, emoji=False)
err = _Console(stderr=True, highlight=False, markup=False, emoji=False)


def one_line(text: object) -> str:
    """`text` on one line (line breaks, CR included, as spaces: a message cannot start a fake
    line of its own in a CI log), nothing in it that drives the terminal."""
    return terminal_escape(" ".join(str(text).splitlines()))


def say(text: object, console: Console = err, style: str = "") -> None:
    """One line of text, never markup, nothing that drives the terminal."""
    console.print(Text(one_line(text), style=style), soft_wrap=True)


def note(text: object) -> None:
    err.print(Text.assemble(("note: ", "yellow"), one_line(text)), soft_wrap=True)


def error_line(text: object, label: str = "error") -> None:
    err.print(Text.assemble((f"{label}: ", "bold red"), one_line(text)), soft_wrap=True)
