"""The peer benchmark's model zoo: one list, loaded the same way in both environments.

Every entry is an fxlens target, so the fxlens CLI, the ground truth and every peer load the
same module and the same example inputs through `fxlens.analyzer.capture.load.load`:
  own      the test zoo's model files (`tests/models/*.py`), real seeded weights on CPU
  hf-zoo   the small `transformers` architectures of `tests/models/hf_zoo.py`, real weights
  preset   `hf:` presets built on the meta device (no weights) at a modest sequence length

This module imports nothing heavy at import time: the peers' environment imports it too, with
the repository root on ``sys.path`` (fxlens is never installed there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRESET_SEQ_LEN = 128
OWN = ("mlp", "convnet", "tiny_gpt", "lstm", "branchy", "dict_io")
HF_ZOO = ("gpt2", "bert", "t5", "llama", "mixtral", "whisper", "vit", "wav2vec2")
PRESETS = ("gpt2", "llama-2-7b", "llama-3-70b")


@dataclass(frozen=True)
class Case:
    name: str          # the row label
    kind: str          # "own", "hf-zoo" or "preset"
    target: str        # what `analyze` and `load` take
    seq_len: int | None = None

    @property
    def cli_args(self) -> list[str]:
        return [self.target, *(["--seq-len", str(self.seq_len)] if self.seq_len else [])]


CASES: tuple[Case, ...] = (
    *(Case(n, "own", f"tests/models/{n}.py") for n in OWN),
    *(Case(f"hf-{n}", "hf-zoo", f"tests.models.hf_zoo:build_{n}") for n in HF_ZOO),
    *(Case(f"hf:{n}", "preset", f"hf:{n}", PRESET_SEQ_LEN) for n in PRESETS),
)
BY_NAME = {case.name: case for case in CASES}


def load_case(name: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(module, positional args, keyword args) of the case `name`, as fxlens loads it."""
    from fxlens.analyzer.capture.load import load

    case = BY_NAME[name]
    loaded = load(case.target, sizes={"seq_len": case.seq_len})
    if isinstance(loaded.inputs, dict):
        return loaded.module, (), dict(loaded.inputs)
    return loaded.module, tuple(loaded.inputs), {}
