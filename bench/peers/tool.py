"""Run one peer FLOP counter on one zoo model and print one JSON line (the last stdout line).

    bench/.peers-venv/bin/python bench/peers/tool.py fvcore hf-gpt2

Runs in the peers' environment (`bench/.peers-venv`, made by `bench/peers/run.py --setup`),
where fxlens is not installed: the repository root goes on ``sys.path`` only to load the model
exactly as fxlens does (`bench.peers.zoo`). Each call is one process, so the harness reads
its wall time and peak RSS from ``wait4``.

Every tool is called the way its README shows, with defaults a user would keep (ptflops'
default ``pytorch`` backend; its ``aten`` backend is a separate row). Units as reported: MACs
for fvcore (one "flop" per fused multiply-add), ptflops, thop and torchinfo (mult-adds);
FLOPs for calflops, DeepSpeed and FlopCounterMode; torchview counts nothing. ``flops`` in the
output is always 2 × MACs for the MAC tools and the reported FLOPs for the others.

Meta-device models (the ``hf:`` presets) are tried as they are (meta tensors), then under
`FakeTensorMode` (what FlopCounterMode users do); if both fail the result is "needs real
weights" with each error's first line. No tool is ever given real weights for a preset.
A crash is a result, not a failure of this script: it always exits 0.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

from bench.peers.zoo import BY_NAME, load_case  # noqa: E402

Model = torch.nn.Module
Args = tuple[Any, ...]
Kwargs = dict[str, Any]


class Positional(torch.nn.Module):
    """Calls `model(*args, **kwargs)` from positional tensors only (fvcore's jit trace and
    thop take a tuple), returning the output's tensors as a tuple."""

    def __init__(self, model: Model, n_args: int, names: list[str]) -> None:
        super().__init__()
        self.model, self.n_args, self.names = model, n_args, names

    def forward(self, *xs: Any) -> tuple[Any, ...]:
        out = self.model(*xs[: self.n_args], **dict(zip(self.names, xs[self.n_args:], strict=True)))
        if hasattr(out, "to_tuple"):
            out = out.to_tuple()
        return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))


def positional(model: Model, args: Args, kwargs: Kwargs) -> tuple[Model, Args]:
    return Positional(model, len(args), list(kwargs)), (*args, *kwargs.values())


def fvcore(model: Model, args: Args, kwargs: Kwargs) -> dict[str, Any]:
    from fvcore.nn import FlopCountAnalysis

    wrapped, inputs = positional(model, args, kwargs)
    analysis = FlopCountAnalysis(wrapped, inputs)
    analysis.unsupported_ops_warnings(False)
    analysis.uncalled_modules_warnings(False)
    macs = analysis.total()
    return {"reported": macs, "unit": "MACs", "flops": 2 * macs,
            "skipped_ops": dict(analysis.unsupported_ops())}


def _ptflops(backend: str) -> Callable[[Model, Args, Kwargs], dict[str, Any]]:
    def run(model: Model, args: Args, kwargs: Kwargs) -> dict[str, Any]:
        from ptflops import get_model_complexity_info

        if not kwargs and len(args) == 1:
            model_, make = model, (lambda _: args[0])
        else:
            wrapped, inputs = positional(model, args, kwargs)
            # a dict goes in as **kwargs: name the inputs after their positions
            names = [f"x{i}" for i in range(len(inputs))]
            model_ = _Named(wrapped, names)
            make = lambda _: dict(zip(names, inputs, strict=True))  # noqa: E731
        macs, _ = get_model_complexity_info(model_, (1,), input_constructor=make,
                                            as_strings=False, print_per_layer_stat=False,
                                            backend=backend)
        if macs is None:
            raise RuntimeError("ptflops returned None (it printed the error and gave up)")
        return {"reported": int(macs), "unit": "MACs", "flops": 2 * int(macs)}
    return run


class _Named(torch.nn.Module):
    def __init__(self, inner: Model, names: list[str]) -> None:
        super().__init__()
        self.inner, self.names = inner, names

    def forward(self, **kw: Any) -> Any:
        return self.inner(*(kw[n] for n in self.names))


def thop(model: Model, args: Args, kwargs: Kwargs) -> dict[str, Any]:
    from thop import profile

    wrapped, inputs = positional(model, args, kwargs)
    macs, _ = profile(wrapped, inputs=inputs, verbose=False)
    return {"reported": int(macs), "unit": "MACs", "flops": 2 * int(macs)}


