"""The engine: load, capture, graph, engine, memory, roofline, diff, validate.

No knowledge of any particular op lives here; that is `fxlens.rules`."""
