"""How a training step is laid out over GPUs: one `Strategy`, parsed from the text users type.

Degrees: ``dp`` data parallel, ``tp`` tensor parallel (Megatron column/row split), ``pp``
pipeline stages, ``ep`` expert parallel (carved out of ``dp``, as in Megatron-LM and
DeepSpeed-MoE: the experts are sharded over ``ep`` GPUs of each data-parallel group). GPUs =
dp · tp · pp. ``zero`` is the ZeRO stage (0: DDP; 3: FSDP full shard); ``hybrid`` shards ZeRO-3
inside a node and replicates across nodes (FSDP's HYBRID_SHARD); ``sp`` sequence parallel
(with tp); ``ckpt`` activation checkpointing of every repeated block; ``offload`` keeps the
optimizer state and master weights in host memory; ``v`` virtual stages per GPU (interleaved
1F1B); ``micro_batches`` per step per data-parallel rank (gradient accumulation when pp = 1).

Text: comma-separated names and ``key=value`` pairs, e.g. ``fsdp``, ``ddp``, ``zero2``,
``hsdp``, ``dp=2,tp=4,pp=2,zero=1,sp``, ``tp=8,pp=4,v=2,ckpt``. A ``dp`` left out is filled
from the GPU count, which must then be given. No torch here: the CLI checks the text before
loading anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

NAMED: dict[str, dict[str, int | bool]] = {
    "ddp": {"zero": 0}, "zero1": {"zero": 1}, "zero2": {"zero": 2}, "zero3": {"zero": 3},
    "fsdp": {"zero": 3}, "hsdp": {"zero": 3, "hybrid": True},
    "fsdp-hybrid": {"zero": 3, "hybrid": True}, "sp": {"sp": True}, "ckpt": {"checkpoint": True},
    "offload": {"offload": True},
}
DEGREES = ("dp", "tp", "pp", "ep", "zero", "v")


@dataclass(frozen=True)
class Strategy:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    zero: int = 0
    hybrid: bool = False
    sp: bool = False
    checkpoint: bool = False
    offload: bool = False
    v: int = 1
    micro_batches: int = 1

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def label(self) -> str:
        """The strategy as text `parse` reads back (degrees of 1 left out, dp always shown)."""
        parts = [f"dp={self.dp}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "ep", "v")
                  if getattr(self, k) > 1]
        if self.zero:
            parts.append("hsdp" if self.hybrid else f"zero={self.zero}")
        parts += [name for name, on in (("sp", self.sp), ("ckpt", self.checkpoint),
                                        ("offload", self.offload)) if on]
        return ",".join(parts)

    def problems(self) -> list[str]:
        """Why this combination is not a layout (empty when it is one)."""
        found = []
        if self.zero not in (0, 1, 2, 3):
            found.append(f"zero={self.zero}: ZeRO stages are 0 (DDP), 1, 2 and 3")
        if self.hybrid and self.zero != 3:
            found.append("hybrid sharding is a ZeRO-3/FSDP layout")
        if self.sp and self.tp == 1:
            found.append("sequence parallel splits along tp: it needs tp > 1")
        if self.dp % self.ep:
            found.append(f"ep={self.ep} must divide dp={self.dp} (experts are sharded inside "
                         f"each data-parallel group)")
        if self.v > 1 and self.pp == 1:
            found.append("interleaved stages (v > 1) need pp > 1")
        if self.micro_batches < 1:
            found.append("micro-batches must be ≥ 1")
        return found


def parse(text: str, gpus: int | None = None, micro_batches: int = 1) -> Strategy:
    """`text` as a `Strategy`; a missing ``dp`` is ``gpus / (tp · pp)``. ValueError on
    anything it cannot read, naming the part."""
    values: dict[str, Any] = {}
    for raw in text.split(","):
        part = raw.strip().lower()
        if not part:
            continue
        if "=" in part:
            key, _, number = part.partition("=")
            key = key.strip()
            if key not in DEGREES:
                raise ValueError(f"unknown degree {key!r} in {text!r}; known: "
                                 f"{', '.join(DEGREES)}")
            try:
                values[key] = int(number)
            except ValueError:
                raise ValueError(f"{key}={number!r}: a whole number is needed") from None
            if values[key] < (0 if key == "zero" else 1):
                raise ValueError(f"{part}: degrees are ≥ 1 (zero ≥ 0)")
        elif part in NAMED:
            values.update(NAMED[part])
        else:
            raise ValueError(f"unknown strategy {part!r} in {text!r}; known names: "
                             f"{', '.join(NAMED)}, or degrees like dp=2,tp=4,pp=2,zero=1")
    strategy = replace(Strategy(micro_batches=micro_batches), **values)
    if "dp" not in values:
        if gpus is None:
            raise ValueError(f"{text!r} does not say how many GPUs: add --gpus N, or dp=N")
        inner = strategy.tp * strategy.pp
        if gpus % inner:
            raise ValueError(f"--gpus {gpus} is not a multiple of tp·pp = {inner}")
        strategy = replace(strategy, dp=gpus // inner)
    elif gpus is not None and strategy.gpus != gpus:
        raise ValueError(f"{text!r} uses dp·tp·pp = {strategy.gpus} GPUs, not --gpus {gpus}")
    problems = strategy.problems()
    if problems:
        raise ValueError(f"{text!r}: {'; '.join(problems)}")
    return strategy