def calflops(model: Model, args: Args, kwargs: Kwargs) -> dict[str, Any]:
    from calflops import calculate_flops

    flops, macs, _ = calculate_flops(model, args=list(args), kwargs=kwargs, print_results=False,
                                     print_detailed=False, output_as_string=False)
    return {"reported": int(flops), "unit": "FLOPs", "flops": int(flops), "macs": int(macs)}


def deepspeed(model: Model, args: Args, kwargs: Kwargs) -> dict[str, Any]:
    from deepspeed.profiling.flops_profiler import get_model_profile

    flops, macs, _ = get_model_profile(model, args=list(args), kwargs=kwargs,
                                       print_profile=False, detailed=False, as_string=False)
    return {"reported": int(flops), "unit": "FLOPs", "flops": int(flops), "macs": int(macs)}


def torchinfo(model: Model, args: Args, kwargs: Kwargs) -> dict[str, Any]:
    from torchinfo import summary

    device = next((t.device for t in pytree.tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor)), torch.device("cpu"))
    stats = summary(model, input_data=kwargs or list(args), verbose=0, device=device)
    macs = int(stats.total_mult_adds)
    return {"reported": macs, "unit": "MACs", "flops": 2 * macs}


def torchview(model: Model, args: Args, kwargs: Kwargs) -> dict[str, Any]:
    from torchview import draw_graph

    device = next((t.device for t in pytree.tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor)), torch.device("cpu"))
    graph = draw_graph(model, input_data=kwargs or list(args), device=device, save_graph=False)
    return {"reported": None, "unit": None, "flops": None,
            "note": f"graph only ({len(graph.edge_list)} edges), no FLOP count"}


def flop_counter_mode(model: Model, args: Args, kwargs: Kwargs) -> dict[str, Any]:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*args, **kwargs)
    return {"reported": counter.get_total_flops(), "unit": "FLOPs",
            "flops": counter.get_total_flops()}


TOOLS: dict[str, Callable[[Model, Args, Kwargs], dict[str, Any]]] = {
    "FlopCounterMode": flop_counter_mode,
    "fvcore": fvcore,
    "ptflops": _ptflops("pytorch"),
    "ptflops-aten": _ptflops("aten"),
    "thop": thop,
    "calflops": calflops,
    "deepspeed": deepspeed,
    "torchinfo": torchinfo,
    "torchview": torchview,
}


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def on_fake(fn: Callable[[Model, Args, Kwargs], dict[str, Any]], model: Model, args: Args,
            kwargs: Kwargs) -> dict[str, Any]:
    """`fn` on fake tensors made from a meta model: parameters swapped in by
    `torch.func.functional_call`, whose forward the tool's hooks still see."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        state, args, kwargs = pytree.tree_map_only(torch.Tensor, mode.from_tensor,
                                                   (state, args, kwargs))
        with torch.nn.utils.stateless._reparametrize_module(model, state):
            return fn(model, args, kwargs)


def measure(tool: str, case: str) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        fn = TOOLS[tool]
        __import__({"FlopCounterMode": "torch", "ptflops-aten": "ptflops"}.get(tool, tool))
    except Exception as error:  # the tool itself does not import: that is the result
        return {"status": "cannot import", "error": first_line(error)}
    model, args, kwargs = load_case(case)
    on_meta = BY_NAME[case].kind == "preset"
    attempts = [("meta", fn), ("fake", lambda m, a, k: on_fake(fn, m, a, k))] if on_meta \
        else [("real", fn)]
    errors = []
    for mode, attempt in attempts:
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = attempt(model, args, kwargs)
        except Exception as error:
            errors.append(f"{mode}: {first_line(error)}")
            continue
        status = "ok" if result.get("flops") is not None else "no FLOP count"
        return {**result, "status": status, "mode": mode, "errors": errors,
                "tool_s": time.perf_counter() - start}
    return {"status": "needs real weights" if on_meta else "crash", "error": "; ".join(errors),
            "tool_s": time.perf_counter() - start}


def main() -> None:
    tool, case = sys.argv[1], sys.argv[2]
    result = measure(tool, case)
    print(json.dumps({"tool": tool, "case": case, **result}, default=str))


if __name__ == "__main__":
    main()
