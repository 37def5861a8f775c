"""Recurrent layers: a 2-layer batch-first LSTM, a bidirectional GRU and a Linear head.

Legend: ``B`` batch, ``T`` time steps, ``F`` input features, ``H`` hidden size. The head reads
the last time step of the GRU's output (both directions concatenated).
"""

from __future__ import annotations

import torch
from torch import nn

SEED = 0


class Recurrent(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, num_classes: int = 5) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, num_layers=2, batch_first=True)
        self.gru = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, F)
        x, _ = self.lstm(x)                                  # (B, T, H)
        x, _ = self.gru(x)                                   # (B, T, 2H)
        return self.head(x[:, -1])                           # (B, classes)


def build(
    batch: int = 2, seq_len: int = 8, d_in: int = 16, hidden: int = 32
) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The recurrent model with seeded weights and one (batch, seq_len, d_in) input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Recurrent(d_in, hidden).eval()
        x = torch.randn(batch, seq_len, d_in)
    return model, (x,)
