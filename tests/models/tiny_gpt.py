"""A GPT-shaped decoder written by hand, with its closed-form forward FLOPs.

Token + learned position embeddings; `n_layer` pre-norm blocks (LayerNorm → causal
self-attention through ``F.scaled_dot_product_attention(is_causal=True)`` → residual →
LayerNorm → MLP with GELU, 4× wide → residual); a final LayerNorm and an LM head tied to the
token embedding (no bias). Legend: ``B`` batch, ``T`` seq_len, ``C`` d_model, ``H`` heads,
``d`` head size, ``V`` vocab.

`closed_form_flops` is the analytic oracle: ``2·N·B·T`` for the N weights of every matmul
(12·C² per block plus the V·C head) and, per block, QKᵀ and A·V on the computed causal scores
(``B·H·T(T+1)/2`` of them, ``4·d`` FLOPs each), plus softmax at 8 FLOPs per score (max, sub,
exp 4, sum, div), following `fxlens.rules.conventions`. Bias adds, LayerNorm, GELU and
residual adds are left out of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

SEED = 0


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    seq_len: int = 16
    vocab: int = 128


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)                        # 3 × (B, T, C)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in (q, k, v))                                 # 3 × (B, H, T, d)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)    # (B, H, T, d)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))           # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        width = 4 * cfg.d_model
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, width), nn.GELU(), nn.Linear(width, cfg.d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx: (B, T) int64
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)                              # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)                 # (B, T, V), tied head


@dataclass(frozen=True)
class ClosedForm:
    """Forward FLOPs of TinyGPT by term (see the module docstring)."""

    linear_flops: int
    attention_flops: int
    softmax_flops: int

    @property
    def flops(self) -> int:
        return self.linear_flops + self.attention_flops + self.softmax_flops


def closed_form_flops(
    batch: int = 2, n_layer: int = 2, n_head: int = 4, d_model: int = 64, seq_len: int = 16,
    vocab: int = 128,
) -> ClosedForm:
    """The analytic oracle for ``build(batch, ...)`` with the same arguments."""
    tokens = batch * seq_len
    matmul_weights = n_layer * 12 * d_model**2 + vocab * d_model
    scores = n_layer * batch * n_head * seq_len * (seq_len + 1) // 2
    return ClosedForm(
        linear_flops=2 * matmul_weights * tokens,
        attention_flops=scores * 4 * (d_model // n_head),
        softmax_flops=scores * (1 + 1 + 4 + 1 + 1),  # max, sub, exp, sum, div
    )


def build(
    batch: int = 2, n_layer: int = 2, n_head: int = 4, d_model: int = 64, seq_len: int = 16,
    vocab: int = 128,
) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """TinyGPT with seeded weights and one (batch, seq_len) batch of token ids."""
    cfg = GPTConfig(n_layer, n_head, d_model, seq_len, vocab)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = TinyGPT(cfg).eval()
        idx = torch.randint(0, vocab, (batch, seq_len))
    return model, (idx,)
