"""A three-layer MLP: Linear → ReLU → Linear → GELU → Linear. Legend: ``B`` batch, ``F`` features.

The smallest model in the zoo: every op has a closed-form cost (three GEMMs with bias, two
pointwise activations).
"""

from __future__ import annotations

import torch
from torch import nn

SEED = 0


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, d_hidden: int = 64, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.act2 = nn.GELU()
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, F)
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


def build(
    batch: int = 4, d_in: int = 32, d_hidden: int = 64, d_out: int = 10
) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The MLP with seeded weights and one (batch, d_in) input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = MLP(d_in, d_hidden, d_out).eval()
        x = torch.randn(batch, d_in)
    return model, (x,)
