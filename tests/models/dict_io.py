"""A two-tower model whose inputs and outputs are dicts of tensors.

Called with keyword arguments (``model(**inputs)``), it returns a dict, as many real models
do; it checks that loaders and capture pass keyword inputs and flatten dict outputs.
Legend: ``B`` batch, ``T`` tokens, ``F`` features, ``D`` embedding size.
"""

from __future__ import annotations

import torch
from torch import nn

SEED = 0


class DictIO(nn.Module):
    def __init__(self, vocab: int = 64, d_features: int = 12, d_embed: int = 16) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_embed)
        self.features = nn.Linear(d_features, d_embed)
        self.score = nn.Linear(d_embed, 1)

    def forward(
        self, token_ids: torch.Tensor, features: torch.Tensor, mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        # token_ids, mask: (B, T); features: (B, F)
        text = self.tokens(token_ids) * mask.unsqueeze(-1)          # (B, T, D)
        text = text.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)  # (B, D) masked mean
        other = torch.tanh(self.features(features))                  # (B, D)
        return {"score": self.score(text * other).squeeze(-1), "text_embedding": text}


def build(batch: int = 3, seq_len: int = 7) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model with seeded weights and a dict of keyword inputs."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = DictIO().eval()
        inputs = {
            "token_ids": torch.randint(0, 64, (batch, seq_len)),
            "features": torch.randn(batch, 12),
            "mask": (torch.rand(batch, seq_len) > 0.3).float(),
        }
    return model, inputs
