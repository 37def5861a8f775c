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
    `calibration` is the model file's ``calibration()`` generator of input batches, if any;
    `evaluate` its ``evaluate(model) -> {metric: value}``, the task's own metrics.
    `training_inputs` are the inputs of a training step where they differ from `inputs`: a
    causal language model's ``labels``, so the step computes the model's own loss.
    """

    module: torch.nn.Module
    inputs: tuple[Any, ...] | dict[str, Any]
    name: str
    source: str
    calibration: Callable[[], Iterable[Any]] | None = None
    evaluate: Callable[[torch.nn.Module], Any] | None = None
    training_inputs: tuple[Any, ...] | dict[str, Any] | None = None
    # The sizes (``batch``, ``seq_len``, ``image_size``) the loader builds the model at when
    # the command line gives them: a factory's parameters of those names, a preset's inputs.
    resizable: frozenset[str] = frozenset()

    @property
    def step_inputs(self) -> tuple[Any, ...] | dict[str, Any]:
        """What a training step is recorded on."""
        return self.training_inputs if self.training_inputs is not None else self.inputs
