"""fxlens: a static model-graph analyzer for PyTorch.

Public API: `load`, `capture`, `analyze` (see `fxlens.api`)."""

__version__ = "0.1.0"
