"""`check_target(target)`: what can be said about a target before torch is imported.

A missing model file, a folder, a JSON report given as a model or a target of no known form
is a `LoadError` in milliseconds (issue 15: bad input answers in under a second), from the CLI
before it imports torch, and from `fxlens.analyzer.capture.load.load` with the same words.
Known limitation: an unknown ``hf:`` preset or a factory that does not import is found only
when loading (both need the preset table or the import itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fxlens.analyzer.core.errors import LoadError


def check_target(target: str, overrides: Mapping[str, str] | None = None) -> None:
    """Raise the `LoadError` that loading `target` would raise for its form or its file."""
    if target.startswith("hf:"):
        return
    if overrides:
        raise LoadError("--set overrides config fields of hf: presets only")
    path = Path(target)
    if target.endswith(".py"):
        if not path.exists():
            raise LoadError(f"model file not found: {path}")
        if not path.is_file():
            raise LoadError(f"{path} is not a regular file (a folder, FIFO or device); "
                            f"expected a model .py file")
        return
    if path.exists():
        raise LoadError(not_a_model_file(path))
    if ":" not in target:
        raise LoadError(f"cannot load {target!r}: expected a .py file, 'pkg.module:function' "
                        f"or 'hf:<preset>'")


def not_a_model_file(path: Path) -> str:
    if path.is_dir():
        return (f"{path} is a folder; expected a model .py file, 'pkg.module:function' or "
                f"'hf:<preset>'")
    if path.suffix == ".json":
        return (f"{path} is a JSON file, not a model: analyze takes a model .py file; to "
                f"compare reports use `analyze diff OLD.json NEW.json`")
    if path.suffix in (".pt", ".pth"):
        return (f"{path} is a saved module, not a model file: analyze it from a .py file that "
                f"loads it, e.g. `model = torch.load({str(path)!r}, weights_only=False)` "
                f"and `example_inputs = (...)` (its classes importable, as for any pickle)")
    return (f"{path} is not a Python file (expected a model .py file, 'pkg.module:function' "
            f"or 'hf:<preset>')")
