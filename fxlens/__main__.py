from fxlens.cli.main import entry

entry()
