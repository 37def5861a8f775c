"""A tiny model whose module names carry markup and quoting, for the escaping tests of every
report format: an HTML page must show them as text, never run them."""

from __future__ import annotations

import torch
from torch import nn

SCRIPT_NAME = "<script>alert(1)</script>"
QUOTE_NAME = 'q"uote&\\amp'


class Evil(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module(SCRIPT_NAME, nn.Linear(8, 8))
        self.add_module(QUOTE_NAME, nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = getattr(self, SCRIPT_NAME)(x)
        return getattr(self, QUOTE_NAME)(x)


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return Evil(), (torch.randn(2, 8),)
