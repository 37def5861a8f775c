"""Subcommands of `analyze` (``analyze diff``, ``analyze validate``, ``analyze calibrate``).

Each is a module with ``build_parser() -> argparse.ArgumentParser`` and
``run(args) -> int``, registered in `fxlens.cli.SUBCOMMANDS`. Like `fxlens.cli`, these are the
command-line layer: they may print (through `fxlens.cli.out` / `fxlens.cli.err`); library code
never does.
"""
