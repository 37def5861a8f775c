"""The one console pair of the CLI (tables to stdout, diagnostics to stderr) and exit codes.

Only `fxlens.cli` prints; every subcommand prints through these two consoles.
"""

from __future__ import annotations

from rich.console import Console

EXIT_OK, EXIT_GATE, EXIT_ERROR = 0, 1, 2

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
