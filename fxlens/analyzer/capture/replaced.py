"""`module_attributes`: attributes of a library module replaced while a model is captured
(`attributes`: of any object, a library's class among them).

The capture makes libraries decide as a GPU's eager run would where tracing would make them
decide otherwise (`fxlens.analyzer.capture.hf_masks`, `fxlens.analyzer.capture.flex_masks`).
Only a module already loaded is touched: a model that does not use it is not made to.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any


@contextlib.contextmanager
def module_attributes(name: str, replacements: Callable[[ModuleType], Mapping[str, Any] | None]
                      ) -> Iterator[None]:
    """For the duration, the attributes `replacements(module)` names in the loaded module
    `name` hold its values; nothing when the module is not loaded or it gives None."""
    module = sys.modules.get(name)
    new = replacements(module) if module is not None else None
    with attributes(module, new or {}):
        yield


@contextlib.contextmanager
def attributes(target: object, new: Mapping[str, Any]) -> Iterator[None]:
    """For the duration, `target`'s attributes named in `new` hold its values."""
    originals = {attribute: getattr(target, attribute) for attribute in new}
    for attribute, value in new.items():
        setattr(target, attribute, value)
    try:
        yield
    finally:
        for attribute, value in originals.items():
            setattr(target, attribute, value)
