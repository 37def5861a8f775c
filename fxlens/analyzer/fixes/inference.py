"""Whether an inference forward fits its device, and the change that makes it fit.

What the forward needs is the weights (and buffers), its activation peak (the eager one a
user running PyTorch sees, `Memory.activation_peak_bytes`) and, with ``--kv-cache``, the
cache of the whole batch. When that is over the device:

- the batch is the lever the command line can apply (``--batch N``, where the model is built
  at a batch: `ModelInfo.resizable`): activations and cache are taken as linear in the batch
  (each sequence its own), the weights as fixed, and the largest batch under the device is
  offered with what it needs;
- where the weights alone are over the device no batch fits, and the verdict says so instead
  of offering one (quantizing or sharding the weights: `--quant-plan` checks the first);
- with a KV cache, the decode step (weights + the whole cache + one token's activations) is
  what serving the batch holds once its prompts are in; when it fits, the verdict says that it
  is prefilling the whole batch at once that does not.

Linear in the batch undercounts a tensor every sequence shares (a causal mask built once);
such tensors are small beside a batch's activations, and the estimate says it is linear.
"""

from __future__ import annotations

import dataclasses

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import FixOption, InferenceFit, KVCache, Memory, Roofline


def inference_fit(report: Report) -> InferenceFit | None:
    """The report's ``inference_fit`` section: its forward on its roofline device (a device
    without a memory figure gives no verdict: `InferenceFit.judged`); None without a roofline
    or a memory section."""
    roofline, memory = report.get(Roofline), report.get(Memory)
    if roofline is None or memory is None:
        return None
    device = roofline.device
    cache = report.get(KVCache)
    weights = report.model.param_bytes + report.model.buffer_bytes
    per_batch = memory.activation_peak_bytes + (cache.total_bytes if cache is not None else 0)
    batch = cache.batch if cache is not None else leading_batch(report)
    fit = InferenceFit(device=device.name, device_bytes=device.capacity_bytes,
                       needed_bytes=weights + per_batch, weights_bytes=weights, batch=batch,
                       decode_bytes=cache.decode_step.total_bytes if cache else None)
    if not fit.judged or fit.fits or batch is None or "batch" not in report.model.resizable:
        return fit
    smaller = _largest_batch(weights, per_batch / batch, device.capacity_bytes, batch)
    if smaller is None:
        return fit
    needed = weights + round(per_batch * smaller / batch)
    what = "activations and KV cache" if cache is not None else "activations"
    option = FixOption(flags=f"--batch {smaller}", needed_bytes=needed, recompute_overhead=0.0,
                       change=f"{what} linear in the batch")
    return dataclasses.replace(fit, fixes=(option,))


def _largest_batch(weights: int, per_sample: float, device_bytes: int, batch: int
                   ) -> int | None:
    """The largest batch below `batch` whose linear estimate fits; None when not even one."""
    if per_sample <= 0 or weights >= device_bytes:
        return None
    largest = min(int((device_bytes - weights) // per_sample), batch - 1)
    return largest if largest >= 1 else None


def leading_batch(report: Report) -> int | None:
    """The batch of the example inputs: the leading dimension they all share (None for a
    scalar or inputs that disagree)."""
    leading = {spec.shape[0] for spec in report.model.inputs if spec.shape}
    return leading.pop() if len(leading) == 1 else None
