"""The `analyze` command: dispatch to a subcommand, one line per error, exit codes.

    analyze TARGET [options]          the analysis (`fxlens.cli.analyze`)
    analyze SUBCOMMAND ...            one of `SUBCOMMANDS`

Exit codes: 0 ok, 1 a gate tripped, 2 could not run.

Tables go to stdout, diagnostics and progress to stderr (`fxlens.cli.console`). Errors fxlens
raises on purpose get one line and exit code 2; `--debug` shows the traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence

from fxlens.analyzer.core.errors import FxlensError
from fxlens.cli.console import EXIT_ERROR, err

# name → module with build_parser() and run(args); see fxlens/commands/__init__.py
SUBCOMMANDS: dict[str, str] = {
    "diff": "fxlens.cli.diff",
    "validate": "fxlens.cli.validate",
    "calibrate": "fxlens.cli.calibrate",
    "explain": "fxlens.cli.explain",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        command = importlib.import_module(SUBCOMMANDS[argv[0]])
        parser, run = command.build_parser(), command.run
        argv = argv[1:]
    else:
        command = importlib.import_module("fxlens.cli.analyze")
        parser, run = command.build_parser(), command.run
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not debug:
        # A failing capture method is expected and reported by us; torch's own warnings
        # about it (graph dumps, unbacked symbols) are noise.
        logging.getLogger("torch").setLevel(logging.ERROR)
    try:
        return int(run(args))
    except FxlensError as error:
        if getattr(args, "debug", False):
            err.print_exception()
        err.print(f"[bold red]error:[/] {error}", markup=True, highlight=False, soft_wrap=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        err.print("interrupted")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
