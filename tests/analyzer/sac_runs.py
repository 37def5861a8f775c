"""Real CPU runs of a training step under a selective-checkpointing policy, for
`tests/analyzer/test_checkpoint.py`: the policy is the code the report emits, executed as a user
would paste it; the storages are followed by `fxlens.analyzer.memory.measure.StorageTracker`.

`measured_step(module, inputs, code)`: one warm-up step (the optimizer state made), then a
steady step followed storage by storage: its peak of new storages plus what existed before it
(weights, buffers, optimizer state), which is what the report's step peak counts. With
``optimizer="sgd0"`` the step is SGD at learning rate 0 (no state, no temporaries): its peak is
the forward/backward's, gradients included. The backward's seeds (a gradient of ones on each
output, what a loss's backward would make) are made inside the step and freed once used, as
the capture records them (`_OnesSeed`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from fxlens.analyzer.memory.measure import StorageTracker, _split, _state, _tensors


@dataclass(frozen=True)
class Measured:
    new_peak_bytes: int        # new storages at the step's peak (activations, gradients, temps)
    state_bytes: int           # weights, buffers and optimizer state, there before the step

    @property
    def step_peak_bytes(self) -> int:
        return self.new_peak_bytes + self.state_bytes


class _OnesSeed(torch.autograd.Function):
    """A stand-in loss whose gradient is ones on every output, made in the backward and freed
    once used, as the capture's ``ones_like`` seeds are (a real loss's backward makes its
    logits-sized gradient there too); the outputs themselves are not kept by it."""

    @staticmethod
    def forward(ctx: Any, *outputs: torch.Tensor) -> torch.Tensor:
        ctx.specs = [(o.shape, o.dtype) for o in outputs]
        return outputs[0].new_zeros(())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.ones(shape, dtype=dtype) for shape, dtype in ctx.specs)


def apply_policy(module: torch.nn.Module, code: str) -> None:
    """Run the report's policy code on `module` (bound as ``model``), as a user would."""
    if code:
        exec(compile(code, "<fxlens policy>", "exec"), {"model": module})   # noqa: S102


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def measured_step(module: torch.nn.Module, inputs: Any, code: str, optimizer: str = "adamw"
                  ) -> Measured:
    model = copy.deepcopy(module).train()
    apply_policy(model, code)
    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer = (torch.optim.AdamW(params, foreach=False)
                                  if optimizer == "adamw" else torch.optim.SGD(params, lr=0.0))
    args, kwargs = _split(inputs)
    for _ in range(2):      # a warm-up step makes the optimizer state; then the steady one
        for p in params:
            p.grad = None
        tracker = StorageTracker(_state(model, (args, kwargs))
                                 + [s for st in opt.state.values() for s in st.values()
                                    if isinstance(s, torch.Tensor)])
        with torch.enable_grad(), tracker:
            out = model(*args, **kwargs)
            roots = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
            _OnesSeed.apply(*roots).backward()
            opt.step()
        del out, roots
    state = [*model.parameters(), *model.buffers(),
             *(s for st in opt.state.values() for s in st.values()
               if isinstance(s, torch.Tensor) and s.dim())]
    return Measured(tracker.peak_bytes, _storage_bytes(state))
