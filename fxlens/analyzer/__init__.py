"""The engine, in rooms by concern: core/, capture/, cost/, memory/, time/, fusion/, quant/,
review/. No knowledge of any particular op lives here; that is `fxlens.rules`.
See docs/architecture.md."""
