"""The command line: the only package that prints.

`main` dispatches (`fxlens.cli.main`); one module per subcommand (`analyze`, `diff`,
`validate`, `calibrate`, `explain`), each with ``build_parser()`` and ``run(args) -> int``;
`console` holds the two consoles and the exit codes, `args` the shared argument helpers.
"""
