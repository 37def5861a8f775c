"""`LoadedModel`: what every loader (model file, preset) hands to capture.

Only the type lives here, so loaders and capture can share it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LoadedModel:
    """A module ready to trace, with the example inputs to trace it on.

    `inputs` is a tuple of positional arguments or a dict of keyword arguments. `name` is
    short and human (file stem or preset name); `source` says where the model came from.
    `calibration` is the model file's ``calibration()`` generator of input batches, if any.
    """

    module: torch.nn.Module
    inputs: tuple[Any, ...] | dict[str, Any]
    name: str
    source: str
    calibration: Callable[[], Iterable[Any]] | None = None
