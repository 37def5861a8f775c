"""Baseline for bench/core.py: PyTorch's FlopCounterMode on the same meta-device model.

    python bench/flop_counter_baseline.py hf:llama-2-7b --seq-len 2048

Loads the target exactly as fxlens does, then runs one forward under FlopCounterMode and
prints the total FLOPs. Meta tensors: no weights, no real compute.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.flop_counter import FlopCounterMode

from fxlens.analyzer.load import load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--batch", type=int)
    args = parser.parse_args()
    loaded = load(args.target, sizes={"seq_len": args.seq_len, "batch": args.batch})
    call_args, kwargs = ((loaded.inputs, {}) if isinstance(loaded.inputs, tuple)
                         else ((), loaded.inputs))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        loaded.module(*call_args, **kwargs)
    print(counter.get_total_flops())


if __name__ == "__main__":
    main()
