"""A small GPT, written to be read: the model file format fxlens analyzes.

Run:  analyze examples/tiny_gpt.py            (or add --seq-len 512 --batch 8)

A model file defines ``build()`` returning ``(module, example_inputs)``; example_inputs is a
tuple of positional arguments (or a dict of keyword arguments). fxlens never needs the
weights' values, only their shapes, so any initialisation will do. If ``build`` declares
``batch`` or ``seq_len``, the command line's --batch and --seq-len are passed to it.

Shapes: B batch, T sequence length, C model width, H heads, V vocabulary.
"""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block: attention then MLP, each added back to the residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)  # queries, keys and values in one matmul
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=-1)
        # (B, T, C) -> (B, H, T, C/H): one attention per head
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        # One fused op; is_causal lets each token see only the ones before it, and fxlens
        # counts just those scores.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, max_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(max_len, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:    # ids: (B, T) token ids
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.blocks(self.tokens(ids) + self.positions(pos))  # (B, T, C)
        return self.norm(x) @ self.tokens.weight.T              # (B, T, V): tied LM head


def build(batch: int = 1, seq_len: int = 256) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """About 12.6M parameters: 6 layers of width 384 with 6 heads, a 4096-token vocabulary."""
    model = TinyGPT(vocab=4096, width=384, heads=6, layers=6, max_len=max(seq_len, 1024))
    ids = torch.randint(0, 4096, (batch, seq_len))
    return model.eval(), (ids,)
