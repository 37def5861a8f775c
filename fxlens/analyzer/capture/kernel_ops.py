"""What the capture's kernel ops share: a `transformers` function that a GPU run hands to a
fused kernel library (`fxlens.analyzer.capture.hf_selective_scan`, `hf_ssd`, `hf_gdn`).

`LibraryFunction` names such a function (every model file of a family defines its own copy
under one name, decorated by `transformers`' kernel hub) and the file whose plain-PyTorch
reference the op's real runs call; `replacing` swaps the fused version in for the capture
(`fxlens.analyzer.capture.hf_paths.in_model_modules`), remembering what the first file held,
which a call the kernel path does not cover falls back to. `reference_gradients` is every
op's backward on real tensors: the reference's gradients.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch


class LibraryFunction:
    """The function `name` of `transformers`' model files; `reference_module` holds the copy
    the others repeat."""

    def __init__(self, name: str, reference_module: str) -> None:
        self.name = name
        self.reference_module = reference_module
        self._reference: Callable[..., Any] | None = None
        self._original: Callable[..., Any] | None = None

    def reference(self) -> Callable[..., Any]:
        """The plain-PyTorch function, unwrapped from the kernel hub's decorator."""
        if self._reference is None:
            function = getattr(importlib.import_module(self.reference_module), self.name)
            self._reference = getattr(function, "__wrapped__", function)
        return self._reference

    def original(self) -> Callable[..., Any]:
        """What a model file held before the capture replaced it (the kernel hub's wrapper,
        which raises where the reference cannot go, as a user's CPU run does)."""
        return self._original or self.reference()

    def replacing(self, module: ModuleType, fused: Callable[..., Any]
                  ) -> dict[str, Any] | None:
        """{name: fused} for a model file that defines the function, else None."""
        held = getattr(module, self.name, None)
        if not callable(held):
            return None
        if held is not fused:         # the first file replaced hands its functions on
            self._reference = self._reference or getattr(held, "__wrapped__", held)
            self._original = self._original or held
        return {self.name: fused}


def reference_gradients(function: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor],
                        grad: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of `function`'s inputs for an output gradient `grad`, each in its
    input's dtype."""
    with torch.enable_grad():
        pullback = torch.func.vjp(function, *inputs)[1]
        grads = pullback(grad)
    return [g.to(t.dtype) for g, t in zip(grads, inputs, strict=True)]
