"""Building `transformers` models for the test zoos: seeded weights on CPU, no cache, eval
mode, the attention implementation asked for; seeded token and float inputs."""

from __future__ import annotations

from typing import Any

import torch

SEED = 0
BATCH = 2
SEQ_LEN = 12
VOCAB = 128

Built = tuple[torch.nn.Module, dict[str, torch.Tensor]]


def instantiate(model_cls: type, config: Any, attention: str | None = "sdpa"
                 ) -> torch.nn.Module:
    """`model_cls(config)` with seeded weights, `attention` (None: the architecture has none),
    no cache (sub-configs included), in eval mode."""
    if attention is not None:
        config._attn_implementation = attention
    for part in (config, *(getattr(config, k, None) for k in ("text_config", "vision_config"))):
        if part is not None and hasattr(part, "use_cache"):
            part.use_cache = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = model_cls(config)
    return model.eval()


def tokens(vocab: int = VOCAB, length: int = SEQ_LEN, seed: int = SEED + 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, length), generator=generator)


def floats(*shape: int, seed: int = SEED + 2) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
