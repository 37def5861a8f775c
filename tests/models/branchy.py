"""A model whose forward depends on tensor values: no tracer can capture it as one graph.

- A Python ``if`` on ``x.sum() > 0`` picks one of two branches.
- ``.item()`` turns a tensor into the number of times a refinement layer is applied.
- A hand-written top-k mixture of experts routes each token to its `top_k` experts with
  ``torch.where(mask)`` per expert, so every expert sees a data-dependent number of tokens.

``torch.export`` and ``make_fx`` on fake tensors both fail on it; the capture fallback that
records the eager run at dispatch level is what handles it. Legend: ``N`` tokens, ``C`` width,
``E`` experts, ``k`` experts per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SEED = 0


class TopKMoE(nn.Module):
    def __init__(self, width: int, num_experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(width, num_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.SiLU(), nn.Linear(2 * width, width))
            for _ in range(num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, C)
        probs = F.softmax(self.router(x), dim=-1)                      # (N, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)               # (N, k) each
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)                     # data-dependent length
            if token.numel() == 0:
                continue
            y = expert(x[token]) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y)
        return out


class Branchy(nn.Module):
    def __init__(self, width: int = 16, num_classes: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.refine = nn.Linear(width, width)
        self.moe = TopKMoE(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, C)
        h = self.inp(x)
        h = torch.relu(h) if h.sum() > 0 else torch.tanh(h)           # value-dependent branch
        steps = 1 + int(h.abs().mean().item() * 10) % 3                # value-dependent count
        for _ in range(steps):
            h = h + torch.tanh(self.refine(h))
        return self.head(h + self.moe(h))


def build(tokens: int = 12, width: int = 16) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """Branchy with seeded weights and one (tokens, width) input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Branchy(width).eval()
        x = torch.randn(tokens, width)
    return model, (x,)
