"""Baseline for bench/core.py: PyTorch's FlopCounterMode on the same meta-device model.

    python bench/flop_counter_baseline.py hf:llama-2-7b --seq-len 2048 [--train]

Loads the target exactly as fxlens does, then runs one forward under FlopCounterMode on fake
tensors made from the meta-device model (as FlopCounterMode users do for models without
weights; plain meta tensors fail where `transformers` calls ``.item()`` outside tracing) and
prints the total FLOPs. No weights, no real compute. With ``--train``, the module in train
mode, then a backward from a gradient of ones on every output that requires grad, as
``analyze --train`` records its step: FLOPs of the forward and the backward.
"""

from __future__ import annotations

import argparse

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from fxlens.analyzer.capture.chain import plain_outputs
from fxlens.analyzer.capture.load import load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--train", action="store_true", help="forward and backward")
    args = parser.parse_args()
    loaded = load(args.target, sizes={"seq_len": args.seq_len, "batch": args.batch})
    call_args, kwargs = ((loaded.inputs, {}) if isinstance(loaded.inputs, tuple)
                         else ((), loaded.inputs))
    module = loaded.module
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
        state, call_args, kwargs = pytree.tree_map_only(
            torch.Tensor, fake_mode.from_tensor, (state, call_args, kwargs))
        if args.train:
            module.train()
            with FlopCounterMode(display=False) as counter:
                out = torch.func.functional_call(module, state, call_args, kwargs)
                leaves = [t for t in pytree.tree_leaves(plain_outputs(out))
                          if isinstance(t, torch.Tensor) and t.requires_grad]
                torch.autograd.backward(leaves, [torch.ones_like(t) for t in leaves])
        else:
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                torch.func.functional_call(module, state, call_args, kwargs)
    print(counter.get_total_flops())


if __name__ == "__main__":
    main()
