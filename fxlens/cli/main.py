"""The `analyze` command: dispatch to a subcommand, one line per error, exit codes.

    analyze TARGET [options]          the analysis (`fxlens.cli.analyze`)
    analyze SUBCOMMAND ...            one of `SUBCOMMANDS`

Exit codes (`fxlens.cli.console`): 0 ok, 1 a check tripped (a gate, a failed sweep point),
2 bad input, 3 internal error.

Tables go to stdout, diagnostics and progress to stderr (`fxlens.cli.console`). Building the
parser imports neither torch nor the engine, so ``--help``, ``--version`` and a bad option
answer in a fraction of a second; the subcommand's `run` imports what it needs.

The handler is the one place that turns an exception into an exit code:
- errors fxlens raises on purpose (`FxlensError`): one line, exit 2;
- user code that ends the process (``sys.exit`` anywhere in a model file, ``os._exit`` —
  trapped while the command runs, see `fxlens.analyzer.capture.guard.trapped_exit` — or a
  `BaseException` of its own): one line saying so, exit 2, never 0 or 1;
- anything else is a bug in fxlens: one line and where to report it, exit 3; ``--debug``
  prints the traceback in every case.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from fxlens.analyzer.core.errors import FxlensError
from fxlens.cli.console import (
    BUG_REPORTS,
    EXIT_ERROR,
    EXIT_INTERNAL,
    err,
    error_line,
)

# name → module with build_parser() and run(args)
SUBCOMMANDS: dict[str, str] = {
    "diff": "fxlens.cli.diff",
    "validate": "fxlens.cli.validate",
    "calibrate": "fxlens.cli.calibrate",
    "explain": "fxlens.cli.explain",
    "sweep": "fxlens.cli.sweep",
}


def entry() -> NoReturn:
    """The ``analyze`` console script and ``python -m fxlens``: the process is ours, so it may
    fork (`fxlens.analyzer.core.beside`); `main`; then it exits without collecting the
    heap the run leaves (`fxlens.analyzer.core.heap.freeze_for_exit`). Callers that live on
    (tests, a sweep's worker) call `main`."""
    from fxlens.analyzer.core.beside import allow_forking
    from fxlens.analyzer.core.heap import freeze_for_exit

    allow_forking()
    code = main()
    freeze_for_exit()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        command = importlib.import_module(SUBCOMMANDS[name] if name else "fxlens.cli.analyze")
        parser = command.build_parser()
    except Exception as error:   # fxlens itself is broken: still one line and exit 3
        _internal(error, "--debug" in argv)
        return EXIT_INTERNAL
    args = parser.parse_args(argv[1:] if name else argv)   # exits 0 (--help) or 2 itself
    debug = bool(getattr(args, "debug", False))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not debug:
        # A failing capture method is expected and reported by us; torch's own warnings
        # about it (graph dumps, unbacked symbols) are noise.
        logging.getLogger("torch").setLevel(logging.ERROR)
    return _guarded(command.run, args, debug)


def _guarded(run: Any, args: Any, debug: bool) -> int:
    try:
        from fxlens.analyzer.capture.guard import trapped_exit

        with trapped_exit():
            return int(run(args))
    except FxlensError as error:
        _traceback(debug)
        error_line(error)
        return EXIT_ERROR
    except KeyboardInterrupt:
        error_line("interrupted")
        return EXIT_ERROR
    except Exception as error:
        _internal(error, debug)
        return EXIT_INTERNAL
    except BaseException as error:  # SystemExit, os._exit or a BaseException of user code
        from fxlens.analyzer.capture.guard import user_exit_message

        _traceback(debug)
        error_line(user_exit_message("the analysis", error))
        return EXIT_ERROR


def _internal(error: Exception, debug: bool) -> None:
    _traceback(debug)
    error_line(f"{type(error).__name__}: {error} — this is a bug in fxlens; {BUG_REPORTS}",
               label="internal error")


def _traceback(debug: bool) -> None:
    if debug:
        err.print_exception()


if __name__ == "__main__":
    entry()
